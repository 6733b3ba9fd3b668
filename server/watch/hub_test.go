package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/server/shard"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testShard is a shard bootstrapped over the whole key space, fed entries
// directly (no Raft), with a model of its keys that predicts the events.
type testShard struct {
	t     *testing.T
	sh    *shard.Shard
	index uint64
	model map[string]string
	// keys bounds the keys written: k00 up to it (excluded).
	keys int
	rev  uint64
	// events are every change applied, as a watcher must see them.
	events []ev
	// splits hosts the shards splits create, if the shard may split.
	splits *splitter
}

// ev is an event in a comparable form.
type ev struct {
	rev     uint64
	del     bool
	key     string
	value   string
	prev    string
	hasPrev bool
}

func (e ev) String() string {
	op := "put"
	if e.del {
		op = "del"
	}
	return fmt.Sprintf("%d:%s:%s=%s(prev %v %s)", e.rev, op, e.key, e.value, e.hasPrev, e.prev)
}

func newTestShard(t *testing.T, archiveWAL int64, splits *splitter) *testShard {
	return newTestShardTo(t, archiveWAL, splits, nil)
}

// newTestShardTo bootstraps shard 1 over ["", end).
func newTestShardTo(t *testing.T, archiveWAL int64, splits *splitter, end []byte) *testShard {
	t.Helper()
	return newTestShardWith(t, testShardOptions(archiveWAL), splits, end)
}

// testShardOptions are the options of a test shard: 64 KiB memtables, WAL
// files archived up to archiveWAL bytes (negative: none), the default
// history window.
func testShardOptions(archiveWAL int64) shard.Options {
	return shard.Options{
		Storage: &storage.Options{FS: vfs.NewMem(), MemTableSize: 64 << 10, WALArchiveMaxBytes: archiveWAL,
			DisableWritePacing: true, Logger: quiet},
		Logger: quiet,
	}
}

// newTestShardWith bootstraps shard 1 over ["", end) with opts.
func newTestShardWith(t *testing.T, opts shard.Options, splits *splitter, end []byte) *testShard {
	t.Helper()
	if splits != nil {
		opts.ShardsDir = "shards"
	}
	sh, err := shard.Bootstrap("shard", replication.AppliedState{
		Index: 10, Term: 1, ConfState: &raftpb.ConfState{Voters: []uint64{1}},
		Descriptor: &shalev1.ShardDescriptor{ShardId: 1, Epoch: 1, NextReplicaId: 2, EndKey: end,
			Replicas: []*shalev1.ReplicaDescriptor{{NodeId: 1, ReplicaId: 1}}},
	}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.Close() })
	return &testShard{t: t, sh: sh, index: 10, model: map[string]string{}, keys: 20, splits: splits}
}

// apply applies one entry holding cmd and returns its result.
func (s *testShard) apply(cmd *shalev1.RaftCommand) *shalev1.CommandResult {
	s.t.Helper()
	payload, err := proto.Marshal(cmd)
	if err != nil {
		s.t.Fatal(err)
	}
	s.index++
	ap, err := s.sh.Apply([]replication.Entry{{Index: s.index, Term: 1, Payload: payload}})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range ap.Effects {
		if h, ok := e.(replication.HostShard); ok && s.splits != nil {
			s.splits.right = h.StateMachine.(*shard.Shard)
		}
	}
	r, _ := ap.Results[0].(*shalev1.CommandResult)
	if r.GetErrorCode() != 0 {
		s.t.Fatalf("entry %d: %s", s.index, r.GetErrorMessage())
	}
	return r
}

// noop applies an entry that changes nothing.
func (s *testShard) noop() {
	s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Noop{Noop: true}})
}

// write applies a transaction of random puts, deletes and range deletions
// on keys k00-k19, and records the events it must produce.
func (s *testShard) write(rng *rand.Rand) {
	ops := s.randomOps(rng)
	res := s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: ops}}})
	s.record(ops, res.GetTxn().GetHeader().GetRevision())
}

// writePacked applies n random transactions (as write's) packed into one
// Raft entry (replication.Entry.Parts), and records their events, each at
// its own revision.
func (s *testShard) writePacked(rng *rand.Rand, n int) {
	s.t.Helper()
	ops := make([][]*shalev1.RequestOp, n)
	for i := range n {
		ops[i] = s.randomOps(rng)
	}
	s.applyPacked(ops)
}

