package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
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
			if strings.HasPrefix(k, string(dedupPrefix)) {
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
	legacyDedup(t, s, b)
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
	legacyDedup(t, s, b)
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
	f.Add([]byte{formatVersion}, st.appliedRecord(nil), st.confBytes, st.descBytes, []byte(nil), []byte(nil), []byte(nil))
	f.Add([]byte{formatVersion}, st.appliedRecord(nil), st.confBytes, st.descBytes, []byte(nil), []byte(nil), []byte{3})
	f.Add([]byte{2}, fixedAppliedRecord(st), st.confBytes, st.descBytes, []byte(nil), []byte(nil), []byte(nil))
	var legacy [16]byte
	binary.BigEndian.PutUint64(legacy[:8], 12)
	binary.BigEndian.PutUint64(legacy[8:], 3)
	f.Add([]byte{1}, legacy[:], st.confBytes, st.descBytes, binary.BigEndian.AppendUint64(nil, 7), append(binary.BigEndian.AppendUint64(nil, 1), binary.BigEndian.AppendUint64(nil, 4)...), []byte(nil))
	f.Fuzz(func(t *testing.T, format, applied, conf, desc, rev, bounds, legacyEnd []byte) {
		g := mapGetter{string(keyFormat): format, string(keyApplied): applied, string(keyConfState): conf,
			string(keyDescriptor): desc, string(keyRevision): rev, string(keyDedupBounds): bounds}
		if legacyEnd != nil {
			g[string(keyDedupLegacyEnd)] = legacyEnd
		}
		got, found, err := loadState(g)
		if err != nil || !found {
			return
		}
		if got.dedupOldest > got.dedupNext || got.dedupLegacyEnd > got.dedupNext {
			t.Fatalf("accepted dedup bounds [%d, %d), legacy bound %d", got.dedupOldest, got.dedupNext, got.dedupLegacyEnd)
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
	entry := binary.AppendUvarint(nil, 0) // sequence 0
	legacyEntry := binary.BigEndian.AppendUint64(nil, 0)
	id := []byte("request-00000001")
	if d, _ := f.Filter(0, dedupKey(id), entry); d != storage.FilterKeep {
		t.Fatalf("before the state is loaded: %v, want keep", d)
	}
	st := &state{dedupOldest: 5}
	s.publish(st)
	if d, _ := f.Filter(0, dedupKey(id), entry); d != storage.FilterRemove {
		t.Fatalf("an entry below the oldest live sequence: %v, want remove", d)
	}
	if d, _ := f.Filter(0, legacyDedupKey(id), legacyEntry); d != storage.FilterRemove {
		t.Fatalf("a format 5 entry below the oldest live sequence: %v, want remove", d)
	}
	if d, _ := f.Filter(0, legacyDedupKey(id), binary.BigEndian.AppendUint64(nil, 5)); d != storage.FilterKeep {
		t.Fatalf("a live format 5 entry: %v, want keep", d)
	}
	if d, _ := f.Filter(0, dataKey([]byte("k")), entry); d != storage.FilterKeep {
		t.Fatalf("a data record: %v, want keep", d)
	}
}

// legacyDedup stages in b the rewrite of s's dedup table as formats 1 to
// 5 kept it: each entry under legacyDedupPrefix, its sequence 8 bytes
// big-endian, and no legacy bound record.
func legacyDedup(t *testing.T, s *Shard, b *storage.Batch) {
	t.Helper()
	for k, v := range engineDump(t, s) {
		if !strings.HasPrefix(k, string(dedupPrefix)) {
			continue
		}
		seq, res, ok := splitDedupEntry([]byte(v), false)
		if !ok {
			t.Fatalf("dedup entry %q of %d bytes", k, len(v))
		}
		b.Delete([]byte(k))
		b.Set(legacyDedupKey([]byte(k[len(dedupPrefix):])), append(binary.BigEndian.AppendUint64(nil, seq), res...))
	}
	b.Delete(keyDedupLegacyEnd)
}

// TestFormat5EngineMovesToFormat6: an engine whose dedup table is in
// format 5's layout ("dedup-id/" keys, 8-byte sequences) opens, answers
// retries from that table before and after its next write moves it to
// format 6 (and after a reopen), evicts the old entries in insertion order
// with the new ones, and deletes them, with the legacy bound, once the last
// is evicted. A binary of format 5 refuses the format 6 engine as any
// older binary refuses a newer format.
func TestFormat5EngineMovesToFormat6(t *testing.T) {
	env := newTestEnv(t, nil)
	const capacity = 4
	s := env.bootstrap("a", userDesc(1, "", ""), capacity)
	f := newFeeder(s)
	put := func(id string, first bool) *shalev1.CommandResult {
		cmd := withID(id, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", id, 0, true)}}))
		cmd.FirstAttempt = first
		return applyOne(t, s, f, cmd)
	}
	retry := func(id string, want *shalev1.CommandResult) {
		t.Helper()
		rev := s.Revision()
		if got := put(id, false); !proto.Equal(got, want) || s.Revision() != rev {
			t.Fatalf("retry of %s: %v at revision %d, want %v at %d (applied once)", id, got, s.Revision(), want, rev)
		}
	}
	reopen := func() {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = env.open("a", capacity)
	}
	legacyKeys := func() (n int) {
		for k := range engineDump(t, s) {
			if strings.HasPrefix(k, string(legacyDedupPrefix)) {
				n++
			}
		}
		return n
	}
	results := map[string]*shalev1.CommandResult{}
	for _, id := range []string{"req-1", "req-2", "req-3"} {
		results[id] = put(id, true)
	}
	b := storage.NewBatch()
	b.Set(keyFormat, []byte{5})
	legacyDedup(t, s, b)
	if err := s.db.Apply(b, storage.Sync); err != nil {
		t.Fatal(err)
	}
	reopen()
	if got := s.st.Load(); got.format != 5 || got.dedupLegacyEnd != 3 || got.dedupNext != 3 {
		t.Fatalf("format 5 engine read as format %d, legacy bound %d, next %d; want 5, 3, 3", got.format, got.dedupLegacyEnd, got.dedupNext)
	}
	if n := legacyKeys(); n != 3 {
		t.Fatalf("%d format 5 dedup entries, want 3", n)
	}
	retry("req-1", results["req-1"])
	if got, ok, err := s.StoredResult([]byte("req-2")); err != nil || !ok || !proto.Equal(got, results["req-2"]) {
		t.Fatalf("StoredResult of a format 5 entry: %v %v %v", got, ok, err)
	}
	var scanned []string
	if err := s.ScanDedup(func(id, res []byte) error {
		scanned = append(scanned, string(id))
		return nil
	}); err != nil || !slices.Equal(scanned, []string{"req-1", "req-2", "req-3"}) {
		t.Fatalf("ScanDedup of a format 5 table: %q %v", scanned, err)
	}

	// The next write moves the engine to format 6; the old entries stay.
	results["req-4"] = put("req-4", true)
	dump := engineDump(t, s)
	if dump[string(keyFormat)] != string([]byte{formatVersion}) || dump[string(keyDedupLegacyEnd)] != "\x03" {
		t.Fatalf("after a write: format %x, legacy bound %x", dump[string(keyFormat)], dump[string(keyDedupLegacyEnd)])
	}
	if _, ok := dump[string(dedupKey([]byte("req-4")))]; !ok {
		t.Fatal("the new entry is not under the format 6 prefix")
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"req-1", "req-2", "req-3", "req-4"}) {
		t.Fatalf("dedup table after the move %q", ids)
	}
	scanned = nil
	if err := s.ScanDedup(func(id, res []byte) error {
		scanned = append(scanned, string(id))
		return nil
	}); err != nil || !slices.Equal(scanned, []string{"req-1", "req-2", "req-3", "req-4"}) {
		t.Fatalf("ScanDedup of a mixed table: %q %v", scanned, err)
	}
	reopen()
	if got := s.st.Load(); got.format != formatVersion || got.dedupLegacyEnd != 3 {
		t.Fatalf("after a reopen: format %d, legacy bound %d; want %d, 3", got.format, got.dedupLegacyEnd, formatVersion)
	}
	retry("req-2", results["req-2"])
	retry("req-4", results["req-4"])

	// Evictions take the old entries first, in their order.
	put("req-5", true)
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"req-2", "req-3", "req-4", "req-5"}) {
		t.Fatalf("dedup table after an eviction %q", ids)
	}
	if got, ok, err := s.StoredResult([]byte("req-1")); err != nil || ok {
		t.Fatalf("StoredResult of an evicted format 5 entry: %v %v %v", got, ok, err)
	}
	if n := legacyKeys(); n != 3 {
		t.Fatalf("%d format 5 dedup entries while two are live, want 3 (eviction writes nothing)", n)
	}
	put("req-6", true)
	put("req-7", true)
	dump = engineDump(t, s)
	if _, ok := dump[string(keyDedupLegacyEnd)]; ok || legacyKeys() != 0 || s.st.Load().dedupLegacyEnd != 0 {
		t.Fatalf("after the last format 5 entry's eviction: legacy bound record %x, %d entries, bound %d; want none",
			dump[string(keyDedupLegacyEnd)], legacyKeys(), s.st.Load().dedupLegacyEnd)
	}
	if ids := dedupIDs(t, s); !slices.Equal(ids, []string{"req-4", "req-5", "req-6", "req-7"}) {
		t.Fatalf("dedup table after the old entries' eviction %q", ids)
	}
	retry("req-4", results["req-4"])
	reopen()
	if got := s.st.Load(); got.dedupLegacyEnd != 0 {
		t.Fatalf("legacy bound %d after a reopen, want 0", got.dedupLegacyEnd)
	}

	// An older binary refuses a newer format; so this one refuses format 7.
	g := mapGetter{}
	for k, v := range engineDump(t, s) {
		g[k] = []byte(v)
	}
	g[string(keyFormat)] = []byte{formatVersion + 1}
	if _, _, err := loadState(g); err == nil || !strings.Contains(err.Error(), "unsupported metadata format") {
		t.Fatalf("an engine of format %d: %v, want it refused", formatVersion+1, err)
	}
}

// FuzzDedupEntry decodes arbitrary dedup entries of either layout: the
// decoder fails cleanly or yields a result, never panics, and an entry the
// encoder wrote decodes to its sequence and result.
func FuzzDedupEntry(f *testing.F) {
	res := &shalev1.CommandResult{Txn: &shalev1.TxnResponse{Succeeded: true, Header: &shalev1.ResponseHeader{Revision: 9}}}
	enc, err := appendDedupEntry(nil, 300, res)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(enc, false, uint64(300))
	f.Add(enc, true, uint64(0))
	f.Add([]byte{0x80}, false, uint64(1))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, false, uint64(0))
	f.Fuzz(func(t *testing.T, raw []byte, legacy bool, seq uint64) {
		if got, ok, err := decodeDedupEntry([]byte("id"), raw, 0, legacy); err == nil && ok && got == nil {
			t.Fatal("a live entry without a result")
		} else if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v does not match ErrCorrupt", err)
		}
		r := &shalev1.CommandResult{ErrorCode: uint32(len(raw)), Txn: &shalev1.TxnResponse{Header: &shalev1.ResponseHeader{Revision: seq >> 1}}}
		e, err := appendDedupEntry(nil, seq, r)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok, err := decodeDedupEntry([]byte("id"), e, seq, false); err != nil || !ok || !proto.Equal(got, r) {
			t.Fatalf("entry of sequence %d read back as %v %v %v", seq, got, ok, err)
		}
		if seq < math.MaxUint64 {
			if _, ok, err := decodeDedupEntry([]byte("id"), e, seq+1, false); err != nil || ok {
				t.Fatalf("entry of sequence %d live above it: %v %v", seq, ok, err)
			}
		}
	})
}

