package storage

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
)

// otherMerger is a merge operator with another name than concatMerger.
type otherMerger struct{ concatMerger }

func (otherMerger) Name() string { return "other" }

func optionsFiles(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if ft, _, ok := manifest.ParseFilename(n); ok && ft == manifest.FileTypeOptions {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// tunables strips the hooks from o, leaving what an OPTIONS file records.
func tunables(o *Options) Options {
	n := *o
	n.FS, n.Shared, n.Logger, n.MergeOperator, n.CompactionFilter = nil, nil, nil, nil, nil
	n.now = nil
	return n
}

// TestOptionsFileRecordsTheOptions: Open records every tunable and the
// hooks' names in an OPTIONS file, which ReadOptionsFile returns as they
// were given (defaults applied); a reopen with the same options writes no
// new file, one with other options writes a new file and removes the old.
func TestOptionsFileRecordsTheOptions(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	opts.PrefixExtractor = FixedPrefix(3)
	opts.WALArchiveTTL = 90 * time.Second
	opts.LevelMultiplier = 7.5
	opts.DisableWritePacing = true
	opts.PeriodicCompaction = 36 * time.Hour
	opts.AtRestCompactionDelay = 90 * time.Second
	opts.HistoryHorizon = true
	opts.HistoryWindow = 5 * time.Minute
	opts.HistoryWindowBytes = 64 << 20
	opts.Compaction = UniversalCompaction
	opts.Universal = UniversalOptions{SizeRatio: 7, MaxMergeWidth: 5}
	opts.Levels[6].Compression = ZstdCompression
	opts.Levels[6].FilterBitsPerKey = -1
	d := apiMustOpen(t, "db", opts)
	apiMustClose(t, d)

	files := optionsFiles(t, fs, "db")
	if len(files) != 1 {
		t.Fatalf("OPTIONS files after the first open: %v, want one", files)
	}
	s, err := ReadOptionsFile(fs, "db")
	if err != nil {
		t.Fatal(err)
	}
	if s.File != files[0] || s.Comparator != comparatorName || s.MergeOperator != "concat" ||
		s.PrefixExtractor != "fixed:3" || s.CompactionFilter != "" {
		t.Fatalf("recorded %s: comparator %q, merge %q, prefix %q, filter %q", s.File, s.Comparator, s.MergeOperator, s.PrefixExtractor, s.CompactionFilter)
	}
	want := tunables(opts.ensureDefaults())
	got := tunables(&s.Options)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("recorded options differ from those opened with:\n got %+v\nwant %+v", got, want)
	}
	if got.Levels[6].filterBits() != 0 || got.Levels[6].Compression != ZstdCompression {
		t.Fatalf("level 6 recorded as %+v", got.Levels[6])
	}

	// Same options: nothing rewritten.
	d = apiMustOpen(t, "db", opts)
	apiMustClose(t, d)
	if again := optionsFiles(t, fs, "db"); !slices.Equal(again, files) {
		t.Fatalf("a reopen with the same options left %v, had %v", again, files)
	}
	// Other options: a new file, the old one removed.
	opts.MemTableSize = 128 << 10
	d = apiMustOpen(t, "db", opts)
	apiMustClose(t, d)
	after := optionsFiles(t, fs, "db")
	if len(after) != 1 || after[0] == files[0] {
		t.Fatalf("a reopen with a new memtable size left %v, had %v", after, files)
	}
	if s, err := ReadOptionsFile(fs, "db"); err != nil || s.Options.MemTableSize != 128<<10 {
		t.Fatalf("after the change: %+v, %v", s, err)
	}
	// The options reopen the database as it was made.
	s, err = ReadOptionsFile(fs, "db")
	if err != nil {
		t.Fatal(err)
	}
	reopen := s.Options
	reopen.FS, reopen.MergeOperator, reopen.Logger = fs, concatMerger{}, apiQuietLogger
	d = apiMustOpen(t, "db", &reopen)
	apiMustClose(t, d)
	if final := optionsFiles(t, fs, "db"); !slices.Equal(final, after) {
		t.Fatalf("reopening with the recorded options rewrote them: %v, had %v", final, after)
	}
}

// TestOptionsFileRefusesAnotherMergeOperator: a database made with a merge
// operator does not open for writing with another or none (its merges would
// be folded wrongly or not at all), does open read-only without one, and a
// recorded comparator other than the engine's is refused. Nothing is
// written by a refused open.
func TestOptionsFileRefusesAnotherMergeOperator(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	d := apiMustOpen(t, "db", opts)
	if err := d.Merge([]byte("k"), []byte("a"), Sync); err != nil {
		t.Fatal(err)
	}
	apiMustClose(t, d)
	files := optionsFiles(t, fs, "db")

	for _, m := range []MergeOperator{otherMerger{}, nil} {
		o := apiSmallOptions(fs)
		o.MergeOperator = m
		_, err := Open("db", o)
		if !errors.Is(err, ErrIncompatibleOptions) {
			t.Fatalf("open with merge operator %v: %v, want ErrIncompatibleOptions", m, err)
		}
		if !strings.Contains(err.Error(), `"concat"`) {
			t.Fatalf("the error does not name the recorded operator: %v", err)
		}
	}
	if got := optionsFiles(t, fs, "db"); !slices.Equal(got, files) {
		t.Fatalf("refused opens changed the OPTIONS files: %v, had %v", got, files)
	}
	ro := apiSmallOptions(fs)
	ro.MergeOperator = nil
	rd, err := OpenReadOnly("db", ro)
	if err != nil {
		t.Fatalf("read-only open without a merge operator: %v", err)
	}
	rd.Close()

	// A comparator this engine does not have.
	s, err := ReadOptionsFile(fs, "db")
	if err != nil {
		t.Fatal(err)
	}
	o := s.Options
	o.MergeOperator = concatMerger{}
	text := bytes.Replace(encodeOptions(o.ensureDefaults()), []byte("comparator="+comparatorName), []byte("comparator=leveldb.BytewiseComparator"), 1)
	text = rechecksum(t, text)
	corWriteFile(t, fs, "db/"+s.File, text)
	if _, err := Open("db", apiSmallOptions(fs)); !errors.Is(err, ErrIncompatibleOptions) || !strings.Contains(err.Error(), "leveldb.BytewiseComparator") {
		t.Fatalf("open with another recorded comparator: %v", err)
	}
}

// TestOptionsFileCorrupt: a damaged OPTIONS file fails the open with an
// error naming the file (nothing else changes), and the database opens
// again once the file is removed.
func TestOptionsFileCorrupt(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	d := apiMustOpen(t, "db", opts)
	if err := d.Set([]byte("k"), []byte("v"), Sync); err != nil {
		t.Fatal(err)
	}
	apiMustClose(t, d)
	name := optionsFiles(t, fs, "db")[0]
	orig := corReadFile(t, fs, "db/"+name)
	for _, tc := range []struct {
		what string
		text []byte
	}{
		{"a flipped byte", flip(orig, bytes.Index(orig, []byte("memtable_size="))+15)},
		{"no checksum", orig[:bytes.LastIndex(orig, []byte("checksum="))]},
		{"an option a later engine added", rechecksum(t, bytes.Replace(orig, []byte("[level 0]\n"), []byte("blob_file_size=268435456\n[level 0]\n"), 1))},
		{"an unknown compression", rechecksum(t, bytes.Replace(orig, []byte("compression=snappy"), []byte("compression=lz4"), 1))},
	} {
		corWriteFile(t, fs, "db/"+name, tc.text)
		_, err := Open("db", opts)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s: open returned %v, want an error naming %s", tc.what, err, name)
		}
		if _, err := ReadOptionsFile(fs, "db"); err == nil {
			t.Fatalf("%s: ReadOptionsFile accepted it", tc.what)
		}
	}
	if err := fs.Remove("db/" + name); err != nil {
		t.Fatal(err)
	}
	d = apiMustOpen(t, "db", opts)
	defer d.Close()
	if v, err := d.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("after removing the corrupt OPTIONS file: %q, %v", v, err)
	}
	if files := optionsFiles(t, fs, "db"); len(files) != 1 {
		t.Fatalf("the reopen wrote %v", files)
	}
}

