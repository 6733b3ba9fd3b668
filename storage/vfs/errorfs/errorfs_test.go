package errorfs_test

import (
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

func mustOK(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// workload performs a fixed sequence of operations and returns the first
// error, so that it makes the same operations on every run up to a failure.
func workload(fs vfs.FS) error {
	if err := fs.MkdirAll("db", 0o755); err != nil {
		return err
	}
	f, err := fs.Create("db/000001.log")
	if err != nil {
		return err
	}
	for i := 0; i < 3; i++ {
		if _, err := f.Write([]byte("record")); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if f, err = fs.OpenAppend("db/000001.log"); err != nil {
		return err
	}
	if _, err := f.Write([]byte("appended")); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	d, err := fs.OpenDir("db")
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	if err := d.Close(); err != nil {
		return err
	}
	if err := fs.Rename("db/000001.log", "db/000002.log"); err != nil {
		return err
	}
	r, err := fs.Open("db/000002.log")
	if err != nil {
		return err
	}
	buf := make([]byte, 6)
	if _, err := r.ReadAt(buf, 6); err != nil {
		r.Close()
		return err
	}
	if _, err := r.Stat(); err != nil {
		r.Close()
		return err
	}
	if err := r.Close(); err != nil {
		return err
	}
	if _, err := fs.List("db"); err != nil {
		return err
	}
	if err := fs.Link("db/000002.log", "db/000003.sst"); err != nil {
		return err
	}
	if _, err := fs.Stat("db/000003.sst"); err != nil {
		return err
	}
	l, err := fs.Lock("db/LOCK")
	if err != nil {
		return err
	}
	l.Close()
	return fs.Remove("db/000002.log")
}

func TestOpNames(t *testing.T) {
	seen := map[string]bool{}
	for op := errorfs.OpCreate; op <= errorfs.OpOpenAppend; op++ {
		s := op.String()
		if s == "" || strings.HasPrefix(s, "Op(") || seen[s] {
			t.Fatalf("bad name %q for %d", s, op)
		}
		seen[s] = true
	}
	writes := map[errorfs.Op]bool{errorfs.OpCreate: true, errorfs.OpOpenAppend: true, errorfs.OpWrite: true, errorfs.OpSync: true,
		errorfs.OpRemove: true, errorfs.OpRename: true, errorfs.OpLink: true, errorfs.OpMkdirAll: true}
	for op := errorfs.OpCreate; op <= errorfs.OpOpenAppend; op++ {
		if op.IsWrite() != writes[op] {
			t.Fatalf("%v.IsWrite() = %v", op, op.IsWrite())
		}
	}
}

func TestInjectedErrors(t *testing.T) {
	if !errors.Is(errorfs.ErrENOSPC, syscall.ENOSPC) || !errors.Is(errorfs.ErrEIO, syscall.EIO) {
		t.Fatal("injected errors do not match their errnos")
	}
	if !strings.Contains(errorfs.ErrEIO.Error(), "injected") {
		t.Fatalf("message %q does not say injected", errorfs.ErrEIO)
	}
	if errorfs.IsInjected(syscall.EIO) || !errorfs.IsInjected(errorfs.ErrEIO) {
		t.Fatal("IsInjected")
	}
}

// TestEveryIndex counts the workload's operations in a dry run, then fails
// each one in turn and checks that exactly that operation fails.
func TestEveryIndex(t *testing.T) {
	var c errorfs.Counter
	mustOK(t, workload(errorfs.Wrap(vfs.NewMem(), &c)))
	if c.Count() < 20 || c.CountOf(errorfs.OpWrite) != 4 || c.CountOf(errorfs.OpSync) != 2 || c.CountOf(errorfs.OpOpenAppend) != 1 {
		t.Fatalf("count %d, writes %d, syncs %d", c.Count(), c.CountOf(errorfs.OpWrite), c.CountOf(errorfs.OpSync))
	}
	for i := int64(0); i < c.Count(); i++ {
		inj := errorfs.OnIndex(i, errorfs.ErrEIO)
		err := workload(errorfs.Wrap(vfs.NewMem(), inj))
		if !errors.Is(err, syscall.EIO) || !errorfs.IsInjected(err) {
			t.Fatalf("index %d: got %v", i, err)
		}
		if !strings.Contains(err.Error(), "db") {
			t.Fatalf("index %d: error %q names no path", i, err)
		}
		if !inj.Fired() {
			t.Fatalf("index %d: not fired", i)
		}
	}
	inj := errorfs.OnIndex(c.Count(), errorfs.ErrEIO)
	mustOK(t, workload(errorfs.Wrap(vfs.NewMem(), inj)))
	if inj.Fired() || inj.Count() != c.Count() {
		t.Fatalf("beyond the end: fired=%v count=%d", inj.Fired(), inj.Count())
	}
}

func TestOnIndexFailsOnce(t *testing.T) {
	inj := errorfs.OnIndex(2, errorfs.ErrEIO)
	fails := 0
	for i := 0; i < 10; i++ {
		if inj.MaybeError(errorfs.OpWrite, "x") != nil {
			if i != 2 {
				t.Fatalf("failed op %d", i)
			}
			fails++
		}
	}
	if fails != 1 {
		t.Fatalf("%d failures", fails)
	}
}

func TestFromIndex(t *testing.T) {
	inj := errorfs.FromIndex(3, errorfs.ErrENOSPC)
	for i := 0; i < 10; i++ {
		err := inj.MaybeError(errorfs.OpWrite, "x")
		if (err != nil) != (i >= 3) {
			t.Fatalf("op %d: %v", i, err)
		}
	}
}

func TestFilterBySuffixAndOp(t *testing.T) {
	mem := vfs.NewMem()
	inj := errorfs.Filter(errorfs.And(errorfs.Ops(errorfs.OpWrite), errorfs.PathSuffix(".log")),
		errorfs.FromIndex(0, errorfs.ErrENOSPC))
	fs := errorfs.Wrap(mem, inj)
	sst, err := fs.Create("000001.sst")
	mustOK(t, err)
	_, err = sst.Write([]byte("fine"))
	mustOK(t, err)
	log, err := fs.Create("000002.log")
	mustOK(t, err)
	n, err := log.Write([]byte("no space"))
	if n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("log write: %d, %v", n, err)
	}
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Path != "000002.log" || pe.Op != "write" {
		t.Fatalf("error %#v", err)
	}
	// A failed write writes nothing.
	fi, err := mem.Stat("000002.log")
	mustOK(t, err)
	if fi.Size() != 0 {
		t.Fatalf("failed write left %d bytes", fi.Size())
	}
	mustOK(t, log.Sync())
	if !errorfs.WriteOps()(errorfs.OpSync, "") || errorfs.WriteOps()(errorfs.OpRead, "") {
		t.Fatal("WriteOps")
	}
}

func TestShortWrites(t *testing.T) {
	mem := vfs.NewMem()
	fs := errorfs.Wrap(mem, errorfs.FromIndex(1, errorfs.ErrEIO), errorfs.WithShortWrites(7))
	f, err := fs.Create("f") // op 0 succeeds
	mustOK(t, err)
	data := []byte("0123456789")
	for i := 0; i < 20; i++ {
		before, err := mem.Stat("f")
		mustOK(t, err)
		n, err := f.Write(data)
		if !errors.Is(err, syscall.EIO) || n < 0 || n >= len(data) {
			t.Fatalf("short write: %d, %v", n, err)
		}
		after, err := mem.Stat("f")
		mustOK(t, err)
		if after.Size()-before.Size() != int64(n) {
			t.Fatalf("wrote %d bytes, reported %d", after.Size()-before.Size(), n)
		}
	}
}

func TestRandom(t *testing.T) {
	pattern := func(seed int64) string {
		inj := errorfs.Random(seed, 0.3, errorfs.ErrEIO, nil)
		var b strings.Builder
		for i := 0; i < 200; i++ {
			if inj.MaybeError(errorfs.OpRead, "f") != nil {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	p1, p2, p3 := pattern(1), pattern(1), pattern(2)
	if p1 != p2 {
		t.Fatal("same seed, different faults")
	}
	if p1 == p3 {
		t.Fatal("different seeds, same faults")
	}
	if n := strings.Count(p1, "x"); n < 30 || n > 90 {
		t.Fatalf("%d faults in 200 at p=0.3", n)
	}
	never := errorfs.Random(1, 1, errorfs.ErrEIO, func(op errorfs.Op, _ string) bool { return op == errorfs.OpSync })
	if never.MaybeError(errorfs.OpWrite, "f") != nil || never.MaybeError(errorfs.OpSync, "f") == nil {
		t.Fatal("filter not applied")
	}
}

func TestRandomConcurrent(t *testing.T) {
	// One injector shared by goroutines, each with its own FS.
	inj := errorfs.Random(3, 0.1, errorfs.ErrEIO, errorfs.WriteOps())
	var wg sync.WaitGroup
	var injected atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				err := workload(errorfs.Wrap(vfs.NewMem(), inj))
				if errorfs.IsInjected(err) {
					injected.Add(1)
				} else if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if injected.Load() == 0 {
		t.Fatal("no faults injected")
	}
}

func TestLatency(t *testing.T) {
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.Latency(errorfs.Ops(errorfs.OpSync), 20*time.Millisecond))
	f, err := fs.Create("f")
	mustOK(t, err)
	start := time.Now()
	mustOK(t, f.Sync())
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("Sync took %v", d)
	}
}

func TestToggle(t *testing.T) {
	var c errorfs.Counter
	tog := errorfs.NewToggle(errorfs.Chain(&c, errorfs.FromIndex(0, errorfs.ErrEIO)))
	fs := errorfs.Wrap(vfs.NewMem(), tog)
	f, err := fs.Create("f")
	mustOK(t, err)
	_, err = f.Write([]byte("x"))
	mustOK(t, err)
	if c.Count() != 0 || tog.Enabled() {
		t.Fatal("disabled toggle consulted its injector")
	}
	tog.Enable()
	if _, err := f.Write([]byte("x")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("enabled: %v", err)
	}
	tog.Disable()
	_, err = f.Write([]byte("x"))
	mustOK(t, err)
	if c.Count() != 1 {
		t.Fatalf("counted %d", c.Count())
	}
}

func TestFailedCloseStillCloses(t *testing.T) {
	mem := vfs.NewMem()
	fs := errorfs.Wrap(mem, errorfs.Filter(errorfs.Ops(errorfs.OpClose), errorfs.FromIndex(0, errorfs.ErrEIO)))
	f, err := fs.Create("f")
	mustOK(t, err)
	if err := f.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Close: %v", err)
	}
	if _, err := f.Read(make([]byte, 1)); err == io.EOF || err == nil {
		t.Fatalf("Read after failed Close: %v", err)
	}
}

func TestRenameAndLinkErrors(t *testing.T) {
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.Filter(errorfs.PathSuffix("CURRENT"), errorfs.FromIndex(0, errorfs.ErrEIO)))
	f, err := fs.Create("CURRENT.tmp")
	mustOK(t, err)
	mustOK(t, f.Close())
	err = fs.Rename("CURRENT.tmp", "CURRENT")
	var le *os.LinkError
	if !errors.As(err, &le) || le.Old != "CURRENT.tmp" || le.New != "CURRENT" || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Rename: %v", err)
	}
	if _, err := fs.Stat("CURRENT.tmp"); err != nil {
		t.Fatalf("failed rename changed the tree: %v", err)
	}
}

func TestCustomErrorMarkedInjected(t *testing.T) {
	boom := errors.New("boom")
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op, _ string) error {
		if op == errorfs.OpMkdirAll {
			return boom
		}
		return nil
	}))
	err := fs.MkdirAll("d", 0o755)
	if !errors.Is(err, boom) || !errorfs.IsInjected(err) {
		t.Fatalf("MkdirAll: %v", err)
	}
}
