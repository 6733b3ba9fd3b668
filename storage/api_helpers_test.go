package storage

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// Helpers shared by the api_*_test.go files. Names carry an "api" prefix so
// they do not collide with helpers of other test files in the package.

// apiQuietLogger discards the engine's logs (write-stall warnings and the
// like would otherwise flood the test output).
var apiQuietLogger = slog.New(slog.DiscardHandler)

// apiSmallOptions returns options that make a DB flush and compact after a
// few hundred KiB of writes.
func apiSmallOptions(fs vfs.FS) *Options {
	o := &Options{
		FS:                  fs,
		MemTableSize:        64 << 10,
		L0CompactionTrigger: 2,
		L0SlowdownTrigger:   8,
		L0StopTrigger:       16,
		LBaseMaxBytes:       128 << 10,
		MergeOperator:       concatMerger{},
		Logger:              apiQuietLogger,
		// The API tests tail the WAL (UpdatesSince) past flushes.
		WALArchiveMaxBytes: 256 << 20,
	}
	for i := range o.Levels {
		o.Levels[i].TargetFileSize = 32 << 10
	}
	return o
}

func apiMustOpen(t testing.TB, dir string, opts *Options) *DB {
	t.Helper()
	d, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return d
}

func apiMustClose(t testing.TB, d *DB) {
	t.Helper()
	if err := d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// apiDump returns the full contents of the DB (or of snap, when non-nil) as
// a map, checking the iterator's error.
func apiDump(t testing.TB, d *DB, snap *Snapshot) oracle {
	t.Helper()
	it, err := d.NewIter(&IterOptions{Snapshot: snap})
	if err != nil {
		t.Fatalf("new iter: %v", err)
	}
	out := oracle{}
	var last []byte
	for ok := it.First(); ok; ok = it.Next() {
		if last != nil && bytes.Compare(last, it.Key()) >= 0 {
			t.Fatalf("iterator out of order: %q then %q", last, it.Key())
		}
		last = slices.Clone(it.Key())
		out[string(it.Key())] = string(it.Value())
	}
	if err := it.Error(); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	if err := it.Close(); err != nil {
		t.Fatalf("close iter: %v", err)
	}
	return out
}

// apiDiff describes the differences between got and want (empty if equal).
func apiDiff(got, want oracle) string {
	var keys []string
	seen := map[string]bool{}
	for k := range got {
		keys, seen[k] = append(keys, k), true
	}
	for k := range want {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	n := 0
	for _, k := range keys {
		g, gok := got[k]
		w, wok := want[k]
		if gok == wok && g == w {
			continue
		}
		if n++; n > 10 {
			fmt.Fprintf(&b, "  ...\n")
			break
		}
		short := func(s string, ok bool) string {
			if !ok {
				return "<absent>"
			}
			if len(s) > 40 {
				return fmt.Sprintf("%q...(%d bytes)", s[:40], len(s))
			}
			return fmt.Sprintf("%q", s)
		}
		fmt.Fprintf(&b, "  %q: got %s, want %s\n", k, short(g, gok), short(w, wok))
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d keys in DB, %d expected; first differences:\n%s", len(got), len(want), b.String())
}

func apiCheckEqual(t testing.TB, what string, got, want oracle) {
	t.Helper()
	if d := apiDiff(got, want); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

// apiLoggedBatch is a batch as applied: its sequence number and encoding.
type apiLoggedBatch struct {
	seq   SeqNum
	count uint32
	repr  []byte
}

// apiRandomBatch builds a batch of random sets, deletes, merges, range
// deletions and LogData over the key space k000000..k<space>.
func apiRandomBatch(rng *rand.Rand, space int) *Batch {
	b := NewBatch()
	key := func() []byte { return fmt.Appendf(nil, "k%06d", rng.IntN(space)) }
	n := 1 + rng.IntN(8)
	for i := 0; i < n; i++ {
		switch q := rng.IntN(100); {
		case q < 60:
			v := make([]byte, 8+rng.IntN(120))
			for j := range v {
				v[j] = 'a' + byte(rng.IntN(26))
			}
			b.Set(key(), v)
		case q < 72:
			b.Delete(key())
		case q < 84:
			b.Merge(key(), []byte{byte('A' + rng.IntN(26))})
		case q < 90:
			s := rng.IntN(space)
			b.DeleteRange(fmt.Appendf(nil, "k%06d", s), fmt.Appendf(nil, "k%06d", s+1+rng.IntN(20)))
		default:
			b.LogData(fmt.Appendf(nil, "log-%d", rng.Uint64()))
		}
	}
	return b
}

// apiBatchesEqual compares a batch read back (from UpdatesSince) with one
// applied.
func apiBatchesEqual(got *Batch, want apiLoggedBatch) error {
	if got.SeqNum() != want.seq {
		return fmt.Errorf("seq %d, want %d", got.SeqNum(), want.seq)
	}
	if got.Count() != want.count {
		return fmt.Errorf("batch %d: count %d, want %d", want.seq, got.Count(), want.count)
	}
	if !bytes.Equal(got.Repr(), want.repr) {
		return fmt.Errorf("batch %d: repr differs (%d vs %d bytes)", want.seq, len(got.Repr()), len(want.repr))
	}
	return nil
}

// apiCollectUpdates returns every batch UpdatesSince(seq) yields.
func apiCollectUpdates(t testing.TB, d *DB, seq SeqNum) ([]*Batch, error) {
	t.Helper()
	it, err := d.UpdatesSince(seq)
	if err != nil {
		return nil, err
	}
	var out []*Batch
	for it.Next() {
		out = append(out, it.Batch())
	}
	err = it.Error()
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	return out, err
}

// apiListFiles returns name -> size of every file under dir (recursively,
// relative names) on fs.
func apiListFiles(t testing.TB, fs vfs.FS, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	var walk func(rel string)
	walk = func(rel string) {
		names, err := fs.List(fs.Join(dir, rel))
		if err != nil {
			t.Fatalf("list %s: %v", rel, err)
		}
		for _, n := range names {
			p := n
			if rel != "" {
				p = fs.Join(rel, n)
			}
			fi, err := fs.Stat(fs.Join(dir, p))
			if err != nil {
				t.Fatalf("stat %s: %v", p, err)
			}
			if fi.IsDir() {
				walk(p)
				continue
			}
			out[p] = fi.Size()
		}
	}
	walk("")
	return out
}

func apiFileExists(fs vfs.FS, path string) bool {
	_, err := fs.Stat(path)
	return err == nil
}

// apiWaitIdle waits until no flush or compaction of d is scheduled or
// running.
func apiWaitIdle(t testing.TB, d *DB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d.mu.Lock()
		idle := d.bgRunning == 0
		d.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("background work did not finish within 20s")
		}
		time.Sleep(time.Millisecond)
	}
}