// applyPacked applies the transactions of ops packed into one Raft entry,
// and records their events, each at its own revision.
func (s *testShard) applyPacked(ops [][]*shalev1.RequestOp) {
	s.t.Helper()
	s.index++
	n := len(ops)
	ents := make([]replication.Entry, n)
	for i := range n {
		payload, err := proto.Marshal(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: ops[i]}}})
		if err != nil {
			s.t.Fatal(err)
		}
		ents[i] = replication.Entry{Index: s.index, Term: 1, Payload: payload, Part: i, Parts: n}
	}
	ap, err := s.sh.Apply(ents)
	if err != nil {
		s.t.Fatal(err)
	}
	for i, r := range ap.Results {
		res, _ := r.(*shalev1.CommandResult)
		if res.GetErrorCode() != 0 {
			s.t.Fatalf("entry %d part %d: %s", s.index, i, res.GetErrorMessage())
		}
		s.record(ops[i], res.GetTxn().GetHeader().GetRevision())
	}
}

// randomOps returns 1-3 random puts, deletes and range deletions on keys
// k00-k19.
func (s *testShard) randomOps(rng *rand.Rand) []*shalev1.RequestOp {
	var ops []*shalev1.RequestOp
	for range 1 + rng.IntN(3) {
		k := fmt.Sprintf("k%02d", rng.IntN(s.keys))
		switch n := rng.IntN(10); {
		case n < 6:
			ops = append(ops, &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(k), Value: []byte(fmt.Sprint("v", rng.IntN(1000)))}}})
		case n < 9:
			ops = append(ops, &shalev1.RequestOp{Op: &shalev1.RequestOp_Delete{Delete: &shalev1.DeleteOp{Key: []byte(k)}}})
		default:
			end := fmt.Sprintf("k%02d", rng.IntN(s.keys+1))
			if end <= k {
				k, end = end, k
			}
			if k == end {
				end += "x"
			}
			ops = append(ops, &shalev1.RequestOp{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeOp{StartKey: []byte(k), EndKey: []byte(end)}}})
		}
	}
	return ops
}

// record records the events of ops applied at revision rev.
func (s *testShard) record(ops []*shalev1.RequestOp, rev uint64) {
	s.rev = rev
	for _, op := range ops {
		switch o := op.GetOp().(type) {
		case *shalev1.RequestOp_Put:
			k := string(o.Put.Key)
			prev, had := s.model[k]
			s.events = append(s.events, ev{rev: rev, key: k, value: string(o.Put.Value), prev: prev, hasPrev: had})
			s.model[k] = string(o.Put.Value)
		case *shalev1.RequestOp_Delete:
			k := string(o.Delete.Key)
			if prev, had := s.model[k]; had {
				s.events = append(s.events, ev{rev: rev, del: true, key: k, prev: prev, hasPrev: true})
				delete(s.model, k)
			}
		case *shalev1.RequestOp_DeleteRange:
			lo, hi := string(o.DeleteRange.StartKey), string(o.DeleteRange.EndKey)
			for _, k := range slices.Sorted(maps.Keys(s.model)) {
				if k >= lo && k < hi {
					s.events = append(s.events, ev{rev: rev, del: true, key: k, prev: s.model[k], hasPrev: true})
					delete(s.model, k)
				}
			}
		}
	}
}

// put applies a put of one key.
func (s *testShard) put(k, v string) {
	res := s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Txn{Txn: &shalev1.TxnRequest{Success: []*shalev1.RequestOp{
		{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(k), Value: []byte(v)}}}}}}})
	s.rev = res.GetTxn().GetHeader().GetRevision()
	prev, had := s.model[k]
	s.events = append(s.events, ev{rev: s.rev, key: k, value: v, prev: prev, hasPrev: had})
	s.model[k] = v
}

// expected returns the events a watcher of req must see after revision
// after (prev values only with PrevKV).
func expected(all []ev, req Request, after uint64) []ev {
	var out []ev
	for _, e := range all {
		if e.rev <= after || !req.contains([]byte(e.key)) {
			continue
		}
		if !req.PrevKV {
			e.prev, e.hasPrev = "", false
		}
		out = append(out, e)
	}
	return out
}

// toEvs converts an update's events.
func toEvs(u Update) []ev {
	var out []ev
	for i, e := range u.Events {
		x := ev{rev: u.Revisions[i], del: e.GetType() == shalev1.WatchEvent_TYPE_DELETE, key: string(e.GetKv().GetKey()),
			value: string(e.GetKv().GetValue()), prev: string(e.GetPrevKv().GetValue()), hasPrev: e.GetPrevKv() != nil}
		out = append(out, x)
	}
	return out
}

