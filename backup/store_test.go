package backup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/shale-db/shale/internal/s3test"
)

// TestStores holds both stores to the contract Location relies on: create
// admits one writer, put writes whole or not at all, open tells a missing
// object, list finds what is stored by prefix, remove is idempotent.
func TestStores(t *testing.T) {
	t.Run("dir", func(t *testing.T) {
		st, err := openDir(filepath.Join(t.TempDir(), "loc"), true)
		if err != nil {
			t.Fatal(err)
		}
		testStore(t, st)
	})
	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t)
		loc, err := Open(context.Background(), srv.Bucket(t, "stores", "a/b"), false)
		if err != nil {
			t.Fatal(err)
		}
		testStore(t, loc.st)
		// The failed multipart uploads were aborted: nothing of them is
		// left on the server.
		s3 := loc.st.(*s3Store)
		for u := range s3.cl.ListIncompleteUploads(context.Background(), s3.bucket, s3.prefix, true) {
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			t.Errorf("an incomplete upload is left: %s (%s)", u.Key, u.UploadID)
		}
	})
}

// failingReader yields n bytes, then fails.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errors.New("the source failed")
	}
	k := min(len(p), r.n)
	for i := range p[:k] {
		p[i] = 'x'
	}
	r.n -= k
	return k, nil
}

func testStore(t *testing.T, st store) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	read := func(name string) (string, error) {
		r, err := st.open(ctx, name)
		if err != nil {
			return "", err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		return string(b), err
	}

	// create: of several at once, exactly one wins; the others see
	// fs.ErrExist, and the object holds the winner's bytes.
	var wg sync.WaitGroup
	results := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = st.create(ctx, "lock", []byte{'0' + byte(i)})
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range results {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("create: writers %d and %d both won", won, i)
		case err == nil:
			won = i
		case !errors.Is(err, fs.ErrExist):
			t.Fatalf("create %d: %v, want fs.ErrExist", i, err)
		}
	}
	if won < 0 {
		t.Fatal("create: no writer won")
	}
	if got, err := read("lock"); err != nil || got != string([]byte{'0' + byte(won)}) {
		t.Fatalf("lock holds %q, %v", got, err)
	}

	// put: whole objects, replaced whole; a failing source or a short one
	// leaves nothing.
	// 50 MiB and 3 bytes: on S3 a multipart upload of 4 parts, sent
	// s3UploadParts at once; bytes that differ everywhere, so that a part
	// stored out of place fails the read-back.
	big := make([]byte, 50<<20+3)
	for i := 0; i < len(big); i += 8 {
		v := uint64(i) * 0x9e3779b97f4a7c15
		for k := 0; k < 8 && i+k < len(big); k++ {
			big[i+k] = byte(v >> (8 * k))
		}
	}
	for name, body := range map[string][]byte{"files/shard-1/a.sst": []byte("hello"), "files/shard-1/b.sst": big, "files/shard-2/c.sst": nil, "backups/x/manifest.json": []byte("{}")} {
		// A stream, as a backup hands it over (no ReaderAt, no Seek).
		if err := st.put(ctx, name, struct{ io.Reader }{bytes.NewReader(body)}, int64(len(body))); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
		if got, err := read(name); err != nil || !bytes.Equal([]byte(got), body) {
			t.Fatalf("read back %s: %d bytes, %v; want %d", name, len(got), err, len(body))
		}
	}
	if err := st.put(ctx, "files/shard-1/a.sst", strings.NewReader("bye"), 3); err != nil {
		t.Fatal(err)
	}
	if got, _ := read("files/shard-1/a.sst"); got != "bye" {
		t.Fatalf("replaced object reads %q", got)
	}
	if err := st.put(ctx, "files/shard-3/fail.sst", &failingReader{n: 20 << 20}, 40<<20); err == nil {
		t.Fatal("put from a failing source succeeded")
	}
	if err := st.put(ctx, "files/shard-3/short.sst", strings.NewReader("abc"), 10); err == nil {
		t.Fatal("put of 3 bytes as 10 succeeded")
	}
	if _, err := st.open(ctx, "files/shard-3/fail.sst"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open after a failed put: %v, want fs.ErrNotExist", err)
	}

	// putFile: a temporary file written, then stored under its name.
	tmp, err := st.tempFile()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	defer tmp.Close()
	if _, err := tmp.WriteString("spooled"); err != nil {
		t.Fatal(err)
	}
	if err := st.putFile(ctx, "files/shard-3/log-1-2", tmp, 8); err == nil {
		t.Fatal("putFile of 7 bytes as 8 succeeded")
	}
	if err := st.putFile(ctx, "files/shard-3/log-1-2", tmp, 7); err != nil {
		t.Fatal(err)
	}
	if got, err := read("files/shard-3/log-1-2"); err != nil || got != "spooled" {
		t.Fatalf("read back a put file: %q, %v", got, err)
	}
	if err := st.remove(ctx, "files/shard-3/log-1-2"); err != nil {
		t.Fatal(err)
	}

	// list, by prefix, sorted, with sizes; nothing left of failed puts or
	// temporary files.
	objs, err := st.list(ctx, "files/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.name)
		if o.name == "files/shard-1/b.sst" && o.size != int64(len(big)) {
			t.Fatalf("list: %s has size %d, want %d", o.name, o.size, len(big))
		}
	}
	if strings.Join(got, " ") != "files/shard-1/a.sst files/shard-1/b.sst files/shard-2/c.sst" {
		t.Fatalf("list files/: %v", got)
	}
	if objs, err := st.list(ctx, "files/shard-1/"); err != nil || len(objs) != 2 {
		t.Fatalf("list files/shard-1/: %v, %v", objs, err)
	}
	if objs, err := st.list(ctx, "nothing/"); err != nil || len(objs) != 0 {
		t.Fatalf("list nothing/: %v, %v", objs, err)
	}

	// remove, twice; a removed object is missing.
	for i := 0; i < 2; i++ {
		if err := st.remove(ctx, "files/shard-2/c.sst"); err != nil {
			t.Fatalf("remove %d: %v", i, err)
		}
	}
	if _, err := st.open(ctx, "files/shard-2/c.sst"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open a removed object: %v", err)
	}
	if objs, _ := st.list(ctx, "files/shard-2/"); len(objs) != 0 {
		t.Fatalf("list after remove: %v", objs)
	}
	for _, bad := range []string{"", "/abs", "../up", "a/../../b", "a//b"} {
		if err := st.put(ctx, bad, strings.NewReader(""), 0); err == nil {
			t.Fatalf("put %q succeeded", bad)
		}
	}
}

