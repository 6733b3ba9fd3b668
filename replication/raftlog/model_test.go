package raftlog

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/shale-db/shale/storage"
)

// shardModel is the oracle of one shard: a raft.MemoryStorage and the hard
// state, both as staged (live) and as of the last Commit (durable).
type shardModel struct {
	live, durable    *raft.MemoryStorage
	hs, durableHS    *raftpb.HardState
	persisted        bool // has a hard state or truncated state key
	durablePersisted bool
	maxTerm          uint64
	log              *Log
}

// modelShards mixes adjacent IDs and IDs at byte boundaries, so that a key
// bleeding into a neighbour's range shows up.
var modelShards = []uint64{1, 2, 255, 256, 1 << 56, math.MaxUint64 - 1, math.MaxUint64}

func TestModel(t *testing.T) {
	for _, cfg := range []struct {
		name  string
		cache int64
	}{
		{"cache-disabled", -1},
		{"cache-tiny", 4 << 10},
		{"cache-default", 0},
	} {
		seeds, steps := uint64(3), 2500
		if raceEnabled || testing.Short() {
			seeds, steps = 2, 800
		}
		for seed := uint64(1); seed <= seeds; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", cfg.name, seed), func(t *testing.T) {
				runModel(t, seed, Options{EntryCacheBytes: cfg.cache}, steps)
			})
		}
	}
}