// TestFormat8WithItsFirstEntry: an engine moves to format 8 in the batch of
// the first entry this binary applies to it, so a change item without its
// previous value (which a format 7 binary could not decode) is never in an
// engine marked format 7, and a format 7 binary, which refuses formats
// above its own, refuses the engine from then on. The entry written before
// (format 7's item, with its value) still decodes, with the value it logged.
func TestFormat8WithItsFirstEntry(t *testing.T) {
	env := newTestEnv(t, nil)
	env.keepWAL = true
	s := env.bootstrap("a", userDesc(1, "", ""), 0)
	f := newFeeder(s)
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v1", 0, false)}}))
	// What a format 7 binary left: the engine marked 7, and an entry whose
	// item holds the value it replaced.
	old := encodeValue(nil, &storedValue{createRev: 1, modRev: 1, version: 1, value: []byte("v1")})
	b := storage.NewBatch()
	b.Set(keyFormat, []byte{7})
	b.Set(dataKey([]byte("k")), encodeValue(nil, &storedValue{createRev: 1, modRev: 2, version: 2, value: []byte("v2")}))
	f.index++
	b.LogData(appendEntryRecord(nil, EntryMark{ShardID: 1, Index: f.index, Term: f.term, Revision: 2}, appendChangeItemV7(nil, changePut, nil, old)))
	b.Set(keyApplied, (&state{index: f.index, term: f.term, rev: 2}).appliedRecord(nil))
	if err := s.db.Apply(b, storage.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = env.open("a", 0)
	if got := s.st.Load().format; got != 7 {
		t.Fatalf("reopened as format %d, want 7", got)
	}
	applyOne(t, s, f, txnCmd(ts0, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp("k", "v3", 0, false)}}))
	if dump := engineDump(t, s); dump[string(keyFormat)] != string([]byte{8}) || formatVersion != 8 {
		t.Fatalf("after a write: format %x, this binary's %d", dump[string(keyFormat)], formatVersion)
	}
	it := oldestUpdates(t, s)
	defer it.Close()
	found := false
	for it.Next() {
		var format []byte
		var unread bool
		r := it.Batch().Reader()
		for {
			kind, key, value, ok := r.Next()
			if !ok {
				break
			}
			if kind == storage.KindSet && bytes.Equal(key, keyFormat) {
				format = value
			}
		}
		if err := DecodeBatch(it.Batch(), func(e *AppliedEntry) error {
			for _, ev := range e.Events {
				unread = unread || ev.PrevUnread
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if unread {
			found = true
			if !bytes.Equal(format, []byte{8}) {
				t.Fatalf("a format 8 item in a batch that sets the format to %x", format)
			}
		}
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatal("no format 8 item in the WAL")
	}
	var prevs []string
	for _, e := range walEntries(t, s) {
		for _, ev := range e.Events {
			prevs = append(prevs, string(ev.Prev.GetValue()))
		}
	}
	if want := []string{"", "v1", "v2"}; !slices.Equal(prevs, want) {
		t.Fatalf("previous values %q, want %q (format 7's logged, format 8's read from the engine)", prevs, want)
	}
}