// collect takes a watcher's updates until through reaches rev (progress
// reports included: the last entries may hold none of its changes),
// checking that revisions never go back.
func collect(t *testing.T, w *Watcher, rev uint64) ([]ev, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []ev
	var through uint64
	for through < rev {
		u, err := w.Next(ctx, time.After(5*time.Millisecond))
		if err != nil {
			return got, err
		}
		for i, r := range u.Revisions {
			if r <= through || (i > 0 && r < u.Revisions[i-1]) || r > u.Through {
				t.Fatalf("update revisions %v through %d after %d", u.Revisions, u.Through, through)
			}
		}
		through = u.Through
		got = append(got, toEvs(u)...)
	}
	return got, nil
}

// TestHubDeliversEveryChange: watchers of random ranges, started at random
// revisions (from the log or live, inside packed Raft entries too), with
// and without previous values, started while a writer applies
// transactions (some packed several to an entry), each see exactly the
// changes of their range after their start, in order, with the values the
// model predicts; a slow watcher is cancelled with a resume revision from
// which a new watcher continues without a gap or a repeat.
func TestHubDeliversEveryChange(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 5))
			s := newTestShard(t, 1<<30, nil)
			for range 50 {
				s.write(rng)
			}
			h, err := NewHub(s.sh, 1, Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Stop()
			type started struct {
				w     *Watcher
				req   Request
				after uint64
			}
			var ws []started
			for i := range 300 {
				switch rng.IntN(6) {
				case 0, 1:
					s.noop()
				case 2:
					s.writePacked(rng, 2+rng.IntN(3))
				default:
					s.write(rng)
				}
				if i%30 == 0 {
					lo := fmt.Sprintf("k%02d", rng.IntN(20))
					req := Request{Start: []byte(lo), PrevKV: rng.IntN(2) == 0}
					if rng.IntN(3) > 0 {
						req.End = []byte(fmt.Sprintf("k%02d", 1+rng.IntN(20)))
						if string(req.End) <= lo {
							req.Start, req.End = req.End, []byte(lo+"z")
						}
					}
					if rng.IntN(2) == 0 {
						req.StartRevision = 1 + rng.Uint64N(s.rev+2)
					}
					w, after, err := h.Watch(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					if req.StartRevision != 0 && after != req.StartRevision-1 {
						t.Fatalf("watch from %d: current through %d", req.StartRevision, after)
					}
					ws = append(ws, started{w, req, after})
				}
			}
			for i, x := range ws {
				got, err := collect(t, x.w, s.rev)
				if err != nil {
					th, q, fin, live, hr := x.w.debugState()
					t.Fatalf("watcher %d %+v: %v (through %d queue %d finished %v live %v hub rev %d shard rev %d)", i, x.req, err, th, q, fin, live, hr, s.rev)
				}
				want := expected(s.events, x.req, x.after)
				if !slices.Equal(got, want) {
					t.Fatalf("watcher %d %+v after %d:\ngot  %v\nwant %v", i, x.req, x.after, got, want)
				}
				x.w.Close()
			}
		})
	}
}

