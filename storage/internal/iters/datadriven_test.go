package iters

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/shale-db/shale/storage/internal/base"
)

// parseKey parses "userkey#seq,KIND"; seq may be "inf" (base.MaxSeqNum).
func parseKey(s string) (base.InternalKey, error) {
	uk, rest, ok := strings.Cut(s, "#")
	if !ok {
		return base.InternalKey{}, fmt.Errorf("key %q: missing #", s)
	}
	seqStr, kindStr, ok := strings.Cut(rest, ",")
	if !ok {
		return base.InternalKey{}, fmt.Errorf("key %q: missing kind", s)
	}
	var seq base.SeqNum
	if seqStr == "inf" {
		seq = base.MaxSeqNum
	} else {
		n, err := strconv.ParseUint(seqStr, 10, 64)
		if err != nil {
			return base.InternalKey{}, fmt.Errorf("key %q: %v", s, err)
		}
		seq = base.SeqNum(n)
	}
	kinds := map[string]base.Kind{
		"SET": base.KindSet, "DEL": base.KindDelete, "MERGE": base.KindMerge,
		"RANGEDEL": base.KindRangeDelete, "LOGDATA": base.KindLogData, "MAX": base.KindMax,
	}
	kind, ok := kinds[kindStr]
	if !ok {
		return base.InternalKey{}, fmt.Errorf("key %q: unknown kind %q", s, kindStr)
	}
	return base.MakeInternalKey([]byte(uk), seq, kind), nil
}

// parseEntry parses "userkey#seq,KIND[=value]".
func parseEntry(s string) (entry, error) {
	k, v, _ := strings.Cut(s, "=")
	ik, err := parseKey(k)
	if err != nil {
		return entry{}, err
	}
	return entry{ik, []byte(v)}, nil
}

// scriptIter is the positioning surface shared by DBIter and the internal
// iterators, for the scripted operations.
type scriptIter interface {
	SeekGE([]byte) bool
	SeekLT([]byte) bool
	First() bool
	Last() bool
	Next() bool
	Prev() bool
	Error() error
}

// runOps runs one operation per line of input on it; format renders the
// current position, and prefix (when not nil) what precedes every result.
func runOps(t *testing.T, input string, it scriptIter, prefix, format func() string, extra func(op string) (string, bool)) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var ok bool
		switch fields[0] {
		case "first":
			ok = it.First()
		case "last":
			ok = it.Last()
		case "next":
			ok = it.Next()
		case "prev":
			ok = it.Prev()
		case "seek-ge", "seek-lt":
			if len(fields) != 2 {
				t.Fatalf("%s: want one key", line)
			}
			if fields[0] == "seek-ge" {
				ok = it.SeekGE([]byte(fields[1]))
			} else {
				ok = it.SeekLT([]byte(fields[1]))
			}
		default:
			if s, handled := extra(fields[0]); handled {
				b.WriteString(s)
				continue
			}
			t.Fatalf("unknown operation %q", line)
		}
		if prefix != nil {
			b.WriteString(prefix())
		}
		switch {
		case ok:
			b.WriteString(format())
		case it.Error() != nil:
			fmt.Fprintf(&b, "err: %v", it.Error())
		default:
			b.WriteString(".")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestDataDrivenDBIter(t *testing.T) {
	var es []entry
	var tombs naiveCovering
	datadriven.RunTest(t, "testdata/db_iter", func(t *testing.T, td *datadriven.TestData) string {
		switch td.Cmd {
		case "define":
			es, tombs = nil, nil
			for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
				line = strings.TrimSpace(line)
				if line == "" {
					continue
				}
				if rest, ok := strings.CutPrefix(line, "rangedel "); ok {
					// rangedel start-end#seq
					span, seqStr, _ := strings.Cut(rest, "#")
					start, end, _ := strings.Cut(span, "-")
					seq, err := strconv.ParseUint(seqStr, 10, 64)
					if err != nil {
						return err.Error()
					}
					tombs = append(tombs, tombstone{[]byte(start), []byte(end), base.SeqNum(seq)})
					continue
				}
				e, err := parseEntry(line)
				if err != nil {
					return err.Error()
				}
				es = append(es, e)
			}
			sortEntries(es)
			return ""

		case "iter":
			opts := DBIterOptions{SeqNum: base.MaxSeqNum, Merger: concatMerger{}}
			if len(tombs) > 0 {
				opts.RangeDels = tombs
			}
			children := 1
			for _, arg := range td.CmdArgs {
				v := ""
				if len(arg.Vals) > 0 {
					v = arg.Vals[0]
				}
				switch arg.Key {
				case "seq":
					n, err := strconv.ParseUint(v, 10, 64)
					if err != nil {
						return err.Error()
					}
					opts.SeqNum = base.SeqNum(n)
				case "lower":
					opts.Lower = []byte(v)
				case "upper":
					opts.Upper = []byte(v)
				case "merger":
					if v == "none" {
						opts.Merger = nil
					}
				case "children":
					n, err := strconv.Atoi(v)
					if err != nil || n < 1 {
						return fmt.Sprintf("bad children %q", v)
					}
					children = n
				default:
					return fmt.Sprintf("unknown argument %q", arg.Key)
				}
			}
			// Entries are dealt round-robin to the children.
			parts := make([][]entry, children)
			for i, e := range es {
				parts[i%children] = append(parts[i%children], e)
			}
			var iters []base.InternalIterator
			for _, p := range parts {
				iters = append(iters, sliceIterOf(p))
			}
			d := NewDBIter(NewMergingIter(iters...), opts)
			defer d.Close()
			return runOps(t, td.Input, d, nil,
				func() string { return fmt.Sprintf("%s: %s", d.Key(), d.Value()) },
				func(op string) (string, bool) {
					if op != "stats" {
						return "", false
					}
					s := d.Stats()
					return fmt.Sprintf("stats: nexts=%d prevs=%d seeks=%d merges=%d\n", s.Nexts, s.Prevs, s.Seeks, s.Merges), true
				})
		}
		return fmt.Sprintf("unknown command %q", td.Cmd)
	})
}

