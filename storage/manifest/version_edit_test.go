package manifest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

func sampleEdit() *VersionEdit {
	f1 := &FileMetadata{FileNum: 12, Size: 4096,
		Smallest: base.MakeInternalKey([]byte("apple"), 10, base.KindSet),
		Largest:  base.MakeRangeDeleteSentinel([]byte("kiwi")), SmallestSeq: 3, LargestSeq: 10, CreationTime: 1700000000}
	f2 := &FileMetadata{FileNum: 13, Size: 1,
		Smallest: base.MakeInternalKey([]byte{}, 0, base.KindDelete),
		Largest:  base.MakeInternalKey([]byte{0, 0xff}, 0, base.KindMerge), CreationTime: -5}
	return &VersionEdit{
		ComparatorName:     "shale.bytewise",
		MinUnflushedLogNum: 7,
		NextFileNum:        14,
		LastSeqNum:         99,
		DeletedFiles: map[DeletedFileEntry]*FileMetadata{
			{Level: 0, FileNum: 3}:       nil,
			{Level: 6, FileNum: 1 << 40}: f2,
			{Level: 2, FileNum: 5}:       nil,
		},
		NewFiles: []NewFileEntry{{Level: 1, Meta: f1}, {Level: 6, Meta: f2}},
	}
}

// editsEqual compares two edits, ignoring the metadata of deleted files
// (decoding leaves it nil).
func editsEqual(a, b *VersionEdit) error {
	if a.ComparatorName != b.ComparatorName || a.MinUnflushedLogNum != b.MinUnflushedLogNum ||
		a.NextFileNum != b.NextFileNum || a.LastSeqNum != b.LastSeqNum || a.HistoryHorizon != b.HistoryHorizon {
		return fmt.Errorf("scalar fields differ:\n%s\nvs\n%s", a, b)
	}
	if a.ReclaimsSet != b.ReclaimsSet || len(a.Reclaims) != len(b.Reclaims) {
		return fmt.Errorf("reclaims differ:\n%s\nvs\n%s", a, b)
	}
	for i, x := range a.Reclaims {
		y := b.Reclaims[i]
		if (x.Start == nil) != (y.Start == nil) || (x.End == nil) != (y.End == nil) ||
			!bytes.Equal(x.Start, y.Start) || !bytes.Equal(x.End, y.End) || x.Seq != y.Seq || x.DeletedAt != y.DeletedAt {
			return fmt.Errorf("reclaim %d differs: %+v vs %+v", i, x, y)
		}
	}
	if len(a.DeletedFiles) != len(b.DeletedFiles) {
		return fmt.Errorf("deleted files differ:\n%s\nvs\n%s", a, b)
	}
	for de := range a.DeletedFiles {
		if _, ok := b.DeletedFiles[de]; !ok {
			return fmt.Errorf("deleted file %v missing", de)
		}
	}
	if len(a.NewFiles) != len(b.NewFiles) {
		return fmt.Errorf("new files differ:\n%s\nvs\n%s", a, b)
	}
	for i := range a.NewFiles {
		x, y := a.NewFiles[i], b.NewFiles[i]
		if x.Level != y.Level || !sameFile(x.Meta, y.Meta) ||
			!bytes.Equal(x.Meta.Smallest.UserKey, y.Meta.Smallest.UserKey) ||
			!bytes.Equal(x.Meta.Largest.UserKey, y.Meta.Largest.UserKey) {
			return fmt.Errorf("new file %d differs: L%d %s vs L%d %s", i, x.Level, x.Meta, y.Level, y.Meta)
		}
	}
	return nil
}

