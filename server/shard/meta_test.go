package shard

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/storage"
)

// TestEvictedDedupEntriesCompactedAway: evicting writes nothing, and the
// engine's compactions drop what the table evicted, so the table's space
// stays bounded by its capacity.
func TestEvictedDedupEntriesCompactedAway(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 3)
	f := newFeeder(s)
	for i := range 50 {
		id := "id-" + string(rune('A'+i/26)) + string(rune('a'+i%26))
		applyOne(t, s, f, withID(id, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", id, 0, false)}})))
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"id-Bv", "id-Bw", "id-Bx"}) {
		t.Fatalf("live entries %q", ids)
	}
	physical := func() int {
		n := 0
		for k := range engineDump(t, s) {
			if strings.HasPrefix(k, string(dedupIDPrefix)) {
				n++
			}
		}
		return n
	}
	if n := physical(); n != 50 {
		t.Fatalf("%d dedup records before a compaction, want all 50 (eviction writes nothing)", n)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.db.CompactRange([]byte{0}, []byte{0xff}); err != nil {
		t.Fatal(err)
	}
	if n := physical(); n != 3 {
		t.Fatalf("%d dedup records after a compaction, want the 3 live ones", n)
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"id-Bv", "id-Bw", "id-Bx"}) {
		t.Fatalf("live entries after a compaction %q", ids)
	}
}

