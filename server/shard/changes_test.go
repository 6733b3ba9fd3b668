package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/shale-db/shale/replication/hlc"
	"github.com/shale-db/shale/storage"
)

// changeLogBatch builds a WAL batch of one entry as a format 3 engine
// wrote it: a put of key "a", the given change-log records and the entry's
// mark.
func changeLogBatch(records ...[]byte) *storage.Batch {
	b := storage.NewBatch()
	b.Set(dataKey([]byte("a")), encodeValue(nil, &storedValue{createRev: 3, modRev: 5, version: 2, value: []byte("new")}))
	for _, r := range records {
		b.LogData(r)
	}
	b.LogData(appendMarkV1(nil, EntryMark{ShardID: 1, Index: 9, Term: 2, Revision: 5, HLC: hlc.Timestamp{WallNanos: 1}}))
	return b
}

// appendChangeItemV7 appends one change item of an entry record as formats
// 4 to 7 wrote it: the change kind (changePut, changeDelete), the user key
// of a delete and the key's previous stored value (appendPrev).
func appendChangeItemV7(b []byte, kind byte, userKey, prev []byte) []byte {
	b = append(b, kind)
	if kind != changePut {
		b = binary.AppendUvarint(b, uint64(len(userKey)))
		b = append(b, userKey...)
	}
	return appendPrev(b, prev)
}

// entryBatch builds a WAL batch of one entry as Apply writes it: a put of
// key "a" (when put), then the entry record holding items.
func entryBatch(put bool, items []byte) *storage.Batch {
	b := storage.NewBatch()
	if put {
		b.Set(dataKey([]byte("a")), encodeValue(nil, &storedValue{createRev: 3, modRev: 5, version: 2, value: []byte("new")}))
	}
	b.LogData(appendEntryRecord(nil, EntryMark{ShardID: 1, Index: 9, Term: 2, Revision: 5, HLC: hlc.Timestamp{WallNanos: 1}}, items))
	return b
}

// TestDecodeEntryRecord: an entry record's put items take their keys from
// the entry's Sets; one that does not match its entry's writes, or is
// damaged, is reported, never decoded into events. A format 3 entry and a
// format 4 one read in order.
func TestDecodeEntryRecord(t *testing.T) {
	prev := encodeValue(nil, &storedValue{createRev: 3, modRev: 4, version: 1, value: []byte("old")})
	items := appendChangeItemV7(appendChangeItemV7(nil, changePut, []byte("a"), prev), changeDelete, []byte("b"), prev)
	legacy := changeLogBatch(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), nil), 0))
	var got []*AppliedEntry
	for _, b := range []*storage.Batch{legacy, entryBatch(true, items)} {
		if err := DecodeBatch(b, func(e *AppliedEntry) error { got = append(got, e); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || len(got[0].Events) != 1 || got[0].Events[0].Prev != nil || string(got[0].Events[0].KV.GetKey()) != "a" {
		t.Fatalf("format 3 entry decoded as %+v", got)
	}
	ev := got[1].Events
	if len(ev) != 2 || ev[0].Kind != EventPut || string(ev[0].KV.GetKey()) != "a" || string(ev[0].KV.GetValue()) != "new" ||
		string(ev[0].Prev.GetKey()) != "a" || string(ev[0].Prev.GetValue()) != "old" || ev[0].Prev.GetModRevision() != 4 ||
		ev[1].Kind != EventDelete || string(ev[1].KV.GetKey()) != "b" || ev[1].KV.GetModRevision() != 5 || string(ev[1].Prev.GetValue()) != "old" {
		t.Fatalf("entry record decoded as %+v", ev)
	}
	if m := got[1].Mark; m.Index != 9 || m.Term != 2 || m.Revision != 5 || m.ShardID != 1 || m.HLC != (hlc.Timestamp{WallNanos: 1}) {
		t.Fatalf("mark %+v", m)
	}
	damaged := entryBatch(true, items)
	rec := damaged.Repr()
	rec[len(rec)-6] ^= 1 // inside the entry record's body
	twoPuts := appendChangeItemV7(appendChangeItemV7(nil, changePut, nil, nil), changePut, nil, nil)
	mixed := changeLogBatch(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), nil), 0))
	mixed.LogData(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), nil), 0))
	mixed.LogData(EntryMark{Index: 10}.Append(nil))
	for name, b := range map[string]*storage.Batch{
		"damaged":                       damaged,
		"a put without its write":       entryBatch(false, appendChangeItemV7(nil, changePut, nil, nil)),
		"two puts, one write":           entryBatch(true, twoPuts),
		"a write without its put":       entryBatch(true, appendChangeItemV7(nil, changeDelete, []byte("a"), nil)),
		"unknown change kind":           entryBatch(true, []byte{9, 0}),
		"truncated previous value":      entryBatch(true, []byte{changePut, 5, 1}),
		"a format 3 changes record too": mixed,
	} {
		if err := DecodeBatch(b, func(*AppliedEntry) error { return nil }); !errors.Is(err, ErrCorruptChangeLog) {
			t.Errorf("%s: %v, want ErrCorruptChangeLog", name, err)
		}
	}
}