func TestVersionEditRoundTrip(t *testing.T) {
	for _, ve := range []*VersionEdit{{}, sampleEdit(), {LastSeqNum: base.MaxSeqNum}} {
		var buf bytes.Buffer
		if err := ve.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		var got VersionEdit
		if err := got.Decode(buf.Bytes()); err != nil {
			t.Fatal(err)
		}
		if err := editsEqual(ve, &got); err != nil {
			t.Fatal(err)
		}
		// Deterministic encoding.
		var buf2 bytes.Buffer
		if err := got.Encode(&buf2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
			t.Fatal("re-encoding differs")
		}
		// The decoded keys must not alias the input.
		data := buf.Bytes()
		for i := range data {
			data[i] ^= 0xff
		}
		if err := editsEqual(ve, &got); err != nil {
			t.Fatalf("decoded edit aliases its input: %v", err)
		}
	}
}

func TestVersionEditEncodeRejectsInvalid(t *testing.T) {
	bad := []*VersionEdit{
		{NewFiles: []NewFileEntry{{Level: NumLevels, Meta: &FileMetadata{}}}},
		{NewFiles: []NewFileEntry{{Level: 0}}},
		{NewFiles: []NewFileEntry{{Level: 0, Meta: &FileMetadata{
			Smallest: base.MakeInternalKey([]byte("b"), 1, base.KindSet),
			Largest:  base.MakeInternalKey([]byte("a"), 1, base.KindSet)}}}},
		{NewFiles: []NewFileEntry{{Level: 0, Meta: &FileMetadata{SmallestSeq: 2, LargestSeq: 1}}}},
		{DeletedFiles: map[DeletedFileEntry]*FileMetadata{{Level: -1}: nil}},
		{LastSeqNum: base.MaxSeqNum + 1},
	}
	for i, ve := range bad {
		var buf bytes.Buffer
		if err := ve.Encode(&buf); err == nil || buf.Len() != 0 {
			t.Errorf("edit %d: want error and nothing written, got %v, %d bytes", i, err, buf.Len())
		}
	}
}

