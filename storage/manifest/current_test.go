package manifest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

func TestFilenames(t *testing.T) {
	cases := []struct {
		ft   FileType
		num  FileNum
		name string
	}{
		{FileTypeLog, 123, "000123.log"},
		{FileTypeTable, 5, "000005.sst"},
		{FileTypeTable, 12345678, "12345678.sst"},
		{FileTypeManifest, 5, "MANIFEST-000005"},
		{FileTypeCurrent, 0, "CURRENT"},
		{FileTypeLock, 0, "LOCK"},
		{FileTypeTemp, 9, "000009.dbtmp"},
		{FileTypeOptions, 77, "OPTIONS-000077"},
	}
	for _, c := range cases {
		if got := MakeFilename(c.ft, c.num); got != c.name {
			t.Errorf("MakeFilename(%v, %d) = %q, want %q", c.ft, c.num, got, c.name)
		}
		ft, num, ok := ParseFilename(c.name)
		if !ok || ft != c.ft || num != c.num {
			t.Errorf("ParseFilename(%q) = %v, %d, %v", c.name, ft, num, ok)
		}
	}
	for _, bad := range []string{"", "5.sst", "0000005.sst", "000005.SST", "MANIFEST-", "MANIFEST-00000x",
		"MANIFEST-+00005", "000005.log.bak", "x000005.log", "CURRENT.tmp", "LOCK2", ".log",
		"99999999999999999999999.sst", "-00005.sst", "OPTIONS-1"} {
		if ft, num, ok := ParseFilename(bad); ok {
			t.Errorf("ParseFilename(%q) = %v, %d, true; want false", bad, ft, num)
		}
	}
	if MakeFilename(FileType(99), 1) != "" {
		t.Error("unknown type should give an empty name")
	}
}

func TestCurrentFile(t *testing.T) {
	fs := osFS{}
	dir := t.TempDir()
	if _, err := ReadCurrentFile(fs, dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing CURRENT: got %v", err)
	}
	for _, n := range []FileNum{5, 1234567} {
		if err := SetCurrentFile(fs, dir, n); err != nil {
			t.Fatal(err)
		}
		got, err := ReadCurrentFile(fs, dir)
		if err != nil || got != n {
			t.Fatalf("ReadCurrentFile = %d, %v; want %d", got, err, n)
		}
	}
	data, _ := os.ReadFile(filepath.Join(dir, "CURRENT"))
	if string(data) != "MANIFEST-1234567\n" {
		t.Fatalf("CURRENT holds %q", data)
	}
	names, _ := fs.List(dir)
	if len(names) != 1 {
		t.Fatalf("temp files left behind: %v", names)
	}
	for _, bad := range []string{"", "MANIFEST-000005", "MANIFEST-5\n", "000005.sst\n", "MANIFEST-000005\n\n",
		strings.Repeat("x", 5000) + "\n"} {
		os.WriteFile(filepath.Join(dir, "CURRENT"), []byte(bad), 0o644)
		_, err := ReadCurrentFile(fs, dir)
		var ce *base.CorruptionError
		if !errors.As(err, &ce) || !strings.HasSuffix(ce.File, "CURRENT") {
			t.Errorf("CURRENT %q: want corruption naming CURRENT, got %v", bad, err)
		}
	}
	if err := SetCurrentFile(fs, filepath.Join(dir, "missing"), 1); err == nil {
		t.Fatal("SetCurrentFile into a missing directory succeeded")
	}
}

// buildManifest writes edits into a manifest image and returns the bytes and
// the offset just past each edit.
func buildManifest(t *testing.T, edits []*VersionEdit) ([]byte, []int64) {
	t.Helper()
	var buf bytes.Buffer
	w := wal.NewWriter(&buf)
	var ends []int64
	for _, ve := range edits {
		enc, err := ve.AppendEncoded(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteRecord(enc); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, w.Size())
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), ends
}

func fileMeta(num FileNum, lo, hi string, seq base.SeqNum) *FileMetadata {
	return &FileMetadata{FileNum: num, Size: uint64(num) * 10,
		Smallest: base.MakeInternalKey([]byte(lo), seq, base.KindSet),
		Largest:  base.MakeInternalKey([]byte(hi), seq, base.KindSet), SmallestSeq: seq, LargestSeq: seq}
}