// atSeq returns b with its first record at sequence number seq, as the
// WAL holds it.
func atSeq(t *testing.T, b *storage.Batch, seq uint64) *storage.Batch {
	t.Helper()
	repr := bytes.Clone(b.Repr())
	binary.LittleEndian.PutUint64(repr, seq)
	out := storage.NewBatch()
	if err := out.SetRepr(repr); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDecodeFormat8Items: format 8's items hold no previous values; each
// event says whether the key had one (PrevUnread) and carries the sequence
// number of its own write, counted over every write of the batch (metadata
// too): a put's Set, a delete's Delete, the range deletion that removed a
// key. A format 7 entry in the same log still decodes with its logged
// values, and items that do not match the entry's writes are reported.
func TestDecodeFormat8Items(t *testing.T) {
	stored := func(v string) []byte {
		return encodeValue(nil, &storedValue{createRev: 3, modRev: 5, version: 2, value: []byte(v)})
	}
	mark := EntryMark{ShardID: 1, Index: 9, Term: 2, Revision: 5, HLC: hlc.Timestamp{WallNanos: 1}}
	b := storage.NewBatch()
	b.Set(dataKey([]byte("a")), stored("a2"))                 // 100
	b.Set([]byte("mapplied"), []byte{1})                      // 101: not user data
	b.Delete(dataKey([]byte("b")))                            // 102
	b.Delete(dataKey([]byte("x")))                            // 103: an expired key's, no item
	b.DeleteRange(dataKey([]byte("c")), dataKey([]byte("e"))) // 104
	b.Set(dataKey([]byte("c1")), stored("c1 again"))          // 105
	b.Delete(dataKey([]byte("c1")))                           // 106
	var items []byte
	items = appendChangeItem(items, changePutOver, nil)
	items = appendChangeItem(items, changeDeleteOf, []byte("b"))
	items = appendChangeItem(items, changeDeleteOf, []byte("c1"))
	items = appendChangeItem(items, changeDeleteOf, []byte("c2"))
	items = appendChangeItem(items, changePutNew, nil)
	items = appendChangeItem(items, changeDeleteOf, []byte("c1"))
	b.LogData(appendEntryRecord(nil, mark, items))
	// A format 7 entry after it.
	b.Set(dataKey([]byte("f")), stored("f2"))
	mark.Index++
	b.LogData(appendEntryRecord(nil, mark, appendChangeItemV7(nil, changePut, nil, stored("f1"))))
	var got []*AppliedEntry
	if err := DecodeBatch(atSeq(t, b, 100), func(e *AppliedEntry) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, e := range got {
		for _, ev := range e.Events {
			evs = append(evs, fmt.Sprintf("%d:%s@%d unread=%v prev=%q", ev.Kind, ev.KV.GetKey(), ev.Seq, ev.PrevUnread, ev.Prev.GetValue()))
		}
	}
	want := []string{
		`1:a@100 unread=true prev=""`, `2:b@102 unread=true prev=""`, `2:c1@104 unread=true prev=""`, `2:c2@104 unread=true prev=""`,
		`1:c1@105 unread=false prev=""`, `2:c1@106 unread=true prev=""`, `1:f@107 unread=false prev="f1"`,
	}
	if !slices.Equal(evs, want) {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(evs, "\n"), strings.Join(want, "\n"))
	}
	put := func() *storage.Batch {
		b := storage.NewBatch()
		b.Set(dataKey([]byte("a")), stored("a2"))
		return b
	}
	for name, tc := range map[string]struct {
		b     *storage.Batch
		items []byte
	}{
		"a delete without its write":            {put(), appendChangeItem(appendChangeItem(nil, changePutNew, nil), changeDeleteOf, []byte("b"))},
		"a delete whose write is after a put's": {put(), appendChangeItem(appendChangeItem(nil, changeDeleteOf, []byte("a")), changePutOver, nil)},
		"a put without its write":               {storage.NewBatch(), appendChangeItem(nil, changePutOver, nil)},
		"a write without its put":               {put(), appendChangeItem(nil, changeDeleteOf, []byte("a"))},
	} {
		tc.b.LogData(appendEntryRecord(nil, mark, tc.items))
		if err := DecodeBatch(tc.b, func(*AppliedEntry) error { return nil }); !errors.Is(err, ErrCorruptChangeLog) {
			t.Errorf("%s: %v, want ErrCorruptChangeLog", name, err)
		}
	}
	keyed := changeLogBatch(sealRecord(append([]byte{logKindChanges}, changePutOver, 1, 'a'), 0))
	if err := DecodeBatch(keyed, func(*AppliedEntry) error { return nil }); !errors.Is(err, ErrCorruptChangeLog) {
		t.Errorf("a format 8 item in a format 3 changes record: %v, want ErrCorruptChangeLog", err)
	}
}

// TestDecodeBatchRejectsMismatch: a format 3 change log that does not
// match its entry's writes, or is damaged, is reported, never decoded into
// events.
func TestDecodeBatchRejectsMismatch(t *testing.T) {
	prev := encodeValue(nil, &storedValue{createRev: 3, modRev: 4, version: 1, value: []byte("old")})
	good := sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), prev), 0)
	var got []*AppliedEntry
	if err := DecodeBatch(changeLogBatch(good), func(e *AppliedEntry) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Events) != 1 || string(got[0].Events[0].KV.GetValue()) != "new" ||
		string(got[0].Events[0].Prev.GetValue()) != "old" || got[0].Events[0].Prev.GetModRevision() != 4 {
		t.Fatalf("decoded %+v", got)
	}
	damaged := append([]byte(nil), good...)
	damaged[3] ^= 1
	wrongKey := sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("b"), nil), 0)
	twoPuts := sealRecord(appendChange(appendChange([]byte{logKindChanges}, changePut, []byte("a"), nil), changePut, []byte("a"), nil), 0)
	noPut := sealRecord(appendChange([]byte{logKindChanges}, changeDelete, []byte("a"), prev), 0)
	for name, rec := range map[string][]byte{"damaged": damaged, "wrong key": wrongKey, "two puts, one write": twoPuts, "a write without its put": noPut} {
		err := DecodeBatch(changeLogBatch(rec), func(*AppliedEntry) error { return nil })
		if !errors.Is(err, ErrCorruptChangeLog) {
			t.Errorf("%s: %v, want ErrCorruptChangeLog", name, err)
		}
	}
}

