package compact

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
)

// The datadriven scripts under testdata/ use these commands:
//
//	define [l0-trigger=N] [lbase=SIZE] [multiplier=F] [dynamic=BOOL]
//	       [max-concurrent=N] [target-file-size=SIZE] [max-compaction-bytes=SIZE]
//	L<n>: <filenum>:[<key>-<key>] size=SIZE [compacting] [seqs=LO-HI]
//	...
//	    Replaces the view and forgets running compactions. Keys are
//	    "userkey#seq,KIND"; seq may be "inf" (MaxSeqNum), so "k#inf,RANGEDEL"
//	    is the exclusive sentinel at k. L0 is sorted newest first (LargestSeq
//	    desc), other levels by Smallest. SIZE accepts K, M, G suffixes.
//	    dynamic defaults to true.
//	pick [dry]                     Pick; unless dry, register the result as running.
//	pick-manual level=N [start=K] [end=K] [dry]
//	finish [id=N]                  Finish one running compaction (all when no id).
//	targets | scores | pending     LevelTargets, Scores, EstimatedPendingCompactionBytes.
//	split id=N                     Feed "key size" lines to ShouldSplitBefore.
//	running                        List running compactions.

type ddState struct {
	picker  *Picker
	view    LevelsView
	running map[int]*Compaction
	nextID  int
}

func (s *ddState) inProgress() []*Compaction {
	ids := make([]int, 0, len(s.running))
	for id := range s.running {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]*Compaction, 0, len(ids))
	for _, id := range ids {
		out = append(out, s.running[id])
	}
	return out
}

func (s *ddState) register(c *Compaction) int {
	s.nextID++
	s.running[s.nextID] = c
	for _, in := range c.Inputs {
		for _, f := range in.Files {
			f.Compacting = true
		}
	}
	return s.nextID
}

func (s *ddState) finish(id int) {
	c := s.running[id]
	if c == nil {
		return
	}
	for _, in := range c.Inputs {
		for _, f := range in.Files {
			f.Compacting = false
		}
	}
	delete(s.running, id)
}

func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var s *ddState
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "define" && s == nil {
				d.Fatalf(t, "define first")
			}
			switch d.Cmd {
			case "define":
				opts, err := parseDefineOptions(d)
				if err != nil {
					return err.Error()
				}
				view, err := parseView(d.Input)
				if err != nil {
					return err.Error()
				}
				s = &ddState{picker: NewPicker(opts), view: view, running: map[int]*Compaction{}}
				return formatView(&s.view)

			case "pick":
				c := s.picker.Pick(&s.view, s.inProgress())
				if c == nil {
					return "nil"
				}
				return s.describe(c, d.HasArg("dry"))

			case "pick-manual":
				var level int
				d.ScanArgs(t, "level", &level)
				var start, end []byte
				if arg, ok := d.Arg("start"); ok {
					start = []byte(arg.SingleVal(t))
				}
				if arg, ok := d.Arg("end"); ok {
					end = []byte(arg.SingleVal(t))
				}
				c, err := s.picker.PickManual(&s.view, level, start, end, s.inProgress())
				if err != nil {
					kind := "error"
					if errors.Is(err, ErrConflict) {
						kind = "conflict"
					}
					return fmt.Sprintf("%s: %v", kind, err)
				}
				if c == nil {
					return "nil"
				}
				return s.describe(c, d.HasArg("dry"))

			case "finish":
				if arg, ok := d.Arg("id"); ok {
					id, err := strconv.Atoi(arg.SingleVal(t))
					if err != nil {
						d.Fatalf(t, "%v", err)
					}
					s.finish(id)
				} else {
					for id := range s.running {
						s.finish(id)
					}
				}
				return fmt.Sprintf("running: %d", len(s.running))

			case "running":
				var b strings.Builder
				for _, id := range slices.Sorted(maps.Keys(s.running)) {
					fmt.Fprintf(&b, "#%d %s\n", id, s.running[id])
				}
				return b.String()

			case "targets":
				baseLevel, targets := s.picker.LevelTargets(&s.view)
				var b strings.Builder
				fmt.Fprintf(&b, "base: L%d\n", baseLevel)
				for l := 1; l < manifest.NumLevels; l++ {
					fmt.Fprintf(&b, "L%d: size=%s target=%s\n", l, fmtSize(levelSize(&s.view, l)), fmtSize(targets[l]))
				}
				return b.String()

			case "scores":
				scores := s.picker.Scores(&s.view)
				var b strings.Builder
				for l, sc := range scores {
					fmt.Fprintf(&b, "L%d: %.2f\n", l, sc)
				}
				return b.String()

			case "pending":
				return fmtSize(s.picker.EstimatedPendingCompactionBytes(&s.view))

			case "split":
				var id int
				d.ScanArgs(t, "id", &id)
				c := s.running[id]
				if c == nil {
					return "no such compaction"
				}
				var b strings.Builder
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					fields := strings.Fields(line)
					if len(fields) != 2 {
						d.Fatalf(t, "bad split line %q", line)
					}
					size, err := parseSize(fields[1])
					if err != nil {
						d.Fatalf(t, "%v", err)
					}
					res := "-"
					if c.ShouldSplitBefore([]byte(fields[0]), size) {
						res = "split"
					}
					fmt.Fprintf(&b, "%s %s: %s\n", fields[0], fields[1], res)
				}
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func levelSize(v *LevelsView, l int) uint64 {
	var n uint64
	for _, f := range v.Levels[l] {
		n += f.Size
	}
	return n
}