// TestHubSlowWatcherResumes: a watcher whose queue overflows is cancelled
// with ErrTooSlow after the changes already queued; a new watcher from its
// resume revision continues with nothing lost or repeated, and other
// watchers are not held up. Options.TooSlow hears of the cancellation
// when it happens, before the slow watcher reads.
func TestHubSlowWatcherResumes(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	s := newTestShard(t, 1<<30, nil)
	var tooSlow atomic.Int32
	h, err := NewHub(s.sh, 1, Options{Logger: quiet, MaxQueueBytes: 8 << 10, TooSlow: func() { tooSlow.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	all := Request{Start: []byte{}}
	slow, _, err := h.Watch(context.Background(), all)
	if err != nil {
		t.Fatal(err)
	}
	fast, _, err := h.Watch(context.Background(), all)
	if err != nil {
		t.Fatal(err)
	}
	var fastGot []ev
	for range 30 { // the fast one keeps up while the writes go on
		for range 10 {
			s.write(rng)
		}
		got, err := collect(t, fast, s.rev)
		if err != nil {
			t.Fatal(err)
		}
		fastGot = append(fastGot, got...)
	}
	if n := tooSlow.Load(); n != 1 {
		t.Fatalf("TooSlow called %d times before the slow watcher read, want 1", n)
	}
	got, err := collect(t, slow, s.rev)
	var ie *InterruptedError
	if !errors.As(err, &ie) || !errors.Is(err, ErrTooSlow) || ie.Resume == 0 {
		t.Fatalf("slow watcher: %v, want ErrTooSlow with a resume revision", err)
	}
	again, after, err := h.Watch(context.Background(), Request{Start: []byte{}, StartRevision: ie.Resume})
	if err != nil {
		t.Fatal(err)
	}
	rest, err := collect(t, again, s.rev)
	if err != nil {
		t.Fatal(err)
	}
	if after != ie.Resume-1 {
		t.Fatalf("resumed watcher current through %d, want %d", after, ie.Resume-1)
	}
	want := expected(s.events, all, 0)
	if got = append(got, rest...); !slices.Equal(got, want) {
		t.Fatalf("slow watcher then its resumption (from %d):\ngot  %v\nwant %v", ie.Resume, got, want)
	}
	if !slices.Equal(fastGot, want) {
		t.Fatalf("fast watcher: %d events, want %d", len(fastGot), len(want))
	}
}

// TestHubCompacted: a start revision older than the change log is refused
// with ErrCompacted and the oldest revision available, which is accepted.
func TestHubCompacted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newTestShard(t, -1, nil) // WAL files deleted once flushed
	for range 30 {
		s.write(rng)
	}
	// Fill several 64 KiB memtables: their flushes delete the old WALs.
	for i := range 20 {
		s.put(fmt.Sprintf("big%02d", i), strings.Repeat("x", 16<<10))
	}
	for range 5 {
		s.write(rng)
	}
	h, err := NewHub(s.sh, 1, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	_, _, err = h.Watch(context.Background(), Request{Start: []byte{}, StartRevision: 2})
	var ie *InterruptedError
	if !errors.As(err, &ie) || !errors.Is(err, ErrCompacted) || ie.Compact == 0 {
		t.Fatalf("watch from revision 2: %v, want ErrCompacted", err)
	}
	// The engine's flushes go on in the background and may delete the
	// oldest WAL meanwhile: then the watch is refused again, with a newer
	// oldest revision.
	var got []ev
	for attempt := 1; ; attempt++ {
		w, _, err := h.Watch(context.Background(), Request{Start: []byte{}, StartRevision: ie.Compact})
		if err == nil {
			got, err = collect(t, w, s.rev)
		}
		if err == nil {
			break
		}
		if !errors.As(err, &ie) || !errors.Is(err, ErrCompacted) || attempt == 5 {
			t.Fatalf("watch from the oldest available revision: %v", err)
		}
		if ie.Compact == 0 {
			_, _, err = h.Watch(context.Background(), Request{Start: []byte{}, StartRevision: 2})
			if !errors.As(err, &ie) || ie.Compact == 0 {
				t.Fatalf("watch from revision 2 again: %v", err)
			}
		}
	}
	if want := expected(s.events, Request{Start: []byte{}}, ie.Compact-1); !slices.Equal(got, want) {
		t.Fatalf("from %d:\ngot  %v\nwant %v", ie.Compact, got, want)
	}
}

// TestHubProgress: an idle watcher's progress reports the hub's revision,
// entries without events included.
func TestHubProgress(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	s := newTestShard(t, 1<<30, nil)
	s.write(rng)
	h, err := NewHub(s.sh, 1, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	w, after, err := h.Watch(context.Background(), Request{Start: []byte("zzz")}) // no key of the writer's
	if err != nil {
		t.Fatal(err)
	}
	if after != s.rev {
		t.Fatalf("current through %d, want %d", after, s.rev)
	}
	for range 5 {
		s.write(rng)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u, err := w.Next(context.Background(), time.After(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if len(u.Events) > 0 {
			t.Fatalf("events outside the range: %v", u.Events)
		}
		if u.Through == s.rev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("progress stuck at %d, want %d", u.Through, s.rev)
		}
	}
}

// TestHubAfterMerge: a shard that absorbed its right neighbour at a
// revision far above the neighbour's serves a watch of the absorbed range
// from the neighbour's next revision, although its own log no longer
// reaches back there: it holds no change to that range before the merge.
func TestHubAfterMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	s := newTestShardTo(t, -1, nil, []byte("m"))
	for range 30 {
		s.write(rng)
	}
	for i := range 20 { // WAL rotations delete the old log
		s.put(fmt.Sprintf("big%02d", i), strings.Repeat("x", 16<<10))
	}
	h, err := NewHub(s.sh, 1, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	const rightRev = 7 // the neighbour's revision: far below this shard's
	right := &shalev1.ShardDescriptor{ShardId: 9, StartKey: []byte("m"), Epoch: 3, MergingInto: 1}
	stored := []byte{1, 5, 5, 1, 0, 'v'} // create 5, mod 5, version 1, no expiry, "v"
	s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeAbsorb{MergeAbsorb: &shalev1.MergeAbsorb{Right: right, Begin: true}}})
	s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_MergeAbsorb{MergeAbsorb: &shalev1.MergeAbsorb{
		Keys: [][]byte{[]byte("n")}, Values: [][]byte{stored}, Commit: true, RightRevision: rightRev}}})
	if got := s.sh.AbsorbedAt([]byte("m"), nil).Rev; got != s.rev {
		t.Fatalf("AbsorbedAt(m) = %d, want the revision of the merge, %d", got, s.rev)
	}
	before := len(s.events)
	s.put("n", "after the merge")
	s.put("p", "also")
	epoch := s.sh.Descriptor().GetEpoch()
	w, after, err := h.Watch(context.Background(), Request{Start: []byte("m"), StartRevision: rightRev + 1, Epoch: epoch})
	if err != nil {
		t.Fatalf("watch of the absorbed range from the neighbour's next revision: %v", err)
	}
	if after != rightRev {
		t.Fatalf("current through %d, want %d", after, rightRev)
	}
	got, err := collect(t, w, s.rev)
	if err != nil {
		t.Fatal(err)
	}
	if want := s.events[before:]; !slices.Equal(got, expected(want, Request{Start: []byte("m"), PrevKV: false}, 0)) {
		t.Fatalf("after the merge:\ngot  %v\nwant %v", got, want)
	}
	// The shard's own range keeps its history limits.
	if _, _, err := h.Watch(context.Background(), Request{Start: []byte("k"), End: []byte("l"), StartRevision: rightRev + 1, Epoch: epoch}); !errors.Is(err, ErrCompacted) {
		t.Fatalf("watch of the shard's own range from revision %d: %v, want ErrCompacted", rightRev+1, err)
	}
}

// splitter hosts the right shards of splits in memory (from the HostShard
// effects of Apply).
type splitter struct{ right *shard.Shard }

// TestHubRangeChange: a split that leaves part of a watcher's range to the
// new shard ends it with the new descriptor at the split's revision, after
// every earlier change; a watcher of the part that stays goes on.
func TestHubRangeChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	sp := &splitter{}
	s := newTestShard(t, 1<<30, sp)
	t.Cleanup(func() {
		if sp.right != nil {
			_ = sp.right.Close()
		}
	})
	h, err := NewHub(s.sh, 1, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	desc := s.sh.Descriptor()
	across, _, err := h.Watch(context.Background(), Request{Start: []byte("k05"), End: []byte("k15"), Epoch: desc.GetEpoch()})
	if err != nil {
		t.Fatal(err)
	}
	left, _, err := h.Watch(context.Background(), Request{Start: []byte("k00"), End: []byte("k08"), Epoch: desc.GetEpoch()})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		s.write(rng)
	}
	before := s.rev
	s.apply(&shalev1.RaftCommand{Command: &shalev1.RaftCommand_Split{Split: &shalev1.SplitCommand{SplitKey: []byte("k10"), RightShardId: 2}}})
	// Read up to the range change, not up to revision before (collect's
	// stop): when the last write is outside the range, the update that
	// first reaches it may be the range change itself.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []ev
	var u Update
	for u.RangeChange == nil {
		if u, err = across.Next(ctx, time.After(5*time.Millisecond)); err != nil {
			t.Fatalf("before the range change: %v", err)
		}
		got = append(got, toEvs(u)...)
	}
	if want := expected(s.events, Request{Start: []byte("k05"), End: []byte("k15")}, 0); !slices.Equal(got, want) {
		t.Fatalf("before the split:\ngot  %v\nwant %v", got, want)
	}
	if string(u.RangeChange.GetEndKey()) != "k10" || u.Through != before {
		t.Fatalf("after the split: %+v; want the range change to [.., k10) at %d", u, before)
	}
	if _, err := across.Next(context.Background(), nil); err != io.EOF {
		t.Fatalf("after the range change: %v, want io.EOF", err)
	}
	// The left part's watcher goes on: the keys from k10 moved away.
	s.keys = 10
	maps.DeleteFunc(s.model, func(k, _ string) bool { return k >= "k10" })
	for range 20 {
		s.write(rng)
	}
	got, err = collect(t, left, s.rev)
	if err != nil {
		t.Fatal(err)
	}
	if want := expected(s.events, Request{Start: []byte("k00"), End: []byte("k08")}, 0); !slices.Equal(got, want) {
		t.Fatalf("left watcher:\ngot  %v\nwant %v", got, want)
	}
}

// debugState reports a watcher's and its hub's state for failure messages.
func (w *Watcher) debugState() (through uint64, q int, finished bool, live bool, hubRev uint64) {
	w.hub.mu.Lock()
	_, live = w.hub.live[w]
	hubRev = w.hub.rev
	w.hub.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.through, len(w.queue), w.finished, live, hubRev
}
