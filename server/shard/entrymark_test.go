package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/hlc"
	"github.com/shale-db/shale/storage"
)

// oldestUpdates iterates over what is left of the shard engine's WAL.
func oldestUpdates(t *testing.T, s *Shard) *storage.UpdatesIterator {
	t.Helper()
	it, err := s.db.UpdatesSince(0)
	var gone *storage.UpdatesUnavailableError
	if errors.As(err, &gone) {
		it, err = s.db.UpdatesSince(gone.Earliest)
	}
	if err != nil {
		t.Fatal(err)
	}
	return it
}

// walMarks reads the shard engine's WAL (what is left of it) and returns
// its entry marks, in order, with the user keys each one's entry put.
func walMarks(t *testing.T, s *Shard) ([]EntryMark, [][]string) {
	t.Helper()
	it := oldestUpdates(t, s)
	defer it.Close()
	var marks []EntryMark
	var puts [][]string
	var pending []string
	for it.Next() {
		r := it.Batch().Reader()
		for {
			kind, key, _, ok := r.Next()
			if !ok {
				break
			}
			switch kind {
			case storage.KindLogData:
				if key[0] != logKindEntry && key[0] != logKindMark {
					continue
				}
				m, err := DecodeEntryMark(key)
				if err != nil {
					t.Fatalf("LogData in the shard's WAL is not an entry mark: %v", err)
				}
				marks, puts, pending = append(marks, m), append(puts, pending), nil
			case storage.KindSet:
				if len(key) > 0 && key[0] == prefixData {
					pending = append(pending, string(key[1:]))
				}
			}
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	if len(pending) > 0 {
		t.Fatalf("writes %q after the last entry mark", pending)
	}
	return marks, puts
}

// walEntries decodes the entries left in the shard engine's WAL, in order,
// with their events' previous values (read from the engine where the log
// does not hold them).
func walEntries(t *testing.T, s *Shard) []*AppliedEntry {
	t.Helper()
	r, err := s.ReadOldestChanges()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []*AppliedEntry
	for r.Next() {
		if err := DecodeBatch(r.Batch(), func(e *AppliedEntry) error {
			for i := range e.Events {
				if err := r.ReadPrev(&e.Events[i]); err != nil {
					return err
				}
			}
			out = append(out, e)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Error(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEntryMarks: every applied entry is followed in the WAL by a mark
// with its shard, index, term, revision and date; dates follow the
// proposers' clocks but never go back, and entries without a reading (a
// no-op, a configuration change) are dated just after their predecessor.
func TestEntryMarks(t *testing.T) {
	e := newTestEnv(t, nil)
	s := e.bootstrap("/s", userDesc(7, "", ""), 0)
	f := newFeeder(s)
	at := func(wall int64) *shalev1.HlcTimestamp { return &shalev1.HlcTimestamp{WallNanos: wall} }
	dated := func(wall int64, cmd *shalev1.RaftCommand) *shalev1.RaftCommand { cmd.Hlc = at(wall); return cmd }
	put := func(k string) *shalev1.RaftCommand {
		return txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(k, "v", 0, false)}})
	}
	ents := []replication.Entry{
		f.entry(marshalCmd(t, dated(1000, put("a")))),
		f.entry(marshalCmd(t, dated(900, put("b")))), // a new leader's clock behind
		f.entry(nil), // an empty entry of a new term
		f.entry(marshalCmd(t, dated(2000, put("c")))),
		f.entry(marshalCmd(t, put("d"))), // no reading
		f.confEntry(&replication.AppliedConfChange{
			Change:    &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(3)}}},
			ConfState: &raftpb.ConfState{Voters: []uint64{1, 2}},
		}),
	}
	if _, err := s.Apply(ents[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ents[2:]); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		hlc  hlc.Timestamp
		rev  uint64
		puts []string
	}{
		{hlc.Timestamp{WallNanos: 1000}, 1, []string{"a"}},
		{hlc.Timestamp{WallNanos: 1000, Logical: 1}, 2, []string{"b"}},
		{hlc.Timestamp{WallNanos: 1000, Logical: 2}, 2, nil},
		{hlc.Timestamp{WallNanos: 2000}, 3, []string{"c"}},
		{hlc.Timestamp{WallNanos: 2000, Logical: 1}, 4, []string{"d"}},
		{hlc.Timestamp{WallNanos: 2000, Logical: 2}, 4, nil},
	}
	marks, puts := walMarks(t, s)
	if len(marks) != len(want) {
		t.Fatalf("%d entry marks in the WAL for %d entries: %+v", len(marks), len(want), marks)
	}
	for i, m := range marks {
		w := want[i]
		if m.ShardID != 7 || m.Index != ents[i].Index || m.Term != ents[i].Term || m.HLC != w.hlc || m.Revision != w.rev {
			t.Errorf("mark %d = %+v, want shard 7, index %d, term %d, date %v, revision %d", i, m, ents[i].Index, ents[i].Term, w.hlc, w.rev)
		}
		if !slices.Equal(puts[i], w.puts) {
			t.Errorf("entry %d's writes before its mark: %q, want %q", ents[i].Index, puts[i], w.puts)
		}
	}
	// The last date survives a restart, so the next entry is dated after it.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = e.open("/s", 0)
	if _, err := s.Apply([]replication.Entry{f.entry(marshalCmd(t, dated(1500, put("e"))))}); err != nil {
		t.Fatal(err)
	}
	marks, _ = walMarks(t, s)
	if got, want := marks[len(marks)-1].HLC, (hlc.Timestamp{WallNanos: 2000, Logical: 3}); got != want {
		t.Errorf("after a restart, an entry proposed at 1500 is dated %v, want %v", got, want)
	}
}

// appendMarkV1 appends a format 3 mark (the version byte, shard ID,
// index, term and revision as uvarints, the 12-byte date and a CRC-32C), as
// engines of format 3 wrote them after each entry's changes record.
func appendMarkV1(b []byte, m EntryMark) []byte {
	start := len(b)
	b = append(b, entryMarkVersion)
	for _, v := range []uint64{m.ShardID, m.Index, m.Term, m.Revision} {
		b = binary.AppendUvarint(b, v)
	}
	return sealRecord(m.HLC.Append(b), start)
}

// FuzzDecodeEntryMark: the decoder never panics, accepts only entry
// records and format 3 marks (anything else matches ErrNotEntryMark), and
// what it accepts encodes back to the same bytes.
func FuzzDecodeEntryMark(f *testing.F) {
	m := EntryMark{ShardID: 7, Index: 11, Term: 5, HLC: hlc.Timestamp{WallNanos: 1 << 60, Logical: 3}, Revision: 9}
	f.Add(m.Append(nil))
	f.Add(appendEntryRecord(nil, m, appendChangeItemV7(appendChangeItemV7(nil, changePut, []byte("k"), []byte("old")), changeDelete, []byte("j"), nil)))
	f.Add(appendMarkV1(nil, m))
	f.Add(EntryMark{}.Append(nil))
	f.Add([]byte{1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeEntryMark(b)
		if err != nil {
			if !errors.Is(err, ErrNotEntryMark) {
				t.Fatalf("error %v does not match ErrNotEntryMark", err)
			}
			return
		}
		again := appendMarkV1(nil, m)
		if b[0] == logKindEntry {
			dm, changes, err := decodeEntryRecord(b)
			if err != nil || dm != m {
				t.Fatalf("decodeEntryRecord(%x) = %+v, %v; DecodeEntryMark gave %+v", b, dm, err, m)
			}
			again = appendEntryRecord(nil, m, changes)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v re-encodes as %x, not %x", m, again, b)
		}
	})
}