func (s *ddState) describe(c *Compaction, dry bool) string {
	var b strings.Builder
	if !dry {
		fmt.Fprintf(&b, "#%d ", s.register(c))
	}
	fmt.Fprintf(&b, "L%d->L%d %s score=%.2f", c.StartLevel, c.OutputLevel, c.Kind, c.Score)
	if c.Bottommost {
		b.WriteString(" bottommost")
	}
	b.WriteString("\n")
	for _, lf := range c.Inputs {
		in := lf.Files
		if len(in) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  L%d:", lf.Level)
		for _, f := range in {
			fmt.Fprintf(&b, " %s", f.FileNum)
		}
		b.WriteString("\n")
	}
	if len(c.Grandparents) > 0 {
		b.WriteString("  grandparents:")
		for _, f := range c.Grandparents {
			fmt.Fprintf(&b, " %s", f.FileNum)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  range: %s-%s input=%s max-output=%s\n",
		c.Smallest, c.Largest, fmtSize(c.InputBytes()), fmtSize(c.MaxOutputFileSize))
	return b.String()
}

func parseDefineOptions(d *datadriven.TestData) (Options, error) {
	// The scenarios were written with a 64 MiB base level (the default
	// then); lbase= sets another.
	opts := Options{DynamicLevelBytes: true, LBaseMaxBytes: 64 << 20}
	for _, arg := range d.CmdArgs {
		if len(arg.Vals) != 1 {
			return opts, fmt.Errorf("argument %s needs one value", arg.Key)
		}
		val := arg.Vals[0]
		var err error
		switch arg.Key {
		case "l0-trigger":
			opts.L0CompactionTrigger, err = strconv.Atoi(val)
		case "lbase":
			opts.LBaseMaxBytes, err = parseSize(val)
		case "multiplier":
			opts.LevelMultiplier, err = strconv.ParseFloat(val, 64)
		case "dynamic":
			opts.DynamicLevelBytes, err = strconv.ParseBool(val)
		case "max-concurrent":
			opts.MaxConcurrentCompactions, err = strconv.Atoi(val)
		case "target-file-size":
			opts.TargetFileSize[0], err = parseSize(val)
		case "max-compaction-bytes":
			opts.MaxCompactionBytes, err = parseSize(val)
		default:
			return opts, fmt.Errorf("unknown argument %s", arg.Key)
		}
		if err != nil {
			return opts, err
		}
	}
	return opts, nil
}

// parseView parses the define input; see the command list above.
func parseView(input string) (LevelsView, error) {
	var v LevelsView
	for _, line := range strings.Split(input, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		lvlStr, rest, ok := strings.Cut(line, ":")
		if !ok || len(lvlStr) != 2 || lvlStr[0] != 'L' {
			return v, fmt.Errorf("bad line %q", line)
		}
		level := int(lvlStr[1] - '0')
		if level < 0 || level >= manifest.NumLevels {
			return v, fmt.Errorf("bad level in %q", line)
		}
		f, err := parseFile(strings.TrimSpace(rest))
		if err != nil {
			return v, fmt.Errorf("%q: %v", line, err)
		}
		v.Levels[level] = append(v.Levels[level], f)
	}
	sortView(&v)
	return v, nil
}

func sortView(v *LevelsView) {
	slices.SortStableFunc(v.Levels[0], func(a, b *manifest.FileMetadata) int {
		if a.LargestSeq != b.LargestSeq {
			if a.LargestSeq > b.LargestSeq {
				return -1
			}
			return 1
		}
		if a.FileNum > b.FileNum {
			return -1
		}
		if a.FileNum < b.FileNum {
			return 1
		}
		return 0
	})
	for l := 1; l < manifest.NumLevels; l++ {
		slices.SortStableFunc(v.Levels[l], func(a, b *manifest.FileMetadata) int {
			return base.CompareInternal(a.Smallest, b.Smallest)
		})
	}
}

func parseFile(s string) (*manifest.FileMetadata, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, fmt.Errorf("empty file")
	}
	numStr, bounds, ok := strings.Cut(fields[0], ":")
	if !ok || !strings.HasPrefix(bounds, "[") || !strings.HasSuffix(bounds, "]") {
		return nil, fmt.Errorf("want NNNNNN:[key-key], got %q", fields[0])
	}
	num, err := strconv.ParseUint(numStr, 10, 64)
	if err != nil {
		return nil, err
	}
	bounds = bounds[1 : len(bounds)-1]
	// Split at the '-' that follows ",KIND" of the first key.
	comma := strings.IndexByte(bounds, ',')
	if comma < 0 {
		return nil, fmt.Errorf("bad bounds %q", bounds)
	}
	dash := strings.IndexByte(bounds[comma:], '-')
	if dash < 0 {
		return nil, fmt.Errorf("bad bounds %q", bounds)
	}
	smallest, err := parseKey(bounds[:comma+dash])
	if err != nil {
		return nil, err
	}
	largest, err := parseKey(bounds[comma+dash+1:])
	if err != nil {
		return nil, err
	}
	f := &manifest.FileMetadata{FileNum: manifest.FileNum(num), Smallest: smallest, Largest: largest}
	f.SmallestSeq, f.LargestSeq = base.MaxSeqNum, 0
	for _, k := range []base.InternalKey{smallest, largest} {
		if k.IsExclusiveSentinel() {
			continue
		}
		f.SmallestSeq = min(f.SmallestSeq, k.SeqNum())
		f.LargestSeq = max(f.LargestSeq, k.SeqNum())
	}
	if f.SmallestSeq > f.LargestSeq {
		f.SmallestSeq = f.LargestSeq
	}
	for _, field := range fields[1:] {
		key, val, _ := strings.Cut(field, "=")
		switch key {
		case "size":
			if f.Size, err = parseSize(val); err != nil {
				return nil, err
			}
		case "compacting":
			f.Compacting = true
		case "seqs":
			lo, hi, _ := strings.Cut(val, "-")
			a, err1 := strconv.ParseUint(lo, 10, 64)
			b, err2 := strconv.ParseUint(hi, 10, 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("bad seqs %q", val)
			}
			f.SmallestSeq, f.LargestSeq = base.SeqNum(a), base.SeqNum(b)
		default:
			return nil, fmt.Errorf("unknown file attribute %q", field)
		}
	}
	return f, nil
}

