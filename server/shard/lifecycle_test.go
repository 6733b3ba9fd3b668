package shard

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// fill applies n random transactions (in groups) to s.
func fill(t *testing.T, s *Shard, f *feeder, rng *rand.Rand, n int) {
	t.Helper()
	g := &txnGen{rng: rng, m: newModel(s.Descriptor())}
	now := ts0
	for n > 0 {
		k := min(n, 1+rng.IntN(8))
		var entries []replication.Entry
		for range k {
			now += 1e6
			entries = append(entries, f.entry(marshalCmd(t, txnCmd(now, g.txn(now)))))
		}
		if _, err := s.Apply(entries); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
}

func TestOpenErrors(t *testing.T) {
	env := newTestEnv(t, nil)
	if _, err := Open("missing", env.opts(0)); err == nil {
		t.Fatal("Open of a missing directory succeeded")
	}
	e, err := OpenEmpty("empty", env.opts(0))
	if err != nil {
		t.Fatal(err)
	}
	st := e.AppliedState()
	if st.Index != 0 || st.Term != 0 || st.Descriptor != nil || e.Descriptor() != nil {
		t.Fatalf("empty replica state %v", st)
	}
	if _, _, err := e.Get([]byte("k"), 0); !errors.Is(err, ErrUninitialized) {
		t.Fatalf("Get on an empty replica: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open("empty", env.opts(0)); !errors.Is(err, ErrNoMetadata) {
		t.Fatalf("Open without metadata: %v", err)
	}
	env.bootstrap("a", userDesc(1, "", ""), 0)
	if _, err := Bootstrap("a", initialState(userDesc(1, "", "")), env.opts(0)); err == nil {
		t.Fatal("Bootstrap over an existing directory succeeded")
	}
	if _, err := Bootstrap("b", replication.AppliedState{}, env.opts(0)); err == nil {
		t.Fatal("Bootstrap without a descriptor succeeded")
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := e.Get([]byte("k"), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if _, err := e.Apply([]replication.Entry{{Index: 1}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close: %v", err)
	}
}

func TestCheckpointRestore(t *testing.T) {
	for _, osfs := range []bool{false, true} {
		t.Run(fmt.Sprint("os=", osfs), func(t *testing.T) {
			var fs vfs.FS
			root := ""
			if osfs {
				fs, root = vfs.Default, t.TempDir()
			}
			env := newTestEnv(t, fs)
			p := func(name string) string { return filepath.Join(root, name) }
			rng := rand.New(rand.NewPCG(5, 5))
			desc := userDesc(9, "k05", "k35")
			a := env.bootstrap(p("a"), desc, 10)
			fa := newFeeder(a)
			fill(t, a, fa, rng, 300)
			if _, err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			fill(t, a, fa, rng, 50) // some in SSTs, some in the memtable and WAL

			st, err := a.Checkpoint(p("cp"))
			if err != nil {
				t.Fatal(err)
			}
			sameAppliedState(t, st, a.AppliedState())

			// Restore into an uninitialized replica.
			b, err := OpenEmpty(p("b"), env.opts(10))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			if err := b.Restore(p("cp")); err != nil {
				t.Fatal(err)
			}
			if _, err := fs0(env).Stat(p("cp")); err == nil {
				t.Fatal("checkpoint directory still exists after Restore")
			}
			sameAppliedState(t, b.AppliedState(), st)
			sameShards(t, a, b)

			// Both continue identically.
			fb := newFeeder(b)
			seed := rng.Uint64()
			fill(t, a, fa, rand.New(rand.NewPCG(seed, 1)), 40)
			fill(t, b, fb, rand.New(rand.NewPCG(seed, 1)), 40)
			sameShards(t, a, b)

			// Restore over a replica holding other data; it survives a reopen.
			c := env.bootstrap(p("c"), desc, 10)
			fill(t, c, newFeeder(c), rand.New(rand.NewPCG(99, 1)), 30)
			if _, err := a.Checkpoint(p("cp2")); err != nil {
				t.Fatal(err)
			}
			if err := c.Restore(p("cp2")); err != nil {
				t.Fatal(err)
			}
			sameShards(t, a, c)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			c = env.open(p("c"), 10)
			sameShards(t, a, c)

			// A checkpoint of another shard is refused, the state kept, the
			// directory deleted.
			other := env.bootstrap(p("other"), userDesc(10, "", ""), 0)
			if _, err := other.Checkpoint(p("cp3")); err != nil {
				t.Fatal(err)
			}
			if err := c.Restore(p("cp3")); err == nil {
				t.Fatal("Restore of another shard's checkpoint succeeded")
			}
			if _, err := fs0(env).Stat(p("cp3")); err == nil {
				t.Fatal("refused checkpoint not deleted")
			}
			sameShards(t, a, c)
			fill(t, c, newFeeder(c), rng, 5) // still usable
		})
	}
}

func fs0(env *testEnv) vfs.FS { return env.fs }

// sameShards checks that two shards have the same applied state, revision,
// checksum and engine contents.
func sameShards(t *testing.T, a, b *Shard) {
	t.Helper()
	sameAppliedState(t, a.AppliedState(), b.AppliedState())
	if a.Revision() != b.Revision() {
		t.Fatalf("revision %d != %d", a.Revision(), b.Revision())
	}
	ia, ca, err := a.ChecksumAt()
	if err != nil {
		t.Fatal(err)
	}
	ib, cb, err := b.ChecksumAt()
	if err != nil {
		t.Fatal(err)
	}
	if ca != cb {
		t.Fatalf("checksum %x != %x", ca, cb)
	}
	if ia != a.AppliedState().Index || ib != b.AppliedState().Index {
		t.Fatalf("checksums taken at indexes %d and %d, applied %d and %d", ia, ib, a.AppliedState().Index, b.AppliedState().Index)
	}
	if da, db := engineDump(t, a), engineDump(t, b); !maps.Equal(da, db) {
		t.Fatalf("engines differ: %s", diffMaps(da, db))
	}
}

// TestRestoreInterrupted simulates crashes in the middle of Restore's
// directory swap: Open must find a complete engine (old or new).
func TestRestoreInterrupted(t *testing.T) {
	env := newTestEnv(t, nil)
	a := env.bootstrap("a", userDesc(1, "", ""), 0)
	fill(t, a, newFeeder(a), rand.New(rand.NewPCG(1, 1)), 20)
	want := a.AppliedState()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Crash after the engine was set aside, before the new one moved in.
	if err := env.fs.Rename("a", "a"+restoreOldSuffix); err != nil {
		t.Fatal(err)
	}
	a = env.open("a", 0)
	sameAppliedState(t, a.AppliedState(), want)
	if _, err := env.fs.Stat("a" + restoreOldSuffix); err == nil {
		t.Fatal("set-aside directory left behind")
	}
	// Crash after the new engine moved in, before the old one was deleted.
	if _, err := a.Checkpoint("cp"); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := env.fs.Rename("cp", "a"+restoreOldSuffix); err != nil {
		t.Fatal(err)
	}
	a = env.open("a", 0)
	sameAppliedState(t, a.AppliedState(), want)
	if _, err := env.fs.Stat("a" + restoreOldSuffix); err == nil {
		t.Fatal("old directory left behind")
	}
}

// TestConcurrentReadsAndLifecycle runs reads, Flush and Checkpoint
// concurrently with Apply and Restore; run it under -race. Every checkpoint
// must hold exactly the applied state it reports.
func TestConcurrentReadsAndLifecycle(t *testing.T) {
	env := newTestEnv(t, nil)
	desc := userDesc(4, "k05", "k35")
	a := env.bootstrap("a", desc, 0)
	src := env.bootstrap("src", desc, 0)
	fill(t, src, newFeeder(src), rand.New(rand.NewPCG(3, 3)), 50)

	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for !stop.Load() {
				page, err := a.Scan(ScanParams{Reverse: rng.IntN(2) == 0, Limit: 1 + rng.IntN(10), Now: ts0})
				kvs, rev := page.KVs, page.Revision
				if err != nil {
					report(err)
					return
				}
				for _, kv := range kvs {
					if kv.ModRevision > rev {
						report(fmt.Errorf("key %q mod revision %d above the scan's revision %d", kv.Key, kv.ModRevision, rev))
						return
					}
				}
				if _, _, err := a.Get([]byte(fmt.Sprintf("k%02d", 5+rng.IntN(30))), ts0); err != nil {
					report(err)
					return
				}
				a.SizeBytes()
				a.AppliedState()
			}
		})
	}
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			if _, err := a.Flush(); err != nil {
				report(err)
				return
			}
			dir := fmt.Sprintf("cp-concurrent-%d", i)
			st, err := a.Checkpoint(dir)
			if err != nil {
				report(err)
				return
			}
			c, err := Open(dir, env.opts(0))
			if err != nil {
				report(err)
				return
			}
			got := c.AppliedState()
			if got.Index != st.Index || !proto.Equal(got.Descriptor, st.Descriptor) {
				report(fmt.Errorf("checkpoint reports index %d, holds %d", st.Index, got.Index))
			}
			_ = c.Close()
			_ = env.fs.RemoveAll(dir)
		}
	})
	rng := rand.New(rand.NewPCG(8, 8))
	f := newFeeder(a)
	for round := range 3 {
		fill(t, a, f, rng, 150)
		if round == 1 {
			if _, err := src.Checkpoint("cp-src"); err != nil {
				t.Fatal(err)
			}
			if err := a.Restore("cp-src"); err != nil {
				t.Fatal(err)
			}
			f = newFeeder(a)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

func TestFlushReturnsDurableIndex(t *testing.T) {
	env := newTestEnv(t, vfs.NewCrashableMem())
	a := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(a)
	fill(t, a, f, rand.New(rand.NewPCG(1, 2)), 40)
	idx, err := a.Flush()
	if err != nil || idx != f.index {
		t.Fatalf("Flush = %d, %v; want %d", idx, err, f.index)
	}
	want := dataDump(t, a)
	rev := a.Revision()
	fill(t, a, f, rand.New(rand.NewPCG(1, 3)), 10) // unsynced, lost in the crash
	crashed := env.fs.(*vfs.MemFS).CrashClone()
	env2 := newTestEnv(t, crashed)
	b := env2.open("a", 0)
	if st := b.AppliedState(); st.Index != idx || b.Revision() != rev {
		t.Fatalf("after crash: index %d rev %d, want %d rev %d", st.Index, b.Revision(), idx, rev)
	}
	if got := dataDump(t, b); !maps.Equal(got, want) {
		t.Fatalf("after crash: %s", diffMaps(got, want))
	}
}

// TestRestoreRenameFailure fails the rename that moves the checkpoint into
// place: Restore reports it and the shard keeps serving its old state.
func TestRestoreRenameFailure(t *testing.T) {
	mem := vfs.NewMem()
	tog := errorfs.NewToggle(errorfs.Filter(func(op errorfs.Op, path string) bool {
		return op == errorfs.OpRename && path == "a"
	}, errorfs.OnIndex(0, errorfs.ErrEIO)))
	env := newTestEnv(t, errorfs.Wrap(mem, tog))
	a := env.bootstrap("a", userDesc(1, "", ""), 0)
	fill(t, a, newFeeder(a), rand.New(rand.NewPCG(1, 1)), 20)
	src := env.bootstrap("src", userDesc(1, "", ""), 0)
	fill(t, src, newFeeder(src), rand.New(rand.NewPCG(2, 2)), 30)
	if _, err := src.Checkpoint("cp"); err != nil {
		t.Fatal(err)
	}
	want := a.AppliedState()
	sum, _ := a.Checksum()
	tog.Enable()
	if err := a.Restore("cp"); !errorfs.IsInjected(err) {
		t.Fatalf("Restore = %v, want the injected error", err)
	}
	tog.Disable()
	sameAppliedState(t, a.AppliedState(), want)
	if got, err := a.Checksum(); err != nil || got != sum {
		t.Fatalf("checksum after failed restore: %x %v", got, err)
	}
	fill(t, a, newFeeder(a), rand.New(rand.NewPCG(3, 3)), 5)
	// Retrying succeeds.
	if err := a.Restore("cp"); err != nil {
		t.Fatal(err)
	}
	sameShards(t, a, src)
}