func runModel(t *testing.T, seed uint64, opts Options, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	env := newTestEnv(t, opts)
	s := env.store()
	models := make(map[uint64]*shardModel)
	for _, id := range modelShards {
		models[id] = &shardModel{
			live:    raft.NewMemoryStorage(),
			durable: raft.NewMemoryStorage(),
			hs:      new(raftpb.HardState), durableHS: new(raftpb.HardState),
			log: mustShard(t, s, id),
		}
	}
	b := storage.NewBatch()
	var stats struct{ appends, compacts, snaps, destroys, commits, reopens, crashes int }

	for step := 0; step < steps; step++ {
		id := modelShards[rng.IntN(len(modelShards))]
		m := models[id]
		fi, _ := m.live.FirstIndex()
		li, _ := m.live.LastIndex()
		trunc := fi - 1
		ctx := fmt.Sprintf("step %d shard %d (log (%d, %d])", step, id, trunc, li)

		switch r := rng.IntN(100); {
		case r < 45: // Append, possibly overlapping and conflicting.
			stats.appends++
			lo := uint64(1)
			if trunc > 3 {
				lo = trunc - 3
			}
			k := lo + rng.Uint64N(li+2-lo)
			if rng.IntN(3) > 0 && li >= 1 {
				k = max(lo, li+1-rng.Uint64N(2)) // mostly plain appends
			}
			n := rng.IntN(8)
			term := uint64(1)
			if k-1 >= trunc && k-1 <= li {
				term, _ = m.live.Term(k - 1)
				term = max(term, 1)
			}
			if rng.IntN(3) == 0 {
				m.maxTerm++
				term = max(term, m.maxTerm)
			}
			m.maxTerm = max(m.maxTerm, term)
			var es []*raftpb.Entry
			for i := 0; i < n; i++ {
				size := rng.IntN(300)
				if rng.IntN(20) == 0 {
					size = 3000
				}
				data := make([]byte, size)
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				e := ent(k+uint64(i), term, "")
				e.Data = data
				if rng.IntN(10) == 0 {
					e.Type = new(raftpb.EntryConfChangeV2)
				}
				if rng.IntN(10) == 0 {
					e.Type = nil // unset optional fields must survive the round trip
				}
				es = append(es, e)
			}
			var hs *raftpb.HardState
			if rng.IntN(2) == 0 {
				hs = &raftpb.HardState{Term: new(m.maxTerm), Vote: new(rng.Uint64N(4)), Commit: new(rng.Uint64N(li + 1))}
			}
			if err := m.log.Append(b, es, hs); err != nil {
				t.Fatalf("%s: Append(%d entries at %d): %v", ctx, n, k, err)
			}
			if err := m.live.Append(es); err != nil {
				t.Fatalf("%s: oracle Append: %v", ctx, err)
			}
			if !raft.IsEmptyHardState(hs) {
				m.hs, m.persisted = hs, true
			}
		case r < 57: // Compact, sometimes below the truncated index.
			stats.compacts++
			if li == 0 {
				continue
			}
			idx := trunc + 1 + rng.Uint64N(li-trunc+1)
			if idx > li || rng.IntN(8) == 0 {
				idx = trunc - min(trunc, rng.Uint64N(3))
			}
			errL := m.log.Compact(b, idx)
			errM := m.live.Compact(idx)
			if !sameErr(errL, errM) {
				t.Fatalf("%s: Compact(%d) = %v, oracle %v", ctx, idx, errL, errM)
			}
			if errM == nil {
				m.persisted = true
			}
		case r < 61: // ApplySnapshot beyond the truncated index.
			stats.snaps++
			idx := trunc + 1 + rng.Uint64N(li-trunc+10)
			m.maxTerm += rng.Uint64N(3)
			term := max(m.maxTerm, 1)
			m.maxTerm = term
			hs := &raftpb.HardState{Term: new(term), Commit: new(idx)}
			if rng.IntN(3) == 0 {
				hs = nil
			}
			if err := m.log.ApplySnapshot(b, idx, term, hs); err != nil {
				t.Fatalf("%s: ApplySnapshot(%d, %d): %v", ctx, idx, term, err)
			}
			snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(idx), Term: new(term)}}
			if err := m.live.ApplySnapshot(snap); err != nil {
				t.Fatalf("%s: oracle ApplySnapshot: %v", ctx, err)
			}
			if hs != nil {
				m.hs = hs
			}
			m.persisted = true
		case r < 63: // Destroy.
			stats.destroys++
			m.log.Destroy(b)
			m.live, m.hs, m.persisted, m.maxTerm = raft.NewMemoryStorage(), new(raftpb.HardState), false, 0
			mustShard(t, s, id) // the replica is re-created: new callbacks
		case r < 80: // Commit.
			stats.commits++
			mustCommit(t, s, b)
			b = storage.NewBatch()
			for _, m := range models {
				m.durable = cloneMem(t, m.live)
				m.durableHS, m.durablePersisted = m.hs, m.persisted
			}
			if opts.EntryCacheBytes > 0 && s.CacheBytes() > opts.EntryCacheBytes {
				t.Fatalf("%s: cache holds %d bytes after Commit, budget %d", ctx, s.CacheBytes(), opts.EntryCacheBytes)
			}
		case r < 83: // Reopen, after a commit or losing the uncommitted batch.
			if rng.IntN(2) == 0 {
				stats.reopens++
				mustCommit(t, s, b)
				for _, m := range models {
					m.durable = cloneMem(t, m.live)
					m.durableHS, m.durablePersisted = m.hs, m.persisted
				}
			} else {
				stats.crashes++
			}
			b = storage.NewBatch()
			s = env.reopen()
			for _, id := range modelShards {
				m := models[id]
				m.live = cloneMem(t, m.durable)
				m.hs, m.persisted = m.durableHS, m.durablePersisted
				m.log = mustShard(t, s, id)
				// SizeBytes is exact after a load.
				var want int64
				fi, _ := m.live.FirstIndex()
				li, _ := m.live.LastIndex()
				if li >= fi {
					es, _ := m.live.Entries(fi, li+1, math.MaxUint64)
					want = int64(entsSize(es))
				}
				if got := m.log.SizeBytes(); got != want {
					t.Fatalf("step %d shard %d: SizeBytes after reopen = %d, want %d", step, id, got, want)
				}
			}
			ids, err := s.ShardIDs()
			if err != nil {
				t.Fatalf("step %d: ShardIDs: %v", step, err)
			}
			var want []uint64
			for _, id := range modelShards {
				if models[id].persisted {
					want = append(want, id)
				}
			}
			slices.Sort(want)
			if !slices.Equal(ids, want) {
				t.Fatalf("step %d: ShardIDs = %v, want %v", step, ids, want)
			}
			for _, id := range modelShards {
				checkLog(t, fmt.Sprintf("step %d shard %d after reopen", step, id), rng, models[id].log, models[id])
			}
			continue
		default:
		}
		checkLog(t, ctx, rng, m.log, m)
		if step%100 == 0 {
			for _, id := range modelShards {
				checkLog(t, fmt.Sprintf("step %d shard %d", step, id), rng, models[id].log, models[id])
			}
		}
	}
	t.Logf("ops: %+v", stats)
}