func TestDataDrivenLevelIter(t *testing.T) {
	var files []FileBounds
	var contents [][]entry
	datadriven.RunTest(t, "testdata/level_iter", func(t *testing.T, td *datadriven.TestData) string {
		switch td.Cmd {
		case "define":
			// One file per line: "smallest largest: entry entry ...".
			files, contents = nil, nil
			for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
				bounds, body, _ := strings.Cut(line, ":")
				bf := strings.Fields(bounds)
				if len(bf) != 2 {
					return fmt.Sprintf("bad file line %q", line)
				}
				sm, err := parseKey(bf[0])
				if err != nil {
					return err.Error()
				}
				lg, err := parseKey(bf[1])
				if err != nil {
					return err.Error()
				}
				var es []entry
				for _, f := range strings.Fields(body) {
					e, err := parseEntry(f)
					if err != nil {
						return err.Error()
					}
					es = append(es, e)
				}
				files = append(files, FileBounds{sm, lg})
				contents = append(contents, es)
			}
			return ""

		case "iter":
			var lower, upper []byte
			for _, arg := range td.CmdArgs {
				switch arg.Key {
				case "lower":
					lower = []byte(arg.Vals[0])
				case "upper":
					upper = []byte(arg.Vals[0])
				default:
					return fmt.Sprintf("unknown argument %q", arg.Key)
				}
			}
			var log strings.Builder
			var openCount int
			l := NewLevelIter(files, func(i int, _, _ []byte) (base.InternalIterator, error) {
				fmt.Fprintf(&log, "open(%d) ", i)
				openCount++
				return &trackingIter{InternalIterator: sliceIterOf(contents[i]), open: &openCount}, nil
			}, lower, upper)
			out := runOps(t, td.Input, l,
				func() string {
					s := log.String()
					log.Reset()
					return s
				},
				func() string { return fmt.Sprintf("%s=%s", l.Key(), l.Value()) },
				func(string) (string, bool) { return "", false })
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if openCount != 0 {
				t.Fatalf("%d files left open", openCount)
			}
			return out
		}
		return fmt.Sprintf("unknown command %q", td.Cmd)
	})
}
