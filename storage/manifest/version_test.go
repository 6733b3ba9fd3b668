package manifest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/shale-db/shale/storage/internal/base"
)

// parseLevels parses lines of the form "L<n>" (a level header) followed by
// file specs (see parseFile), keeping the given order.
func parseLevels(input string) ([NumLevels][]*FileMetadata, error) {
	var levels [NumLevels][]*FileMetadata
	level := -1
	for _, line := range strings.Split(input, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "L") && !strings.Contains(line, ":") {
			n, err := strconv.Atoi(line[1:])
			if err != nil || n < 0 || n >= NumLevels {
				return levels, fmt.Errorf("bad level %q", line)
			}
			level = n
			continue
		}
		if level < 0 {
			return levels, fmt.Errorf("file %q before a level header", line)
		}
		m, err := parseFile(line)
		if err != nil {
			return levels, err
		}
		levels[level] = append(levels[level], m)
	}
	return levels, nil
}

// parseEdit parses lines "add L<n> <file spec>" and "del L<n> <num>".
func parseEdit(input string) (*VersionEdit, error) {
	ve := &VersionEdit{}
	for _, line := range strings.Split(input, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) < 3 || !strings.HasPrefix(fields[1], "L") {
			return nil, fmt.Errorf("bad edit line %q", line)
		}
		level, err := strconv.Atoi(fields[1][1:])
		if err != nil {
			return nil, fmt.Errorf("bad edit line %q: %w", line, err)
		}
		switch fields[0] {
		case "add":
			m, err := parseFile(strings.Join(fields[2:], " "))
			if err != nil {
				return nil, err
			}
			ve.NewFiles = append(ve.NewFiles, NewFileEntry{Level: level, Meta: m})
		case "del":
			n, err := strconv.ParseUint(fields[2], 10, 64)
			if err != nil {
				return nil, err
			}
			if ve.DeletedFiles == nil {
				ve.DeletedFiles = map[DeletedFileEntry]*FileMetadata{}
			}
			ve.DeletedFiles[DeletedFileEntry{Level: level, FileNum: FileNum(n)}] = nil
		default:
			return nil, fmt.Errorf("bad edit line %q", line)
		}
	}
	return ve, nil
}

func fileNums(files []*FileMetadata) string {
	if len(files) == 0 {
		return "(none)"
	}
	var s []string
	for _, f := range files {
		s = append(s, f.FileNum.String())
	}
	return strings.Join(s, " ")
}

func TestVersionDataDriven(t *testing.T) {
	var v *Version
	var obsolete []*FileMetadata
	onObsolete := func(files []*FileMetadata) { obsolete = append(obsolete, files...) }
	datadriven.RunTest(t, "testdata/version", func(t *testing.T, td *datadriven.TestData) string {
		switch td.Cmd {
		case "define":
			levels, err := parseLevels(td.Input)
			if err != nil {
				return "error: " + err.Error()
			}
			nv, err := NewVersion(levels)
			if err != nil {
				return "error: " + err.Error()
			}
			if v != nil {
				v.Unref()
			}
			obsolete = nil
			v = nv
			v.SetObsoleteFunc(onObsolete)
			return v.String()

		case "check-ordering":
			// Check the files exactly in the given order.
			levels, err := parseLevels(td.Input)
			if err != nil {
				return "error: " + err.Error()
			}
			raw := &Version{Levels: levels}
			if err := raw.CheckOrdering(); err != nil {
				return "error: " + err.Error()
			}
			return "ok"

		case "apply":
			// Each edit is separated by a line "--"; all are accumulated.
			var b BulkVersionEdit
			for _, part := range strings.Split(td.Input, "\n--\n") {
				ve, err := parseEdit(part)
				if err != nil {
					return "error: " + err.Error()
				}
				if err := b.Accumulate(ve); err != nil {
					return "error: " + err.Error()
				}
			}
			nv, err := b.Apply(v)
			if err != nil {
				return "error: " + err.Error()
			}
			obsolete = nil
			if v != nil {
				v.Unref()
			}
			v = nv
			out := v.String()
			if len(obsolete) > 0 {
				out += "obsolete: " + fileNums(obsolete) + "\n"
			}
			return out

		case "overlaps":
			var level int
			var start, end string
			td.ScanArgs(t, "level", &level)
			td.ScanArgs(t, "start", &start)
			td.ScanArgs(t, "end", &end)
			return fileNums(v.Overlaps(level, []byte(start), []byte(end)))

		case "sizes":
			var b strings.Builder
			for l := range NumLevels {
				if v.NumFiles(l) > 0 {
					fmt.Fprintf(&b, "L%d: %d files, %d bytes\n", l, v.NumFiles(l), v.LevelSize(l))
				}
			}
			return b.String()
		}
		return "unknown command " + td.Cmd
	})
	if v != nil {
		v.Unref()
	}
}