// TestDirStoreRelativePath: a location given as a relative path, even one
// with "./" or "..", leaves no empty directories behind when its objects go.
// TestStoresClean: clean removes what a killed writer leaves and no
// listing shows (a directory's temporary files, at any depth; an S3
// prefix's incomplete multipart uploads), and nothing that is stored.
func TestStoresClean(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stored := func(t *testing.T, st store) {
		t.Helper()
		if err := st.put(ctx, "files/shard-1/a.sst", strings.NewReader("abc"), 3); err != nil {
			t.Fatal(err)
		}
	}
	kept := func(t *testing.T, st store) {
		t.Helper()
		objs, err := st.list(ctx, "")
		if err != nil || len(objs) != 1 || objs[0].name != "files/shard-1/a.sst" {
			t.Fatalf("stored after clean: %v, %v", objs, err)
		}
	}
	t.Run("dir", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "loc")
		st, err := openDir(root, true)
		if err != nil {
			t.Fatal(err)
		}
		stored(t, st)
		temps := []string{filepath.Join(root, tempPrefix+"1"), filepath.Join(root, "files", "shard-1", tempPrefix+"2"), filepath.Join(root, "files", "x.tmp")}
		for _, p := range temps {
			if err := os.WriteFile(p, []byte("half"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.clean(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range temps {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after clean: %v", p, err)
			}
		}
		kept(t, st)
	})
	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t)
		loc, err := Open(ctx, srv.Bucket(t, "clean", "p"), false)
		if err != nil {
			t.Fatal(err)
		}
		st := loc.st.(*s3Store)
		stored(t, st)
		core := minio.Core{Client: st.cl}
		for _, name := range []string{"files/shard-1/b.sst", "files/shard-2/c.sst"} {
			id, err := core.NewMultipartUpload(ctx, st.bucket, st.prefix+name, minio.PutObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := core.PutObjectPart(ctx, st.bucket, st.prefix+name, id, 1, strings.NewReader("part"), 4, minio.PutObjectPartOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.clean(ctx); err != nil {
			t.Fatal(err)
		}
		for u := range st.cl.ListIncompleteUploads(ctx, st.bucket, st.prefix, true) {
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			t.Errorf("an incomplete upload is left after clean: %s", u.Key)
		}
		kept(t, st)
	})
}

func TestDirStoreRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.Mkdir("sub", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, loc := range []string{"./loc", "sub/../loc2", "loc3/"} {
		s, err := openDir(loc, true)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := s.put(ctx, "backups/b1/files/1.sst", strings.NewReader("abc"), 3); err != nil {
			t.Fatal(err)
		}
		if err := s.remove(ctx, "backups/b1/files/1.sst"); err != nil {
			t.Fatal(err)
		}
		left, err := os.ReadDir(loc)
		if err != nil || len(left) != 0 {
			t.Fatalf("%s after removing its only object: %v, %v", loc, left, err)
		}
	}
}

// TestS3LocationCloseEndsConnections: an S3 location keeps its connection
// to the server open between requests until Close, which ends it (a node
// opens one location per shard it backs up, and would otherwise hold a
// connection per shard until they time out).
func TestS3LocationCloseEndsConnections(t *testing.T) {
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// HEAD /bucket/ is BucketExists: the bucket is there.
		if r.Method != http.MethodHead || strings.Trim(r.URL.Path, "/") != "bucket" {
			http.Error(w, "unexpected request", http.StatusNotImplemented)
		}
	}))
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case http.StateNew:
			open[c] = true
		case http.StateClosed, http.StateHijacked:
			delete(open, c)
		}
	}
	srv.Start()
	defer srv.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
	conns := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(open)
	}

	loc, err := Open(t.Context(), "s3://bucket/p?region=us-east-1&endpoint="+srv.URL, false)
	if err != nil {
		t.Fatal(err)
	}
	// The connection BucketExists used stays open for the next request.
	time.Sleep(50 * time.Millisecond)
	if n := conns(); n != 1 {
		t.Fatalf("%d connections open after Open, want 1", n)
	}
	loc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open 5 s after Close", conns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
