package raftlog

import (
	"errors"
	"math"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/storage"
)

// TestEntriesMaxSize checks that Entries cuts results exactly as
// raft.MemoryStorage does (raft's limitSize: the longest prefix within
// maxSize, never empty), whether the entries come from the cache, the
// engine or both.
func TestEntriesMaxSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cache  int64
		commit bool
	}{
		{name: "cached", cache: 0, commit: true},
		{name: "engine", cache: -1, commit: true},
		{name: "mixed", cache: 1500, commit: true},
		{name: "staged", cache: -1, commit: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newTestEnv(t, Options{EntryCacheBytes: tc.cache})
			s := env.store()
			l := mustShard(t, s, 7)
			ms := raft.NewMemoryStorage()
			b := storage.NewBatch()
			if err := l.ApplySnapshot(b, 3, 2, nil); err != nil {
				t.Fatal(err)
			}
			_ = ms.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(3)), Term: new(uint64(2))}})
			var es []*raftpb.Entry
			for i := uint64(4); i < 24; i++ {
				// Sizes vary, some entries are empty, one is large.
				data := strings.Repeat("x", int(i*37%101))
				if i == 15 {
					data = strings.Repeat("y", 1000)
				}
				if i%5 == 0 {
					data = ""
				}
				es = append(es, ent(i, 3, data))
			}
			if err := l.Append(b, es, nil); err != nil {
				t.Fatal(err)
			}
			_ = ms.Append(es)
			if tc.commit {
				mustCommit(t, s, b)
			}
			if tc.name == "mixed" && (len(l.cache) == 0 || len(l.cache) == len(es)) {
				t.Fatalf("mixed: %d of %d entries cached, want some", len(l.cache), len(es))
			}
			for lo := uint64(4); lo <= 24; lo++ {
				for hi := lo; hi <= 24; hi++ {
					maxSizes := []uint64{0, 1, math.MaxUint64}
					if hi > lo {
						for _, p := range prefixSizes(es[lo-4 : hi-4]) {
							maxSizes = append(maxSizes, p-1, p, p+1)
						}
					}
					for _, maxSize := range maxSizes {
						got, err := l.Entries(lo, hi, maxSize)
						want, werr := ms.Entries(lo, hi, maxSize)
						if !sameErr(err, werr) || !sameEntries(got, want) {
							t.Fatalf("Entries(%d, %d, %d) = %d entries, %v; MemoryStorage %d, %v",
								lo, hi, maxSize, len(got), err, len(want), werr)
						}
						if hi > lo && maxSize == 0 && len(got) != 1 {
							t.Fatalf("Entries(%d, %d, 0) = %d entries, want exactly 1", lo, hi, len(got))
						}
					}
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	env := newTestEnv(t, Options{})
	s := env.store()
	l, err := s.Shard(3)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.InitialState(); err == nil {
		t.Fatal("InitialState without callbacks: no error")
	}
	if _, err := l.Snapshot(); !errors.Is(err, raft.ErrSnapshotTemporarilyUnavailable) {
		t.Fatalf("Snapshot without callback: %v", err)
	}
	// An empty log: like MemoryStorage.
	if _, err := l.Entries(1, 1, math.MaxUint64); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Entries on empty log: %v", err)
	}
	if _, err := l.Entries(0, 1, math.MaxUint64); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Entries(0, 1) on empty log: %v", err)
	}
	if term, err := l.Term(0); term != 0 || err != nil {
		t.Fatalf("Term(0) on empty log = %d, %v", term, err)
	}

	b := storage.NewBatch()
	if err := l.Append(b, ents(1, 11, 1), &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(5))}); err != nil {
		t.Fatal(err)
	}
	// A gap, and non-consecutive entries, are refused without staging.
	n := b.Count()
	if err := l.Append(b, ents(12, 14, 1), nil); err == nil {
		t.Fatal("append leaving a gap: no error")
	}
	if err := l.Append(b, []*raftpb.Entry{ent(11, 1, ""), ent(13, 1, "")}, nil); err == nil {
		t.Fatal("append of non-consecutive entries: no error")
	}
	if err := l.Append(b, []*raftpb.Entry{nil}, nil); err == nil {
		t.Fatal("append of a nil entry: no error")
	}
	if b.Count() != n {
		t.Fatalf("failed appends staged %d records", b.Count()-n)
	}
	if _, err := l.Entries(5, 12, math.MaxUint64); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Entries beyond last index: %v", err)
	}
	if _, err := l.Entries(6, 5, math.MaxUint64); err == nil {
		t.Fatal("Entries(6, 5): no error")
	}
	if err := l.Compact(b, 11); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Compact beyond last index: %v", err)
	}
	if err := l.Compact(b, 4); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(b, 4); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Compact(4) twice: %v", err)
	}
	if err := l.ApplySnapshot(b, 4, 1, nil); !errors.Is(err, raft.ErrSnapOutOfDate) {
		t.Fatalf("ApplySnapshot at the truncated index: %v", err)
	}
	if _, err := l.Term(3); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Term below truncated index: %v", err)
	}
	if _, err := l.Term(11); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Term above last index: %v", err)
	}
	mustCommit(t, s, b)

	// Snapshot calls the callback, outside the Log's lock.
	l.SetCallbacks(func() *raftpb.ConfState { return &raftpb.ConfState{Voters: []uint64{1}} },
		func() (*raftpb.Snapshot, error) {
			term, err := l.Term(4)
			if err != nil {
				return nil, err
			}
			return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(4)), Term: new(term)}}, nil
		})
	snap, err := l.Snapshot()
	if err != nil || snap.GetMetadata().GetIndex() != 4 || snap.GetMetadata().GetTerm() != 1 {
		t.Fatalf("Snapshot = %v, %v", snap, err)
	}
	hs, cs, err := l.InitialState()
	if err != nil || hs.GetCommit() != 5 || len(cs.GetVoters()) != 1 {
		t.Fatalf("InitialState = %v, %v, %v", hs, cs, err)
	}
}