func parseKey(s string) (base.InternalKey, error) {
	i := strings.LastIndexByte(s, '#')
	if i < 0 {
		return base.InternalKey{}, fmt.Errorf("bad key %q", s)
	}
	seqStr, kindStr, ok := strings.Cut(s[i+1:], ",")
	if !ok {
		return base.InternalKey{}, fmt.Errorf("bad key %q", s)
	}
	var seq base.SeqNum
	if seqStr == "inf" {
		seq = base.MaxSeqNum
	} else {
		n, err := strconv.ParseUint(seqStr, 10, 64)
		if err != nil {
			return base.InternalKey{}, err
		}
		seq = base.SeqNum(n)
	}
	kinds := map[string]base.Kind{
		"SET": base.KindSet, "DEL": base.KindDelete, "MERGE": base.KindMerge,
		"RANGEDEL": base.KindRangeDelete, "MAX": base.KindMax,
	}
	kind, ok := kinds[kindStr]
	if !ok {
		return base.InternalKey{}, fmt.Errorf("bad kind %q", kindStr)
	}
	return base.MakeInternalKey([]byte(s[:i]), seq, kind), nil
}

func parseSize(s string) (uint64, error) {
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, err
	}
	return uint64(math.Round(f * float64(mult))), nil
}

// fmtSize renders bytes with K/M/G units and up to one decimal.
func fmtSize(n uint64) string {
	units := []struct {
		suffix string
		size   uint64
	}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}}
	for _, u := range units {
		if n >= u.size {
			v := float64(n) / float64(u.size)
			if v == math.Trunc(v) {
				return fmt.Sprintf("%d%s", uint64(v), u.suffix)
			}
			return fmt.Sprintf("%.1f%s", v, u.suffix)
		}
	}
	return strconv.FormatUint(n, 10)
}

func formatView(v *LevelsView) string {
	var b strings.Builder
	for l, files := range v.Levels {
		if len(files) == 0 {
			continue
		}
		fmt.Fprintf(&b, "L%d:", l)
		for _, f := range files {
			fmt.Fprintf(&b, " %s", f.FileNum)
		}
		fmt.Fprintf(&b, " (%s)\n", fmtSize(levelSize(v, l)))
	}
	if b.Len() == 0 {
		return "empty"
	}
	return b.String()
}
