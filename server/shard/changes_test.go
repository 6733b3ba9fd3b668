package shard

import (
	"bytes"
	"errors"
	"testing"

	"github.com/shale-db/shale/replication/hlc"
	"github.com/shale-db/shale/storage"
)

// changeLogBatch builds a WAL batch of one entry: a put of key "a", the
// given change-log records and the entry's mark.
func changeLogBatch(records ...[]byte) *storage.Batch {
	b := storage.NewBatch()
	b.Set(dataKey([]byte("a")), encodeValue(nil, &storedValue{createRev: 3, modRev: 5, version: 2, value: []byte("new")}))
	for _, r := range records {
		b.LogData(r)
	}
	b.LogData(EntryMark{ShardID: 1, Index: 9, Term: 2, Revision: 5, HLC: hlc.Timestamp{WallNanos: 1}}.Append(nil))
	return b
}

// TestDecodeBatchRejectsMismatch: a change log that does not match its
// entry's writes, or is damaged, is reported, never decoded into events.
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

// FuzzDecodeBatch: any change-log and range record decodes or fails with
// an error; none panics.
func FuzzDecodeBatch(f *testing.F) {
	prev := encodeValue(nil, &storedValue{createRev: 1, modRev: 1, version: 1, value: []byte("x")})
	f.Add(sealRecord(appendChange([]byte{logKindChanges}, changePut, []byte("a"), prev), 0), []byte{logKindRange})
	f.Add(sealRecord(appendChange([]byte{logKindChanges}, changeDelete, []byte("z"), nil), 0), sealRecord([]byte{logKindRange, 0x08, 0x01}, 0))
	f.Fuzz(func(t *testing.T, changes, rng []byte) {
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
