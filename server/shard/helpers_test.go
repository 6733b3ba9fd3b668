package shard

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// testEnv is a filesystem and shared engine resources for the shards of a
// test.
type testEnv struct {
	t      testing.TB
	fs     vfs.FS
	shared *storage.Shared
	// keepWAL archives WAL files instead of deleting them, so the whole
	// change log stays readable.
	keepWAL bool
	// records is the shards' record cache: small, so that entries are
	// evicted all the time (nil: none).
	records *RecordCache
	// historyWindow is the shards' Options.HistoryWindow (0: the default).
	historyWindow time.Duration
}

func newTestEnv(t testing.TB, fs vfs.FS) *testEnv {
	t.Helper()
	if fs == nil {
		fs = vfs.NewMem()
	}
	sh := storage.NewShared(&storage.SharedOptions{BlockCacheBytes: 8 << 20, CompactionWorkers: 2})
	t.Cleanup(func() { _ = sh.Close() })
	return &testEnv{t: t, fs: fs, shared: sh, records: NewRecordCache(32 << 10)}
}

// opts returns shard options with small memtables so that flushes and
// compactions happen in tests.
func (e *testEnv) opts(dedupCap int) Options {
	archive := int64(-1)
	if e.keepWAL {
		archive = 1 << 30
	}
	return Options{
		Storage: &storage.Options{
			FS:                 e.fs,
			Shared:             e.shared,
			MemTableSize:       64 << 10,
			WALArchiveMaxBytes: archive,
			DisableWritePacing: true,
			Logger:             quietLogger,
		},
		DedupCapacity: dedupCap,
		Logger:        quietLogger,
		RecordCache:   e.records,
		HistoryWindow: e.historyWindow,
	}
}

// userDesc is the descriptor of a user shard over [start, end) with three
// voters 1, 2, 3 on nodes 10, 20, 30.
func userDesc(id uint64, start, end string) *shalev1.ShardDescriptor {
	d := &shalev1.ShardDescriptor{ShardId: id, Epoch: 1, NextReplicaId: 4}
	if start != "" {
		d.StartKey = []byte(start)
	}
	if end != "" {
		d.EndKey = []byte(end)
	}
	for i := uint64(1); i <= 3; i++ {
		d.Replicas = append(d.Replicas, &shalev1.ReplicaDescriptor{NodeId: i * 10, ReplicaId: i})
	}
	return d
}

func initialState(desc *shalev1.ShardDescriptor) replication.AppliedState {
	return replication.AppliedState{
		Index:      10,
		Term:       5,
		ConfState:  &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
		Descriptor: desc,
	}
}

// bootstrap creates a shard in dir and closes it at cleanup.
func (e *testEnv) bootstrap(dir string, desc *shalev1.ShardDescriptor, dedupCap int) *Shard {
	e.t.Helper()
	s, err := Bootstrap(dir, initialState(desc), e.opts(dedupCap))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// open opens an existing shard and closes it at cleanup.
func (e *testEnv) open(dir string, dedupCap int) *Shard {
	e.t.Helper()
	s, err := Open(dir, e.opts(dedupCap))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// feeder numbers entries for a shard.
type feeder struct {
	index, term uint64
}

func newFeeder(s *Shard) *feeder {
	st := s.AppliedState()
	return &feeder{index: st.Index, term: st.Term}
}

func (f *feeder) entry(payload []byte) replication.Entry {
	f.index++
	return replication.Entry{Index: f.index, Term: f.term, Payload: payload}
}

func (f *feeder) confEntry(cc *replication.AppliedConfChange) replication.Entry {
	f.index++
	return replication.Entry{Index: f.index, Term: f.term, ConfChange: cc}
}

func marshalCmd(t testing.TB, cmd *shalev1.RaftCommand) []byte {
	t.Helper()
	b, err := proto.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func txnCmd(ts int64, txn *shalev1.TxnRequest) *shalev1.RaftCommand {
	return &shalev1.RaftCommand{TimestampUnixNanos: ts, Command: &shalev1.RaftCommand_Txn{Txn: txn}}
}

func putOp(k, v string, ttlMs int64, prev bool) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(k), Value: []byte(v), TtlMs: ttlMs, PrevKv: prev}}}
}

func delOp(k string, prev bool) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Delete{Delete: &shalev1.DeleteOp{Key: []byte(k), PrevKv: prev}}}
}

func delRangeOp(start, end string) *shalev1.RequestOp {
	op := &shalev1.DeleteRangeOp{StartKey: []byte(start)}
	if end != "" {
		op.EndKey = []byte(end)
	}
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: op}}
}

func getOp(k string) *shalev1.RequestOp {
	return &shalev1.RequestOp{Op: &shalev1.RequestOp_Get{Get: &shalev1.GetOp{Key: []byte(k)}}}
}

// applyOne applies one command and returns its result.
func applyOne(t testing.TB, s *Shard, f *feeder, cmd *shalev1.RaftCommand) *shalev1.CommandResult {
	t.Helper()
	res, err := results(s.Apply([]replication.Entry{f.entry(marshalCmd(t, cmd))}))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := res[0].(*shalev1.CommandResult)
	if r == nil {
		t.Fatalf("no command result: %v", res[0])
	}
	return r
}

// engineDump returns every engine key and value except the format record,
// for comparing whole states.
func engineDump(t testing.TB, s *Shard) map[string]string {
	t.Helper()
	v, err := s.view()
	if err != nil {
		t.Fatal(err)
	}
	defer v.release()
	out := map[string]string{}
	if err := hashSpan(v.snap, []byte{0}, []byte{0xff}, func(k, val []byte) {
		out[string(k)] = string(val)
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// rec is a stored user record in comparable form.
type rec struct {
	create, mod, version uint64
	expire               int64
	value                string
}

// dataDump decodes every stored user record (expired ones included).
func dataDump(t testing.TB, s *Shard) map[string]rec {
	t.Helper()
	out := map[string]rec{}
	for k, v := range engineDump(t, s) {
		if !isDataKey([]byte(k)) {
			continue
		}
		sv, err := decodeValue([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		out[k[1:]] = rec{sv.createRev, sv.modRev, sv.version, sv.expire, string(sv.value)}
	}
	return out
}

func sameAppliedState(t testing.TB, a, b replication.AppliedState) {
	t.Helper()
	if a.Index != b.Index || a.Term != b.Term {
		t.Fatalf("applied (%d, %d) != (%d, %d)", a.Index, a.Term, b.Index, b.Term)
	}
	if !proto.Equal(a.ConfState, b.ConfState) {
		t.Fatalf("conf state %v != %v", a.ConfState, b.ConfState)
	}
	if !proto.Equal(a.Descriptor, b.Descriptor) {
		t.Fatalf("descriptor %v != %v", a.Descriptor, b.Descriptor)
	}
}

func diffMaps[V comparable](a, b map[string]V) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if bv, ok := b[k]; !ok {
			out = append(out, fmt.Sprintf("only in first: %q=%v", k, a[k]))
		} else if bv != a[k] {
			out = append(out, fmt.Sprintf("%q: %v != %v", k, a[k], bv))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("only in second: %q=%v", k, b[k]))
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("... %d more", len(out)-10))
	}
	return fmt.Sprint(out)
}

// results returns an Apply call's results.
func results(ap replication.Applied, err error) ([]any, error) { return ap.Results, err }