func TestVersionEditForwardCompat(t *testing.T) {
	ve := sampleEdit()
	enc, err := ve.AppendEncoded(nil)
	if err != nil {
		t.Fatal(err)
	}
	// An ignorable top-level tag is skipped.
	ign := binary.AppendUvarint(nil, TagSafeToIgnore|77)
	ign = appendBytes(ign, []byte("future stuff"))
	var got VersionEdit
	if err := got.Decode(append(append([]byte(nil), ign...), enc...)); err != nil {
		t.Fatal(err)
	}
	if err := editsEqual(ve, &got); err != nil {
		t.Fatal(err)
	}
	// An unknown tag without the bit is an error.
	unk := binary.AppendUvarint(nil, 77)
	unk = appendBytes(unk, []byte("x"))
	if err := got.Decode(append(unk, enc...)); err == nil || !strings.Contains(err.Error(), "unknown tag 77") {
		t.Fatalf("want unknown tag error, got %v", err)
	}

	// New-file subtags: ignorable ones are skipped, others rejected.
	one := &VersionEdit{NewFiles: ve.NewFiles[:1]}
	enc, _ = one.AppendEncoded(nil)
	if enc[len(enc)-1] != subtagEnd {
		t.Fatal("expected the encoding to end with the subtag terminator")
	}
	withSub := func(sub uint64) []byte {
		b := append([]byte(nil), enc[:len(enc)-1]...)
		b = binary.AppendUvarint(b, sub)
		b = appendBytes(b, []byte{1, 2, 3})
		return append(b, subtagEnd)
	}
	if err := got.Decode(withSub(TagSafeToIgnore | 5)); err != nil {
		t.Fatal(err)
	}
	if err := editsEqual(one, &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Decode(withSub(5)); err == nil || !strings.Contains(err.Error(), "unknown subtag 5") {
		t.Fatalf("want unknown subtag error, got %v", err)
	}
}

func TestVersionEditDecodeErrors(t *testing.T) {
	key := func(s string, seq base.SeqNum) []byte {
		k := base.MakeInternalKey([]byte(s), seq, base.KindSet)
		return appendBytes(nil, k.AppendEncoded(nil))
	}
	newFile := func(level uint64, smallest, largest []byte, sseq, lseq uint64) []byte {
		b := binary.AppendUvarint(nil, tagNewFile)
		b = binary.AppendUvarint(b, level)
		b = binary.AppendUvarint(b, 9)  // file num
		b = binary.AppendUvarint(b, 10) // size
		b = append(b, smallest...)
		b = append(b, largest...)
		b = binary.AppendUvarint(b, sseq)
		b = binary.AppendUvarint(b, lseq)
		return append(b, subtagEnd)
	}
	cases := map[string][]byte{
		"level 7 out of range":           newFile(7, key("a", 1), key("b", 1), 1, 1),
		"smallest key b#1,SET > largest": newFile(1, key("b", 1), key("a", 1), 1, 1),
		"smallest seqnum 2 > largest":    newFile(1, key("a", 1), key("b", 1), 2, 1),
		"too short for an internal key":  newFile(1, appendBytes(nil, []byte("abc")), key("b", 1), 1, 1),
		"exceeds the maximum":            binary.AppendUvarint([]byte{tagLastSeqNum}, uint64(base.MaxSeqNum)+1),
		"deleted file level":             {tagDeletedFile, 9, 1},
		"truncated or overlong uvarint":  {tagNextFileNum, 0x80},
		"exceeds the 1 bytes left":       {tagComparator, 5, 'x'},
	}
	for want, data := range cases {
		var ve VersionEdit
		err := ve.Decode(data)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
	// Every truncation of a valid encoding fails or decodes a prefix of the
	// fields; none panics.
	enc, _ := sampleEdit().AppendEncoded(nil)
	for i := range enc {
		var ve VersionEdit
		_ = ve.Decode(enc[:i])
	}
}

func FuzzVersionEditDecode(f *testing.F) {
	enc, _ := sampleEdit().AppendEncoded(nil)
	f.Add(enc)
	f.Add([]byte{})
	f.Add([]byte{tagNewFile, 1, 2, 3})
	ign := binary.AppendUvarint(nil, TagSafeToIgnore|3)
	f.Add(appendBytes(ign, []byte("zz")))
	hor := binary.AppendUvarint(nil, tagHistoryHorizon)
	f.Add(appendBytes(hor, []byte{0x80, 0x01}))
	rec, _ := (&VersionEdit{ReclaimsSet: true, Reclaims: sampleReclaims()}).AppendEncoded(nil)
	f.Add(rec)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ve VersionEdit
		if err := ve.Decode(data); err != nil {
			return
		}
		_ = ve.String()
		enc, err := ve.AppendEncoded(nil)
		if err != nil {
			t.Fatalf("decoded edit does not encode: %v\n%s", err, &ve)
		}
		var ve2 VersionEdit
		if err := ve2.Decode(enc); err != nil {
			t.Fatalf("re-encoded edit does not decode: %v", err)
		}
		if err := editsEqual(&ve, &ve2); err != nil {
			t.Fatal(err)
		}
		enc2, _ := ve2.AppendEncoded(nil)
		if !bytes.Equal(enc, enc2) {
			t.Fatal("encoding is not canonical after one round trip")
		}
		// Accumulating a decoded edit never panics either.
		var b BulkVersionEdit
		if b.Accumulate(&ve) == nil {
			if v, err := b.Apply(nil); err == nil {
				if err := v.CheckOrdering(); err != nil {
					t.Fatal(err)
				}
				_ = v.Overlaps(1, []byte("a"), []byte("z"))
				v.Unref()
			}
		}
	})
}

