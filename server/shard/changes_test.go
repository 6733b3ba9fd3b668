package shard

import (
	"bytes"
	"errors"
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
	items := appendChangeItem(appendChangeItem(nil, changePut, []byte("a"), prev), changeDelete, []byte("b"), prev)
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
	twoPuts := appendChangeItem(appendChangeItem(nil, changePut, nil, nil), changePut, nil, nil)
	mixed := changeLogBatch(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), nil), 0))
	mixed.LogData(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), nil), 0))
	mixed.LogData(EntryMark{Index: 10}.Append(nil))
	for name, b := range map[string]*storage.Batch{
		"damaged":                       damaged,
		"a put without its write":       entryBatch(false, appendChangeItem(nil, changePut, nil, nil)),
		"two puts, one write":           entryBatch(true, twoPuts),
		"a write without its put":       entryBatch(true, appendChangeItem(nil, changeDelete, []byte("a"), nil)),
		"unknown change kind":           entryBatch(true, []byte{9, 0}),
		"truncated previous value":      entryBatch(true, []byte{changePut, 5, 1}),
		"a format 3 changes record too": mixed,
	} {
		if err := DecodeBatch(b, func(*AppliedEntry) error { return nil }); !errors.Is(err, ErrCorruptChangeLog) {
			t.Errorf("%s: %v, want ErrCorruptChangeLog", name, err)
		}
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
	f.Add(appendChangeItem(appendChangeItem(nil, changePut, nil, prev), changeDelete, []byte("z"), prev), []byte(nil))
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
