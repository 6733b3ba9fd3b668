package raftlog

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/storage"
)

// entryData is the payload the concurrent test writes at (index, term), so
// that readers can check every entry they get.
func entryData(index, term uint64) string { return fmt.Sprintf("%d@%d", index, term) }

// TestConcurrent runs one writer per shard (Append with suffix rewrites,
// Compact, ApplySnapshot, Commit, each on its own batch) against readers
// calling Entries, Term, FirstIndex and LastIndex on the same Logs, with a
// tiny cache so that eviction runs all the time. Readers check that whatever
// they get is consistent; run with -race.
func TestConcurrent(t *testing.T) {
	env := newTestEnv(t, Options{EntryCacheBytes: 4 << 10})
	s := env.store()
	const shards, rounds = 4, 400
	logs := make([]*Log, shards)
	for i := range logs {
		logs[i] = mustShard(t, s, uint64(i+1))
	}
	var stop atomic.Bool
	var readErr atomic.Value
	fail := func(err error) { readErr.CompareAndSwap(nil, err) }

	var readers sync.WaitGroup
	for r := 0; r < 3; r++ {
		readers.Add(1)
		go func(seed uint64) {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(seed, 1))
			for !stop.Load() {
				l := logs[rng.IntN(shards)]
				fi, _ := l.FirstIndex()
				li, _ := l.LastIndex()
				if li < fi {
					continue
				}
				lo := fi + rng.Uint64N(li-fi+1)
				hi := lo + rng.Uint64N(li+2-lo)
				es, err := l.Entries(lo, hi, rng.Uint64N(2000))
				if err != nil {
					// The log moved on between the calls.
					if !errors.Is(err, raft.ErrCompacted) && !errors.Is(err, raft.ErrUnavailable) {
						fail(fmt.Errorf("Entries(%d, %d): %w", lo, hi, err))
					}
					continue
				}
				for i, e := range es {
					if e.GetIndex() != lo+uint64(i) || string(e.GetData()) != entryData(e.GetIndex(), e.GetTerm()) {
						fail(fmt.Errorf("Entries(%d, %d)[%d] = index %d term %d data %q", lo, hi, i, e.GetIndex(), e.GetTerm(), e.GetData()))
					}
				}
				if _, err := l.Term(lo); err != nil && !errors.Is(err, raft.ErrCompacted) && !errors.Is(err, raft.ErrUnavailable) {
					fail(fmt.Errorf("Term(%d): %w", lo, err))
				}
				_ = l.SizeBytes()
				_ = l.HardState()
				_ = s.CacheBytes()
			}
		}(uint64(r))
	}

	var writers sync.WaitGroup
	for w := 0; w < shards; w++ {
		writers.Add(1)
		go func(l *Log, seed uint64) {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(seed, 2))
			term := uint64(1)
			for round := 0; round < rounds; round++ {
				b := storage.NewBatch()
				li, _ := l.LastIndex()
				fi, _ := l.FirstIndex()
				k := li + 1
				if rng.IntN(4) == 0 && li >= fi {
					term++ // a new leader rewrites a suffix
					k = li + 1 - min(li-fi+1, rng.Uint64N(5))
				}
				var es []*raftpb.Entry
				for i := uint64(0); i < 1+rng.Uint64N(8); i++ {
					es = append(es, ent(k+i, term, entryData(k+i, term)))
				}
				hs := &raftpb.HardState{Term: new(term), Commit: new(k - 1)}
				if err := l.Append(b, es, hs); err != nil {
					fail(err)
					return
				}
				switch rng.IntN(10) {
				case 0, 1:
					li, _ := l.LastIndex()
					fi, _ := l.FirstIndex()
					if li > fi+5 {
						if err := l.Compact(b, li-5); err != nil {
							fail(err)
							return
						}
					}
				case 2:
					if rng.IntN(10) == 0 {
						li, _ := l.LastIndex()
						term++
						if err := l.ApplySnapshot(b, li+3, term, nil); err != nil {
							fail(err)
							return
						}
					}
				}
				if err := s.Commit(b); err != nil {
					fail(err)
					return
				}
			}
		}(logs[w], uint64(w))
	}
	writers.Wait()
	stop.Store(true)
	readers.Wait()
	if err, _ := readErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	if got := s.CacheBytes(); got > 4<<10 {
		t.Fatalf("cache holds %d bytes after all commits, budget %d", got, 4<<10)
	}
	// The committed state survives a reopen.
	want := make([][2]uint64, shards)
	for i, l := range logs {
		fi, _ := l.FirstIndex()
		li, _ := l.LastIndex()
		want[i] = [2]uint64{fi, li}
	}
	s = env.reopen()
	for i := range logs {
		l := mustShard(t, s, uint64(i+1))
		fi, _ := l.FirstIndex()
		li, _ := l.LastIndex()
		if fi != want[i][0] || li != want[i][1] {
			t.Fatalf("shard %d after reopen: log [%d, %d], want %v", i+1, fi, li, want[i])
		}
		if li >= fi {
			es, err := l.Entries(fi, li+1, 1<<62)
			if err != nil || len(es) != int(li-fi+1) {
				t.Fatalf("shard %d after reopen: %d entries, %v", i+1, len(es), err)
			}
		}
	}
}