func TestVersionRefs(t *testing.T) {
	a := &FileMetadata{FileNum: 1, Smallest: mustKey(t, "a#1,SET"), Largest: mustKey(t, "b#1,SET"), SmallestSeq: 1, LargestSeq: 1}
	b := &FileMetadata{FileNum: 2, Smallest: mustKey(t, "c#2,SET"), Largest: mustKey(t, "d#2,SET"), SmallestSeq: 2, LargestSeq: 2}
	var obsolete []FileNum
	v1, err := NewVersion([NumLevels][]*FileMetadata{1: {a, b}})
	if err != nil {
		t.Fatal(err)
	}
	v1.SetObsoleteFunc(func(files []*FileMetadata) {
		for _, f := range files {
			obsolete = append(obsolete, f.FileNum)
		}
	})
	// v2 drops a.
	var bve BulkVersionEdit
	if err := bve.Accumulate(&VersionEdit{DeletedFiles: map[DeletedFileEntry]*FileMetadata{{Level: 1, FileNum: 1}: nil}}); err != nil {
		t.Fatal(err)
	}
	v2, err := bve.Apply(v1)
	if err != nil {
		t.Fatal(err)
	}
	if bve.Deleted[1][1] != a {
		t.Fatal("deleted metadata not resolved")
	}
	if a.Refs() != 1 || b.Refs() != 2 {
		t.Fatalf("refs a=%d b=%d", a.Refs(), b.Refs())
	}
	v1.Ref() // e.g. an iterator
	v1.Unref()
	if len(obsolete) != 0 {
		t.Fatalf("obsolete too early: %v", obsolete)
	}
	v1.Unref()
	if !slices.Equal(obsolete, []FileNum{1}) {
		t.Fatalf("obsolete = %v", obsolete)
	}
	v2.Unref()
	if !slices.Equal(obsolete, []FileNum{1, 2}) {
		t.Fatalf("obsolete = %v (inherited callback)", obsolete)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Unref below zero did not panic")
		}
	}()
	v2.Unref()
}

func mustKey(t *testing.T, s string) base.InternalKey {
	t.Helper()
	k, err := parseKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestOverlapsRandom compares the binary search of L1+ with a linear scan,
// with sentinels and shared boundary user keys.
func TestOverlapsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	key := func(i int) []byte { return []byte{byte('a' + i)} }
	for iter := 0; iter < 2000; iter++ {
		var files []*FileMetadata
		k := 0
		seq := base.SeqNum(1000)
		for n := rng.IntN(8); n > 0 && k < 20; n-- {
			lo := k + rng.IntN(3)
			hi := lo + rng.IntN(3)
			if hi >= 20 {
				break
			}
			m := &FileMetadata{FileNum: FileNum(len(files) + 1),
				Smallest: base.MakeInternalKey(key(lo), seq, base.KindSet)}
			seq--
			switch rng.IntN(3) {
			case 0: // exclusive sentinel; the next file may start at hi
				if hi == lo {
					hi++
				}
				m.Largest = base.MakeRangeDeleteSentinel(key(hi))
				k = hi
			case 1: // shares its last user key with the next file
				m.Largest = base.MakeInternalKey(key(hi), seq, base.KindSet)
				seq--
				k = hi
			default:
				m.Largest = base.MakeInternalKey(key(hi), seq, base.KindSet)
				seq--
				k = hi + 1
			}
			m.SmallestSeq, m.LargestSeq = 0, 1000
			files = append(files, m)
		}
		v, err := NewVersion([NumLevels][]*FileMetadata{1: files})
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		for q := 0; q < 20; q++ {
			lo := rng.IntN(22)
			hi := lo + rng.IntN(5)
			var want []*FileMetadata
			for _, f := range files {
				// Linear definition: some user key u in [lo,hi] lies in f.
				for u := lo; u <= hi; u++ {
					uk := key(u)
					inLo := bytes.Compare(f.Smallest.UserKey, uk) <= 0
					c := bytes.Compare(uk, f.Largest.UserKey)
					inHi := c < 0 || (c == 0 && !f.Largest.IsExclusiveSentinel())
					if inLo && inHi {
						want = append(want, f)
						break
					}
				}
			}
			got := v.Overlaps(1, key(lo), key(hi))
			if fileNums(got) != fileNums(want) {
				t.Fatalf("iteration %d: Overlaps(%s, %s) = %s, want %s\n%s", iter, key(lo), key(hi), fileNums(got), fileNums(want), v)
			}
		}
		v.Unref()
	}
}

func TestVersionConcurrentRefs(t *testing.T) {
	f := &FileMetadata{FileNum: 1, Smallest: base.MakeInternalKey([]byte("a"), 1, base.KindSet),
		Largest: base.MakeInternalKey([]byte("a"), 1, base.KindSet), SmallestSeq: 1, LargestSeq: 1}
	v, err := NewVersion([NumLevels][]*FileMetadata{0: {f}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var obsolete []*FileMetadata
	v.SetObsoleteFunc(func(files []*FileMetadata) {
		mu.Lock()
		obsolete = append(obsolete, files...)
		mu.Unlock()
	})
	var wg sync.WaitGroup
	for range 8 {
		v.Ref()
		wg.Go(func() {
			for range 1000 {
				v.Ref()
				_ = v.Overlaps(0, []byte("a"), []byte("b"))
				v.Unref()
			}
			v.Unref()
		})
	}
	v.Unref()
	wg.Wait()
	if len(obsolete) != 1 || obsolete[0] != f || f.Refs() != 0 {
		t.Fatalf("obsolete %v, refs %d", obsolete, f.Refs())
	}
}