func testEdits() []*VersionEdit {
	big := &VersionEdit{}
	for i := 0; i < 300; i++ { // an edit spanning blocks
		k := strings.Repeat("k", 100) + string(rune('a'+i/26)) + string(rune('a'+i%26))
		big.NewFiles = append(big.NewFiles, NewFileEntry{Level: 6, Meta: fileMeta(FileNum(1000+i), k, k, 1)})
	}
	return []*VersionEdit{
		{ComparatorName: "bytewise", NextFileNum: 2, MinUnflushedLogNum: 1},
		{NewFiles: []NewFileEntry{{Level: 0, Meta: fileMeta(3, "a", "m", 10)}}, NextFileNum: 5, LastSeqNum: 10},
		{NewFiles: []NewFileEntry{{Level: 0, Meta: fileMeta(4, "c", "z", 20)}}, LastSeqNum: 20, MinUnflushedLogNum: 4},
		big,
		{DeletedFiles: map[DeletedFileEntry]*FileMetadata{{0, 3}: nil, {0, 4}: nil},
			NewFiles:    []NewFileEntry{{Level: 1, Meta: fileMeta(6, "a", "f", 20)}, {Level: 1, Meta: fileMeta(7, "g", "z", 20)}},
			NextFileNum: 8},
		{DeletedFiles: map[DeletedFileEntry]*FileMetadata{{1, 7}: nil},
			NewFiles: []NewFileEntry{{Level: 2, Meta: fileMeta(7, "g", "z", 20)}}, LastSeqNum: 25},
	}
}