// TestFormat1EngineMovesToFormat2: an engine written by the previous
// layout (the applied index alone under keyApplied; revision, dedup bounds
// and date apart; an eviction record per dedup entry) opens with the same
// state, answers a retry from its table, and moves to the new layout at its
// next write, leaving nothing of the old one.
func TestFormat1EngineMovesToFormat2(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	put := func(id, v string) *shalev1.CommandResult {
		return applyOne(t, s, f, withID(id, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", v, 0, true)}})))
	}
	first := put("req-000000000001", "1")
	put("req-000000000002", "2")
	st := s.st.Load()
	// Rewrite the metadata as format 1 had it.
	b := storage.NewBatch()
	b.Set(keyFormat, []byte{1})
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], st.index)
	binary.BigEndian.PutUint64(buf[8:], st.term)
	b.Set(keyApplied, buf[:])
	b.Set(keyRevision, binary.BigEndian.AppendUint64(nil, st.rev))
	binary.BigEndian.PutUint64(buf[:8], st.dedupOldest)
	binary.BigEndian.PutUint64(buf[8:], st.dedupNext)
	b.Set(keyDedupBounds, buf[:])
	b.Set(keyHLC, st.hlc.Append(nil))
	b.Set(dedupSeqKey(0), []byte("req-000000000001"))
	b.Set(dedupSeqKey(1), []byte("req-000000000002"))
	if err := s.db.Apply(b, storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	got := s.st.Load()
	if !got.legacy || got.index != st.index || got.rev != st.rev || got.dedupNext != st.dedupNext || got.hlc != st.hlc {
		t.Fatalf("format 1 state read as %+v, want %+v", got, st)
	}
	v, err := s.view()
	if err != nil {
		t.Fatal(err)
	}
	rev, err := v.revision()
	v.release()
	if err != nil || rev != st.rev {
		t.Fatalf("revision read from a format 1 engine: %d %v, want %d", rev, err, st.rev)
	}
	// A retry is answered from the table; then a new write moves the
	// engine to format 2.
	if r := put("req-000000000001", "1"); !proto.Equal(r, first) {
		t.Fatalf("retry on a format 1 engine: %v, want %v", r, first)
	}
	put("req-000000000003", "3")
	dump := engineDump(t, s)
	if a := dump[string(keyApplied)]; dump[string(keyFormat)] != string([]byte{formatVersion}) || len(a) == 0 || a[0] != compactAppliedTag {
		t.Fatalf("after a write: format %x, applied record %x", dump[string(keyFormat)], a)
	}
	for _, k := range [][]byte{keyRevision, keyDedupBounds, keyHLC} {
		if _, ok := dump[string(k)]; ok {
			t.Errorf("format 1 record %q remains", k)
		}
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"req-000000000001", "req-000000000002", "req-000000000003"}) {
		t.Fatalf("dedup table after the move %q", ids)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	if got := s.st.Load(); got.legacy || got.rev != st.rev+1 || got.dedupNext != st.dedupNext+1 {
		t.Fatalf("format %d state after reopen %+v", formatVersion, got)
	}
}

// fixedAppliedRecord is st's applied record as format 2 wrote it: index,
// term, revision and dedup bounds 8 bytes big-endian each, then the date.
func fixedAppliedRecord(st *state) []byte {
	b := binary.BigEndian.AppendUint64(nil, st.index)
	for _, v := range []uint64{st.term, st.rev, st.dedupOldest, st.dedupNext} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return st.hlc.Append(b)
}

// TestFormat2EngineMovesToCurrentFormat: an engine whose applied record
// has format 2's fixed 52 bytes opens with the same state, and its next
// write stores the compact record and the current format; the state
// survives a reopen.
func TestFormat2EngineMovesToCurrentFormat(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	put := func(id, v string) *shalev1.CommandResult {
		return applyOne(t, s, f, withID(id, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", v, 0, true)}})))
	}
	first := put("req-000000000001", "1")
	st := s.st.Load()
	fixed := fixedAppliedRecord(st)
	b := storage.NewBatch()
	b.Set(keyFormat, []byte{2})
	b.Set(keyApplied, fixed)
	if err := s.db.Apply(b, storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	got := s.st.Load()
	if got.format != 2 || got.index != st.index || got.term != st.term || got.rev != st.rev ||
		got.dedupOldest != st.dedupOldest || got.dedupNext != st.dedupNext || got.hlc != st.hlc {
		t.Fatalf("format 2 state read as %+v, want %+v", got, st)
	}
	if r := put("req-000000000001", "1"); !proto.Equal(r, first) {
		t.Fatalf("retry on a format 2 engine: %v, want %v", r, first)
	}
	put("req-000000000002", "2")
	dump := engineDump(t, s)
	a := dump[string(keyApplied)]
	if dump[string(keyFormat)] != string([]byte{formatVersion}) || len(a) == 0 || a[0] != compactAppliedTag || len(a) >= fixedAppliedRecordLen {
		t.Fatalf("after a write: format %x, applied record %x", dump[string(keyFormat)], a)
	}
	want := s.st.Load()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	if got := s.st.Load(); got.format != formatVersion || got.index != want.index || got.rev != want.rev || got.hlc != want.hlc || got.dedupNext != want.dedupNext {
		t.Fatalf("format %d state after reopen %+v, want %+v", formatVersion, got, want)
	}
}

// TestApplyWritesOnlyChangedMeta: an Apply of puts writes the applied
// record and nothing else of the metadata; one that changes the
// configuration writes it too.
func TestApplyWritesOnlyChangedMeta(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	old := s.st.Load()
	ns := *old
	ns.index++
	b := storage.NewBatch()
	ns.writeMeta(b, old)
	if b.Count() != 1 {
		t.Fatalf("metadata records of an unchanged configuration: %d, want 1 (the applied record)", b.Count())
	}
	d := proto.CloneOf(old.desc)
	d.Epoch++
	if err := ns.setDesc(d); err != nil {
		t.Fatal(err)
	}
	b = storage.NewBatch()
	ns.writeMeta(b, old)
	if b.Count() != 2 {
		t.Fatalf("metadata records with a new descriptor: %d, want 2", b.Count())
	}
}

// mapGetter is a getter over a map (a fuzzed engine's metadata).
type mapGetter map[string][]byte

func (m mapGetter) Get(k []byte) ([]byte, error) {
	if v, ok := m[string(k)]; ok {
		return v, nil
	}
	return nil, storage.ErrNotFound
}

// FuzzLoadState feeds arbitrary metadata records (either format) to the
// decoder of a shard's applied state: it must fail cleanly or yield a state
// whose dedup bounds are ordered, never panic; readApplied must agree with
// it.
func FuzzLoadState(f *testing.F) {
	st := &state{index: 12, term: 3, rev: 7, dedupOldest: 1, dedupNext: 4}
	_ = st.setConf(&raftpb.ConfState{Voters: []uint64{1, 2, 3}})
	_ = st.setDesc(userDesc(1, "a", "m"))
	f.Add([]byte{formatVersion}, st.appliedRecord(nil), st.confBytes, st.descBytes, []byte(nil), []byte(nil))
	f.Add([]byte{2}, fixedAppliedRecord(st), st.confBytes, st.descBytes, []byte(nil), []byte(nil))
	var legacy [16]byte
	binary.BigEndian.PutUint64(legacy[:8], 12)
	binary.BigEndian.PutUint64(legacy[8:], 3)
	f.Add([]byte{1}, legacy[:], st.confBytes, st.descBytes, binary.BigEndian.AppendUint64(nil, 7), append(binary.BigEndian.AppendUint64(nil, 1), binary.BigEndian.AppendUint64(nil, 4)...))
	f.Fuzz(func(t *testing.T, format, applied, conf, desc, rev, bounds []byte) {
		g := mapGetter{string(keyFormat): format, string(keyApplied): applied, string(keyConfState): conf,
			string(keyDescriptor): desc, string(keyRevision): rev, string(keyDedupBounds): bounds}
		got, found, err := loadState(g)
		if err != nil || !found {
			return
		}
		if got.dedupOldest > got.dedupNext {
			t.Fatalf("accepted dedup bounds [%d, %d)", got.dedupOldest, got.dedupNext)
		}
		ai, err := readApplied(g)
		if err != nil || ai.index != got.index || ai.rev != got.rev || ai.dedupOldest != got.dedupOldest {
			t.Fatalf("readApplied %+v %v, loadState %+v", ai, err, got)
		}
	})
}

// TestDedupFilterBeforeStateLoaded: the engine's compactions may run while
// it opens, before the shard's state is loaded (a recovery's flush, the L0
// compactions an open starts): the dedup filter then drops nothing. Found
// in CI, where a node restarting read a state not loaded yet (nil).
func TestDedupFilterBeforeStateLoaded(t *testing.T) {
	env := newTestEnv(t, nil)
	s := newShard("a", env.opts(3))
	f := s.engOpts.CompactionFilter
	entry := binary.BigEndian.AppendUint64(nil, 0) // sequence 0
	if d, _ := f.Filter(0, dedupIDKey([]byte("request-00000001")), entry); d != storage.FilterKeep {
		t.Fatalf("before the state is loaded: %v, want keep", d)
	}
	st := &state{dedupOldest: 5}
	s.publish(st)
	if d, _ := f.Filter(0, dedupIDKey([]byte("request-00000001")), entry); d != storage.FilterRemove {
		t.Fatalf("an entry below the oldest live sequence: %v, want remove", d)
	}
	if d, _ := f.Filter(0, dataKey([]byte("k")), entry); d != storage.FilterKeep {
		t.Fatalf("a data record: %v, want keep", d)
	}
}