// roundTrip encodes ve and decodes the result.
func roundTrip(t *testing.T, ve *VersionEdit) VersionEdit {
	t.Helper()
	enc, err := ve.AppendEncoded(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got VersionEdit
	if err := got.Decode(enc); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCleanCloseAndHorizonRoundTrip: the clean-close and history-horizon
// fields survive a round trip and String shows them; malformed payloads are
// errors, not silent zeros.
func TestCleanCloseAndHorizonRoundTrip(t *testing.T) {
	ve := VersionEdit{LastSeqNum: 9, CleanCloseLogNum: 12, CleanCloseLogSize: 1 << 40, HistoryHorizon: 1 << 50}
	got := roundTrip(t, &ve)
	if got.CleanCloseLogNum != 12 || got.CleanCloseLogSize != 1<<40 || got.LastSeqNum != 9 || got.HistoryHorizon != 1<<50 {
		t.Fatalf("round trip: %+v", got)
	}
	if !strings.Contains(got.String(), "history-horizon: 1125899906842624") {
		t.Fatalf("String() lacks the horizon:\n%s", &got)
	}
	// A truncated payload of either (each the last field) is an error.
	cc := ve
	cc.HistoryHorizon = 0
	for _, e := range []*VersionEdit{&ve, &cc} {
		enc, _ := e.AppendEncoded(nil)
		if err := got.Decode(enc[:len(enc)-1]); err == nil {
			t.Fatalf("decoding a truncated %+v succeeded", e)
		}
	}
	// A zero, oversized or padded horizon is an error too.
	for _, p := range [][]byte{{0}, binary.AppendUvarint(nil, uint64(base.MaxSeqNum)+2), {5, 0}} {
		bad := appendBytes(binary.AppendUvarint(nil, tagHistoryHorizon), p)
		if err := got.Decode(bad); err == nil {
			t.Fatalf("decoding history-horizon payload %x succeeded", p)
		}
	}
	ve.HistoryHorizon = base.MaxSeqNum + 2
	if _, err := ve.AppendEncoded(nil); err == nil {
		t.Fatal("encoding an oversized history horizon succeeded")
	}
}

func sampleReclaims() []Reclaim {
	return []Reclaim{
		{Start: nil, End: []byte("m"), Seq: 7},
		{Start: []byte{}, End: nil, Seq: 1 << 40, DeletedAt: 12},
		{Start: []byte("a\x00"), End: []byte("b"), Seq: base.MaxSeqNum, DeletedAt: 1},
	}
}

// TestReclaimsRoundTrip: the reclaims field keeps every span's bounds (an
// unbounded one apart from an empty key), sequence numbers and an empty set
// (ReclaimsSet with none: none wait). Malformed payloads are errors.
func TestReclaimsRoundTrip(t *testing.T) {
	for _, rs := range [][]Reclaim{sampleReclaims(), nil} {
		ve := VersionEdit{LastSeqNum: 3, ReclaimsSet: true, Reclaims: rs}
		got := roundTrip(t, &ve)
		if err := editsEqual(&ve, &got); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got.String(), fmt.Sprintf("reclaims: %d", len(rs))) {
			t.Fatalf("String() lacks the reclaims:\n%s", &got)
		}
	}
	var unset VersionEdit
	if err := unset.Decode(nil); err != nil || unset.ReclaimsSet {
		t.Fatalf("an edit without the field: set %v, %v", unset.ReclaimsSet, err)
	}
	good := appendReclaims(nil, sampleReclaims())
	for name, p := range map[string][]byte{
		"truncated":     good[:len(good)-1],
		"trailing":      append(append([]byte{}, good...), 0),
		"unknown flags": {1, 4, 0, 0},
		"huge count":    {0xff, 0x01, 0, 0, 0},
		"seq too large": append([]byte{1, 0}, append(binary.AppendUvarint(nil, uint64(base.MaxSeqNum)+1), 0)...),
	} {
		bad := appendBytes(binary.AppendUvarint(nil, tagReclaims), p)
		var ve VersionEdit
		if err := ve.Decode(bad); err == nil {
			t.Errorf("%s: decoding reclaims payload %x succeeded", name, p)
		}
	}
	over := VersionEdit{ReclaimsSet: true, Reclaims: []Reclaim{{Seq: base.MaxSeqNum + 1}}}
	if _, err := over.AppendEncoded(nil); err == nil {
		t.Fatal("encoding an oversized reclaim seqnum succeeded")
	}
}