func TestReplayManifest(t *testing.T) {
	fs := osFS{}
	dir := t.TempDir()
	edits := testEdits()
	data, ends := buildManifest(t, edits)
	path := filepath.Join(dir, MakeFilename(FileTypeManifest, 1))

	// Full replay.
	os.WriteFile(path, data, 0o644)
	v, sum, err := ReplayManifest(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	want := "L1:\n  000006:[a#20,SET-f#20,SET]\nL2:\n  000007:[g#20,SET-z#20,SET]\n"
	if !strings.HasPrefix(v.String(), want) || v.NumFiles(6) != 300 {
		t.Fatalf("version:\n%s", v)
	}
	wantSum := VersionEditSummary{ComparatorName: "bytewise", MinUnflushedLogNum: 4, NextFileNum: 8, LastSeqNum: 25,
		NumEdits: len(edits), ValidSize: int64(len(data))}
	if !reflect.DeepEqual(sum, wantSum) {
		t.Fatalf("summary %+v, want %+v", sum, wantSum)
	}
	v.Unref()

	// Truncation at every offset of a small manifest, and near block
	// boundaries and at a sample of offsets of the large one.
	small := append(append([]*VersionEdit(nil), edits[:3]...), edits[4:]...)
	smallData, smallEnds := buildManifest(t, small)
	cuts := make([]int, len(smallData)+1)
	for i := range cuts {
		cuts[i] = i
	}
	checkManifestTruncations(t, small, smallData, smallEnds, cuts)
	cuts = cuts[:0]
	for c := 0; c <= len(data); c++ {
		if c%97 == 0 || c%wal.BlockSize < 40 || c%wal.BlockSize > wal.BlockSize-40 || c > len(data)-200 ||
			(c > int(ends[2])-40 && c < int(ends[2])+40) {
			cuts = append(cuts, c)
		}
	}
	checkManifestTruncations(t, edits, data, ends, cuts)

	// A zeroed tail (preallocation) is a clean end.
	os.WriteFile(path, append(append([]byte(nil), data...), make([]byte, 1000)...), 0o644)
	if _, sum, err := ReplayManifest(fs, path); err != nil || sum.TornTail || sum.NumEdits != len(edits) {
		t.Fatalf("zeroed tail: %+v, %v", sum, err)
	}

	// Corruption in the middle, and in the last record, is an error
	// naming the manifest.
	for _, off := range []int64{ends[0] + 10, ends[len(ends)-1] - 2} {
		d := append([]byte(nil), data...)
		d[off] ^= 0x10
		os.WriteFile(path, d, 0o644)
		_, _, err := ReplayManifest(fs, path)
		var ce *base.CorruptionError
		if !errors.As(err, &ce) || ce.File != path {
			t.Fatalf("flip at %d: want corruption naming %s, got %v", off, path, err)
		}
	}

	if _, _, err := ReplayManifest(fs, filepath.Join(dir, "MANIFEST-000099")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing manifest: %v", err)
	}
}

// checkManifestTruncations replays the manifest of edits (data, with ends
// the offset past each edit) cut at each offset: a prefix of the edits (at
// least one) must be replayed and the tail reported torn, or, when no edit
// is complete, a corruption error returned.
func checkManifestTruncations(t *testing.T, edits []*VersionEdit, data []byte, ends []int64, cuts []int) {
	t.Helper()
	const path = "/db/MANIFEST-000001"
	for _, cut := range cuts {
		v, sum, err := ReplayManifest(bytesFS{path: path, data: data[:cut]}, path)
		n := 0
		for n < len(ends) && ends[n] <= int64(cut) {
			n++
		}
		if n == 0 {
			var ce *base.CorruptionError
			if !errors.As(err, &ce) || ce.File != path {
				t.Fatalf("cut %d: want corruption (no complete edit), got %v", cut, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		if sum.NumEdits != n || sum.TornTail != (int64(cut) != ends[n-1]) || sum.ValidSize != ends[n-1] {
			t.Fatalf("cut %d: summary %+v, want %d edits", cut, sum, n)
		}
		// The version must equal a replay of the first n edits.
		var b BulkVersionEdit
		for _, ve := range edits[:n] {
			if err := b.Accumulate(ve); err != nil {
				t.Fatal(err)
			}
		}
		wantV, err := b.Apply(nil)
		if err != nil {
			t.Fatal(err)
		}
		if v.String() != wantV.String() {
			t.Fatalf("cut %d: version\n%s\nwant\n%s", cut, v, wantV)
		}
		v.Unref()
		wantV.Unref()
	}
}

func TestReplayManifestInvalidEdits(t *testing.T) {
	fs := osFS{}
	dir := t.TempDir()
	path := filepath.Join(dir, "MANIFEST-000001")
	cases := map[string][][]byte{
		"undecodable edit":   {{0x7f}},
		"comparator changes": {mustEncode(t, &VersionEdit{ComparatorName: "a"}), mustEncode(t, &VersionEdit{ComparatorName: "b"})},
		"delete of a missing file": {mustEncode(t, &VersionEdit{ComparatorName: "a"}),
			mustEncode(t, &VersionEdit{DeletedFiles: map[DeletedFileEntry]*FileMetadata{{1, 5}: nil}})},
		"overlapping files": {mustEncode(t, &VersionEdit{NewFiles: []NewFileEntry{
			{Level: 1, Meta: fileMeta(1, "a", "c", 1)}, {Level: 1, Meta: fileMeta(2, "b", "d", 1)}}})},
		"empty manifest": {},
	}
	for name, recs := range cases {
		var buf bytes.Buffer
		w := wal.NewWriter(&buf)
		for _, r := range recs {
			w.WriteRecord(r)
		}
		w.Flush()
		os.WriteFile(path, buf.Bytes(), 0o644)
		_, _, err := ReplayManifest(fs, path)
		var ce *base.CorruptionError
		if !errors.As(err, &ce) || ce.File != path {
			t.Errorf("%s: want corruption naming the manifest, got %v", name, err)
		}
	}
}

func mustEncode(t *testing.T, ve *VersionEdit) []byte {
	t.Helper()
	b, err := ve.AppendEncoded(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReplayManifestZeroedRegion: zeroing a record in the middle of a
// MANIFEST must not end replay quietly before the intact edits after it.
func TestReplayManifestZeroedRegion(t *testing.T) {
	fs := vfs.NewMem()
	f, err := fs.Create("MANIFEST-000001")
	if err != nil {
		t.Fatal(err)
	}
	w := wal.NewWriter(f)
	var offsets []int64
	for i := 1; i <= 3; i++ {
		ve := VersionEdit{ComparatorName: "c", NextFileNum: FileNum(10 * i), LastSeqNum: base.SeqNum(i)}
		enc, err := ve.AppendEncoded(nil)
		if err != nil {
			t.Fatal(err)
		}
		off, err := w.WriteRecord(enc)
		if err != nil {
			t.Fatal(err)
		}
		offsets = append(offsets, off)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	data := readAll(t, fs, "MANIFEST-000001")
	// Zero the second record (header and payload).
	for i := offsets[1]; i < offsets[2]; i++ {
		data[i] = 0
	}
	g, _ := fs.Create("MANIFEST-000001")
	g.Write(data)
	g.Close()
	_, _, err = ReplayManifest(fs, "MANIFEST-000001")
	if !errors.Is(err, base.ErrCorruption) {
		t.Fatalf("replay of a MANIFEST with a zeroed middle record: %v, want corruption", err)
	}
}

func readAll(t *testing.T, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
