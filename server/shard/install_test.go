package shard

import (
	"fmt"
	"math/rand/v2"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// TestRestoreOpensCheckpointOnce counts the engine opens of a Restore: the
// checkpoint's WAL is replayed, and its CURRENT read, exactly once (the
// open that then serves as the shard's engine), not once to validate it
// and again to install it.
func TestRestoreOpensCheckpointOnce(t *testing.T) {
	var counting atomic.Bool
	var walOpens, currentOpens atomic.Int64
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op, p string) error {
		if op != errorfs.OpOpen || !counting.Load() {
			return nil
		}
		switch {
		case strings.HasSuffix(p, ".log"):
			walOpens.Add(1)
		case path.Base(p) == "CURRENT":
			currentOpens.Add(1)
		}
		return nil
	}))
	env := newTestEnv(t, fs)
	desc := userDesc(3, "", "")
	src := env.bootstrap("src", desc, 0)
	fill(t, src, newFeeder(src), rand.New(rand.NewPCG(7, 7)), 60) // in the WAL
	a := env.bootstrap("a", desc, 0)
	fill(t, a, newFeeder(a), rand.New(rand.NewPCG(8, 8)), 10)
	if _, err := src.Checkpoint("cp"); err != nil {
		t.Fatal(err)
	}
	counting.Store(true)
	if err := a.Restore("cp"); err != nil {
		t.Fatal(err)
	}
	counting.Store(false)
	if n := walOpens.Load(); n != 1 {
		t.Errorf("Restore opened a WAL %d times, want 1", n)
	}
	if n := currentOpens.Load(); n != 1 {
		t.Errorf("Restore opened an engine %d times (CURRENT reads), want 1", n)
	}
	sameShards(t, src, a)
}

// TestRestoreCrashAtEveryStep takes the state a power loss would leave
// before every filesystem change of a Restore, for a valid checkpoint, one
// of another shard and one with a corrupt MANIFEST (both refused):
// reopening each must find the old engine or, for the valid one, the new
// one, whole, and nothing set aside. A refused Restore keeps serving the
// old engine.
func TestRestoreCrashAtEveryStep(t *testing.T) {
	for _, kind := range []string{"valid", "other-shard", "corrupt"} {
		t.Run(kind, func(t *testing.T) {
			valid := kind == "valid"
			mem := vfs.NewCrashableMem()
			var recording atomic.Bool
			var mu sync.Mutex
			var crashes []*vfs.MemFS
			fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op, _ string) error {
				if op.IsWrite() && recording.Load() {
					c := mem.CrashClone()
					mu.Lock()
					crashes = append(crashes, c)
					mu.Unlock()
				}
				return nil
			}))
			env := newTestEnv(t, fs)
			desc := userDesc(5, "", "")
			srcDesc := desc
			if kind == "other-shard" {
				srcDesc = userDesc(6, "", "")
			}
			src := env.bootstrap("src", srcDesc, 0)
			fs0 := newFeeder(src)
			fill(t, src, fs0, rand.New(rand.NewPCG(1, 5)), 120)
			if _, err := src.Flush(); err != nil {
				t.Fatal(err)
			}
			fill(t, src, fs0, rand.New(rand.NewPCG(2, 5)), 30) // some in the WAL
			a := env.bootstrap("a", desc, 0)
			fill(t, a, newFeeder(a), rand.New(rand.NewPCG(3, 5)), 40)
			if _, err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			oldSum, err := a.Checksum()
			if err != nil {
				t.Fatal(err)
			}
			newSum, err := src.Checksum()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := src.Checkpoint("cp"); err != nil {
				t.Fatal(err)
			}
			if kind == "corrupt" {
				corruptManifest(t, mem, "cp")
			}
			if err := vfs.SyncDir(mem, ""); err != nil {
				t.Fatal(err)
			}
			recording.Store(true)
			err = a.Restore("cp")
			recording.Store(false)
			// A background flush or compaction may still be recording one.
			mu.Lock()
			points := slices.Clone(crashes)
			mu.Unlock()
			if valid != (err == nil) {
				t.Fatalf("Restore = %v", err)
			}
			if !valid {
				if sum, err := a.Checksum(); err != nil || sum != oldSum {
					t.Fatalf("after a refused Restore: checksum %x, %v; want %x", sum, err, oldSum)
				}
				fill(t, a, newFeeder(a), rand.New(rand.NewPCG(4, 5)), 5) // still usable
				if _, err := mem.Stat("cp"); err == nil {
					t.Fatal("refused checkpoint not deleted")
				}
			}
			if len(points) == 0 {
				t.Fatal("no crash points recorded")
			}
			sawNew := false
			for i, c := range points {
				env2 := newTestEnv(t, c)
				b, err := Open("a", env2.opts(0))
				if err != nil {
					t.Fatalf("crash point %d: Open: %v", i, err)
				}
				sum, err := b.Checksum()
				if err != nil {
					t.Fatalf("crash point %d: %v", i, err)
				}
				switch {
				case sum == oldSum:
				case valid && sum == newSum:
					sawNew = true
				default:
					t.Fatalf("crash point %d of %d: checksum %x, neither old %x nor new %x", i, len(points), sum, oldSum, newSum)
				}
				if _, err := c.Stat("a" + restoreOldSuffix); err == nil {
					t.Fatalf("crash point %d: %s left behind", i, "a"+restoreOldSuffix)
				}
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if valid && !sawNew {
				t.Error("no crash point found the new engine")
			}
			t.Logf("%d crash points", len(points))
		})
	}
}