// TestShardsIsolated checks that the shards of one engine do not see each
// other's keys, and Destroy removes exactly one shard.
func TestShardsIsolated(t *testing.T) {
	env := newTestEnv(t, Options{EntryCacheBytes: -1})
	s := env.store()
	ids := []uint64{0, 1, 2, 0xff, 0x100, math.MaxUint64}
	b := storage.NewBatch()
	for n, id := range ids {
		l := mustShard(t, s, id)
		if err := l.Append(b, ents(1, uint64(5+n), uint64(n+1)), &raftpb.HardState{Term: new(uint64(n + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	mustCommit(t, s, b)
	s = env.reopen()
	got, err := s.ShardIDs()
	if err != nil || len(got) != len(ids) {
		t.Fatalf("ShardIDs = %v, %v", got, err)
	}
	b = storage.NewBatch()
	for n, id := range ids {
		l := mustShard(t, s, id)
		li, _ := l.LastIndex()
		es, err := l.Entries(1, li+1, math.MaxUint64)
		if err != nil || li != uint64(4+n) || len(es) != 4+n || es[0].GetTerm() != uint64(n+1) {
			t.Fatalf("shard %d: last index %d, %d entries of term %d, %v", id, li, len(es), es[0].GetTerm(), err)
		}
		if id == 2 || id == math.MaxUint64 {
			l.Destroy(b)
		}
	}
	mustCommit(t, s, b)
	s = env.reopen()
	got, err = s.ShardIDs()
	if err != nil || len(got) != len(ids)-2 || got[0] != 0 || got[1] != 1 || got[2] != 0xff {
		t.Fatalf("ShardIDs after Destroy = %v, %v", got, err)
	}
	for n, id := range ids {
		l := mustShard(t, s, id)
		li, _ := l.LastIndex()
		destroyed := id == 2 || id == math.MaxUint64
		if (destroyed && (li != 0 || !raft.IsEmptyHardState(l.HardState()))) || (!destroyed && li != uint64(4+n)) {
			t.Fatalf("shard %d after Destroy of shards 2 and max: last index %d, hard state %v", id, li, l.HardState())
		}
	}
}

// TestCacheBudget checks that the cache stays within its budget across
// shards, evicting the oldest entries first, and never evicts entries of a
// batch that is not committed yet.
func TestCacheBudget(t *testing.T) {
	const budget = 8 << 10
	env := newTestEnv(t, Options{EntryCacheBytes: budget})
	s := env.store()
	l1, l2 := mustShard(t, s, 1), mustShard(t, s, 2)
	b := storage.NewBatch()
	big := strings.Repeat("z", 1000)
	var es []*raftpb.Entry
	for i := uint64(1); i <= 20; i++ {
		es = append(es, ent(i, 1, big))
	}
	if err := l1.Append(b, es, nil); err != nil {
		t.Fatal(err)
	}
	// Staged but uncommitted: everything stays cached, over budget.
	if len(l1.cache) != 20 {
		t.Fatalf("%d staged entries cached, want 20", len(l1.cache))
	}
	b2 := storage.NewBatch()
	if err := l2.Append(b2, es[:5], nil); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, b2)
	// Committing another batch evicts l1's entries only down to the ones
	// still staged: none.
	if len(l1.cache) != 20 {
		t.Fatalf("%d entries of an uncommitted batch cached, want 20", len(l1.cache))
	}
	mustCommit(t, s, b)
	if got := s.CacheBytes(); got > budget {
		t.Fatalf("cache holds %d bytes, budget %d", got, budget)
	}
	// l1's entries were cached first: they went first, oldest first, and
	// l2's newer ones stayed.
	if len(l2.cache) != 5 || len(l1.cache) == 0 || len(l1.cache) == 20 || l1.cache[len(l1.cache)-1].index != 20 {
		t.Fatalf("cached: shard 1 %d entries, shard 2 %d", len(l1.cache), len(l2.cache))
	}
	// Reads of evicted entries go to the engine.
	got, err := l1.Entries(1, 21, math.MaxUint64)
	if err != nil || !sameEntries(got, es) {
		t.Fatalf("Entries after eviction: %d entries, %v", len(got), err)
	}
	// Removing entries other than by eviction releases their charge.
	b = storage.NewBatch()
	if err := l1.Compact(b, 20); err != nil {
		t.Fatal(err)
	}
	l2.Destroy(b)
	mustCommit(t, s, b)
	if got := s.CacheBytes(); got != 0 || s.cacheLive != 0 {
		t.Fatalf("empty logs leave %d cached bytes, %d entries", got, s.cacheLive)
	}
}

// TestFIFOBounded checks that entries leaving the cache other than by
// eviction do not make the eviction queue grow without bound.
func TestFIFOBounded(t *testing.T) {
	env := newTestEnv(t, Options{})
	s := env.store()
	l := mustShard(t, s, 1)
	for round := uint64(0); round < 300; round++ {
		b := storage.NewBatch()
		base := round*10 + 1
		if err := l.Append(b, ents(base, base+10, 1), nil); err != nil {
			t.Fatal(err)
		}
		if err := l.Compact(b, base+9); err != nil {
			t.Fatal(err)
		}
		mustCommit(t, s, b)
	}
	s.cacheMu.Lock()
	n := len(s.fifo) - s.fifoHead
	s.cacheMu.Unlock()
	if n > 2100 {
		t.Fatalf("eviction queue holds %d slots for %d live entries", n, s.cacheLive)
	}
}

func TestDecodeTruncatedState(t *testing.T) {
	for _, c := range [][2]uint64{{0, 0}, {1, 1}, {math.MaxUint64, math.MaxUint64 - 1}} {
		i, tm, err := decodeTruncatedState(encodeTruncatedState(c[0], c[1]))
		if err != nil || i != c[0] || tm != c[1] {
			t.Fatalf("round trip of %v = %d, %d, %v", c, i, tm, err)
		}
	}
	enc := encodeTruncatedState(10, 3)
	for n := range enc {
		bad := append([]byte(nil), enc...)
		bad[n] ^= 0x40
		if _, _, err := decodeTruncatedState(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d: %v", n, err)
		}
	}
	for _, b := range [][]byte{nil, enc[:19], append(enc, 0)} {
		if _, _, err := decodeTruncatedState(b); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d bytes: %v", len(b), err)
		}
	}
}