func entsSize(es []*raftpb.Entry) uint64 {
	if len(es) == 0 {
		return 0
	}
	return prefixSizes(es)[len(es)-1]
}

// checkLog compares every raft.Storage method of l with the oracle.
func checkLog(t *testing.T, ctx string, rng *rand.Rand, l *Log, m *shardModel) {
	t.Helper()
	ms := m.live
	fiM, _ := ms.FirstIndex()
	liM, _ := ms.LastIndex()
	fiL, err := l.FirstIndex()
	if err != nil || fiL != fiM {
		t.Fatalf("%s: FirstIndex = %d, %v; oracle %d", ctx, fiL, err, fiM)
	}
	liL, err := l.LastIndex()
	if err != nil || liL != liM {
		t.Fatalf("%s: LastIndex = %d, %v; oracle %d", ctx, liL, err, liM)
	}
	if got := l.TruncatedIndex(); got != fiM-1 {
		t.Fatalf("%s: TruncatedIndex = %d, oracle %d", ctx, got, fiM-1)
	}
	if got, want := l.TruncatedTerm(), must(ms.Term(fiM-1)); got != want {
		t.Fatalf("%s: TruncatedTerm = %d, oracle %d", ctx, got, want)
	}
	for i := fiM - 1 - min(fiM-1, 3); i <= liM+3; i++ {
		tL, errL := l.Term(i)
		tM, errM := ms.Term(i)
		if tL != tM || !sameErr(errL, errM) {
			t.Fatalf("%s: Term(%d) = %d, %v; oracle %d, %v", ctx, i, tL, errL, tM, errM)
		}
	}
	hs, cs, err := l.InitialState()
	if err != nil || !sameHardState(hs, m.hs) || len(cs.GetVoters()) != 3 {
		t.Fatalf("%s: InitialState = %v, %v, %v; want hard state %v", ctx, hs, cs, err, m.hs)
	}
	if !sameHardState(l.HardState(), m.hs) {
		t.Fatalf("%s: HardState = %v, want %v", ctx, l.HardState(), m.hs)
	}
	if l.SizeBytes() < 0 || (liM < fiM && l.SizeBytes() != 0) {
		t.Fatalf("%s: SizeBytes = %d", ctx, l.SizeBytes())
	}

	var all []*raftpb.Entry
	if liM >= fiM {
		all = must(ms.Entries(fiM, liM+1, math.MaxUint64))
	}
	for n := 0; n < 8; n++ {
		lo := fiM - min(fiM, 2) + rng.Uint64N(liM+2-(fiM-min(fiM, 2)))
		hi := lo + rng.Uint64N(liM+2-lo)
		maxSizes := []uint64{0, math.MaxUint64, rng.Uint64N(4000)}
		if lo >= fiM && hi > lo {
			ps := prefixSizes(all[lo-fiM : hi-fiM])
			j := rng.IntN(len(ps))
			maxSizes = append(maxSizes, ps[j], ps[j]-1, ps[j]+1)
		}
		for _, maxSize := range maxSizes {
			eL, errL := l.Entries(lo, hi, maxSize)
			eM, errM := ms.Entries(lo, hi, maxSize)
			if !sameErr(errL, errM) || !sameEntries(eL, eM) {
				t.Fatalf("%s: Entries(%d, %d, %d) = %d entries, %v; oracle %d entries, %v",
					ctx, lo, hi, maxSize, len(eL), errL, len(eM), errM)
			}
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