// corruptManifest overwrites the MANIFEST of the engine copy in dir with
// bytes that do not decode.
func corruptManifest(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "MANIFEST-") {
			continue
		}
		f, err := fs.Create(fs.Join(dir, n))
		if err == nil {
			_, err = f.Write([]byte("not a manifest, not a manifest, not a manifest"))
		}
		if err == nil {
			err = f.Sync()
		}
		if err == nil {
			err = f.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no MANIFEST in %s", dir)
}

// BenchmarkRestore installs a checkpoint of a shard holding 64 MiB of
// 16 KiB random values, on the OS filesystem, with the server's default
// 16 MiB shard memtable (so up to one memtable's worth of the data is in
// the checkpoint's WAL, which opening it replays). Each op is one Restore
// of a fresh checkpoint (taken outside the timer); besides the time it
// reports the process's CPU (user and system) over the Restore calls.
func BenchmarkRestore(b *testing.B) {
	root := b.TempDir()
	env := newTestEnv(b, vfs.Default)
	opts := env.opts(0)
	opts.Storage.MemTableSize = 16 << 20
	desc := userDesc(2, "", "")
	src, err := Bootstrap(filepath.Join(root, "src"), initialState(desc), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = src.Close() })
	f := newFeeder(src)
	rng := rand.New(rand.NewPCG(1, 2))
	value := make([]byte, 16<<10)
	for i := range 4096 {
		for j := range value {
			value[j] = byte(rng.Uint32())
		}
		cmd := txnCmd(int64(i+1), &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("k%09d", i), string(value), 0, false)}})
		if _, err := src.Apply([]replication.Entry{f.entry(marshalCmd(b, cmd))}); err != nil {
			b.Fatal(err)
		}
	}
	a, err := Bootstrap(filepath.Join(root, "a"), initialState(desc), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	var cpu time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		cp := filepath.Join(root, fmt.Sprintf("cp%d", i))
		if _, err := src.Checkpoint(cp); err != nil {
			b.Fatal(err)
		}
		c0 := processCPU(b)
		b.StartTimer()
		if err := a.Restore(cp); err != nil {
			b.Fatal(err)
		}
		cpu += processCPU(b) - c0
	}
	b.StopTimer()
	b.ReportMetric(cpu.Seconds()*1e3/float64(b.N), "cpu-ms/op")
}

// processCPU returns the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestRestoreRefusedIntoUninitialized refuses a corrupt checkpoint sent to
// an uninitialized replica (whose engine holds no metadata): the replica
// stays uninitialized and usable, and a valid checkpoint installs after.
func TestRestoreRefusedIntoUninitialized(t *testing.T) {
	env := newTestEnv(t, nil)
	desc := userDesc(4, "", "")
	src := env.bootstrap("src", desc, 0)
	fill(t, src, newFeeder(src), rand.New(rand.NewPCG(9, 9)), 30)
	b, err := OpenEmpty("b", env.opts(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := src.Checkpoint("cp"); err != nil {
		t.Fatal(err)
	}
	corruptManifest(t, env.fs, "cp")
	if err := b.Restore("cp"); err == nil {
		t.Fatal("Restore of a corrupt checkpoint succeeded")
	}
	if st := b.AppliedState(); st.Index != 0 || st.Descriptor != nil {
		t.Fatalf("after a refused Restore: state %v, want uninitialized", st)
	}
	if _, err := src.Checkpoint("cp2"); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore("cp2"); err != nil {
		t.Fatal(err)
	}
	sameShards(t, src, b)
}