// FuzzParseOptions: any content either parses or is refused with an error,
// never a panic; an encoded Options parses back to the same tunables.
func FuzzParseOptions(f *testing.F) {
	o := apiSmallOptions(vfs.NewMem())
	f.Add(encodeOptions(o.ensureDefaults()))
	f.Add(encodeOptions((&Options{}).ensureDefaults()))
	f.Add([]byte("checksum=crc32c:00000000\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseOptions(data)
		if err != nil {
			return
		}
		again, err := parseOptions(encodeOptionsNamed(&s.Options, s))
		if err != nil {
			t.Fatalf("re-encoded options do not parse: %v", err)
		}
		if !reflect.DeepEqual(tunables(&again.Options), tunables(&s.Options)) {
			t.Fatalf("round trip changed the options:\n%+v\n%+v", again.Options, s.Options)
		}
	})
}

// encodeOptionsNamed encodes o with s's hook names (the hooks themselves
// are not recorded).
func encodeOptionsNamed(o *Options, s *StoredOptions) []byte {
	text := encodeOptions(o)
	for k, v := range map[string]string{"merge_operator": s.MergeOperator, "compaction_filter": s.CompactionFilter, "prefix_extractor": s.PrefixExtractor} {
		text = bytes.Replace(text, []byte("\n"+k+"=\n"), []byte("\n"+k+"="+v+"\n"), 1)
	}
	return rechecksumBytes(text)
}

func rechecksumBytes(text []byte) []byte {
	i := bytes.LastIndex(text, []byte("checksum="))
	if i < 0 {
		return text
	}
	body := slices.Clone(text[:i])
	return append(body, optionsChecksumLine(body)...)
}

func rechecksum(t *testing.T, text []byte) []byte {
	t.Helper()
	out := rechecksumBytes(text)
	if _, err := parseOptions(out); err != nil && !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("rechecksummed text does not parse: %v", err)
	}
	return out
}

func flip(b []byte, i int) []byte {
	c := slices.Clone(b)
	c[i] ^= 0x01
	return c
}