// FuzzDecodeBatch: any change-log and range record, and any entry
// record's change items, decodes or fails with an error; none panics.
func FuzzDecodeBatch(f *testing.F) {
	prev := encodeValue(nil, &storedValue{createRev: 1, modRev: 1, version: 1, value: []byte("x")})
	f.Add(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), prev), 0), []byte{logKindRange})
	f.Add(sealRecord(appendChange([]byte{logKindChanges}, changeDelete, []byte("z"), nil), 0), sealRecord([]byte{logKindRange, 0x08, 0x01}, 0))
	f.Add(appendChangeItemV7(appendChangeItemV7(nil, changePut, nil, prev), changeDelete, []byte("z"), prev), []byte(nil))
	f.Add(appendChangeItem(appendChangeItem(nil, changePutOver, nil), changeDeleteOf, []byte("z")), []byte(nil))
	f.Fuzz(func(t *testing.T, changes, rng []byte) {
		for _, put := range []bool{true, false} {
			err := DecodeBatch(entryBatch(put, changes), func(*AppliedEntry) error { return nil })
			if err != nil && !errors.Is(err, ErrCorruptChangeLog) {
				t.Fatalf("entry record of items %x: %v, want ErrCorruptChangeLog", changes, err)
			}
		}
		var recs [][]byte
		if len(changes) > 0 {
			recs = append(recs, append([]byte{logKindChanges}, changes[1:]...))
		}
		if len(rng) > 0 {
			recs = append(recs, append([]byte{logKindRange}, rng[1:]...))
		}
		_ = DecodeBatch(changeLogBatch(recs...), func(*AppliedEntry) error { return nil })
		// Sealed, so that the checksum passes and the body is parsed.
		for i, r := range recs {
			recs[i] = sealRecord(r, 0)
		}
		_ = DecodeBatch(changeLogBatch(recs...), func(*AppliedEntry) error { return nil })
	})
}

// FuzzDecodeAbsorbed: the absorbed-ranges record decodes or fails with
// ErrCorrupt; what decodes encodes back to the same bytes.
func FuzzDecodeAbsorbed(f *testing.F) {
	f.Add(encodeAbsorbed([]absorbedRange{{start: []byte("m"), rev: 7}, {start: []byte("a"), end: []byte("c"), rev: 9}}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		list, err := decodeAbsorbed(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not match ErrCorrupt", err)
			}
			return
		}
		if again := encodeAbsorbed(list); len(b) > 0 && !bytes.Equal(again, b) {
			// Non-minimal uvarints decode too; the list must survive a round trip.
			back, err := decodeAbsorbed(again)
			if err != nil || len(back) != len(list) {
				t.Fatalf("round trip of %x: %v, %d ranges, want %d", b, err, len(back), len(list))
			}
		}
	})
}
