// Package compact chooses compactions: which files of which levels to merge
// into which level, when, and which compactions may run at once. Two styles
// exist (Options.Style): Leveled, described here, and Universal, which
// merges whole sorted runs (see Universal).
//
// Level sizing follows the dynamic level size adaptation of the RocksDB
// space-amplification paper (§3.1): level targets are derived from the size
// of the last level rather than fixed, so that the levels above it hold about
// 1/(multiplier-1) of its size and space amplification stays near 1.11 for a
// multiplier of 10. L0 compacts directly into the base level, the deepest
// level whose target still fits Options.LBaseMaxBytes; the levels between L0
// and the base level stay empty. As the data grows, the base level moves up
// (L6, then L5, ...).
//
// The package only decides; it does not read or write files, and it never
// modifies the LevelsView or the FileMetadata it is given. The caller (the
// DB) marks the chosen files Compacting, runs the compaction, installs the
// resulting version and clears the flags.
package compact

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/shale-db/shale/storage/manifest"
)

// ErrConflict is returned (possibly wrapped, test with errors.Is) by
// PickManual when the requested compaction cannot start now because some of
// its files are already being compacted or because it would write a key range
// another running compaction writes. Retrying after running compactions
// finish can succeed.
var ErrConflict = errors.New("compact: conflicts with a running compaction")

// ErrInvalidArgument is returned (wrapped) by PickManual for a level outside
// [0, NumLevels), a nil view, or start > end.
var ErrInvalidArgument = errors.New("compact: invalid argument")

// LevelsView is the picker's input: the files of each level of one version.
// L0 is ordered newest first (LargestSeq descending) and its files may
// overlap; L1 and below are sorted by Smallest and do not overlap in
// internal-key order (adjacent files may share a boundary user key). The
// picker relies on these orderings, reads Compacting flags, and never
// modifies the view. Nil file pointers are ignored.
type LevelsView struct {
	Levels [manifest.NumLevels][]*manifest.FileMetadata
}

// Picker chooses compactions. It holds only its options: it keeps no state
// between calls, so it is safe for concurrent use, and each result depends
// only on the arguments of the call. The caller must keep the view, the
// Compacting flags and inProgress unchanged during a call (normally by
// holding its mutex), and mark a picked compaction's files before the next
// call.
type Picker struct {
	opts Options
}

// NewPicker returns a picker using a copy of opts with EnsureDefaults
// applied. Note that the zero Options selects static level sizing; start from
// DefaultOptions for the dynamic default.
func NewPicker(opts Options) *Picker {
	opts.EnsureDefaults()
	return &Picker{opts: opts}
}

// Options returns the options in effect (defaults applied).
func (p *Picker) Options() Options { return p.opts }

const lastLevel = manifest.NumLevels - 1

// levelState is everything derived from a view that the picking functions
// need.
type levelState struct {
	levels        [manifest.NumLevels][]*manifest.FileMetadata // without nil entries
	size          [manifest.NumLevels]uint64                   // all files
	uncompacted   [manifest.NumLevels]uint64                   // files not Compacting
	l0Uncompacted int
	base          int
	targets       [manifest.NumLevels]uint64
	scores        [manifest.NumLevels]float64
}

func (p *Picker) analyze(v *LevelsView) *levelState {
	st := &levelState{}
	if v != nil {
		for l := range v.Levels {
			st.levels[l] = withoutNil(v.Levels[l])
		}
	}
	for l, files := range st.levels {
		for _, f := range files {
			st.size[l] = satAdd(st.size[l], f.Size)
			if !f.Compacting {
				st.uncompacted[l] = satAdd(st.uncompacted[l], f.Size)
				if l == 0 {
					st.l0Uncompacted++
				}
			}
		}
	}
	var ideal int
	st.base, ideal, st.targets = p.levelTargets(&st.size)
	st.scores[0] = max(
		float64(st.l0Uncompacted)/float64(p.opts.L0CompactionTrigger),
		float64(st.uncompacted[0])/float64(p.opts.LBaseMaxBytes))
	for l := st.base; l < lastLevel; l++ {
		st.scores[l] = float64(st.uncompacted[l]) / float64(max(st.targets[l], 1))
		if l < ideal && st.uncompacted[l] > 0 {
			// A level above the ideal base level should be empty: keep it
			// draining (but let a more urgent L0 go first).
			st.scores[l] = max(st.scores[l], 1)
		}
	}
	return st
}

func withoutNil(files []*manifest.FileMetadata) []*manifest.FileMetadata {
	if !slices.Contains(files, nil) {
		return files
	}
	out := make([]*manifest.FileMetadata, 0, len(files))
	for _, f := range files {
		if f != nil {
			out = append(out, f)
		}
	}
	return out
}

// levelTargets computes the base level and per-level target sizes from the
// (total) level sizes.
//
// Dynamic sizing: the anchor is the size of the largest level among L1..L6
// (in a settled tree, the last level), but at least LBaseMaxBytes. The last
// level's target is the anchor and each level above gets the target of the
// level below divided by LevelMultiplier. The base level is the deepest level
// whose target is <= LBaseMaxBytes (at least L1; this is ideal), raised to
// the first non-empty level below L0 if that is higher: L0 data must never be
// placed below older data in a higher level. Levels from the raised base down
// to ideal keep their small computed targets and score at least 1 while
// non-empty (see analyze), so they drain and the base level moves back down
// to ideal once they are empty.
func (p *Picker) levelTargets(sizes *[manifest.NumLevels]uint64) (base, ideal int, targets [manifest.NumLevels]uint64) {
	m := p.opts.LevelMultiplier
	lbase := float64(p.opts.LBaseMaxBytes)
	if !p.opts.DynamicLevelBytes {
		t := lbase
		for l := 1; l < manifest.NumLevels; l++ {
			targets[l] = floatToUint(t)
			t *= m
		}
		return 1, 1, targets
	}
	firstNonEmpty := 0
	anchor := p.opts.LBaseMaxBytes
	for l := 1; l < manifest.NumLevels; l++ {
		if sizes[l] == 0 {
			continue
		}
		if firstNonEmpty == 0 {
			firstNonEmpty = l
		}
		anchor = max(anchor, sizes[l])
	}
	base = lastLevel
	t := float64(anchor)
	for base > 1 && t > lbase {
		base--
		t /= m
	}
	ideal = base
	if firstNonEmpty != 0 && firstNonEmpty < base {
		base = firstNonEmpty
	}
	t = float64(anchor)
	for l := lastLevel; l >= base; l-- {
		targets[l] = floatToUint(t)
		t /= m
	}
	return base, ideal, targets
}

// LevelTargets returns the level L0 compacts into and the target size of
// every level. targets[0] is 0 (L0 is scored by file count and
// LBaseMaxBytes), levels above baseLevel have target 0 (they should be
// empty), and targets[NumLevels-1] is informational: the last level is never
// compacted for size. Targets are computed from the total level sizes,
// including files being compacted. See Options.DynamicLevelBytes.
//
// With dynamic sizing the base level is the deepest level whose target fits
// LBaseMaxBytes, except that it is never below the first non-empty level
// under L0 (L0 data must not be placed below older data); such a raised base
// level keeps its small computed target and is drained.
//
// In the Universal style every target is 0 and the base level is the
// first non-empty level below L0 (the last level when there is none).
func (p *Picker) LevelTargets(v *LevelsView) (baseLevel int, targets [manifest.NumLevels]uint64) {
	st := p.analyze(v)
	if p.opts.Style == Universal {
		for l := 1; l < manifest.NumLevels; l++ {
			if len(st.levels[l]) > 0 || l == lastLevel {
				return l, targets
			}
		}
	}
	return st.base, st.targets
}

// Scores returns each level's compaction score; a level with score >= 1 needs
// compaction and Pick prefers higher scores. L0's score is the larger of
// (L0 files not being compacted) / L0CompactionTrigger and (their bytes) /
// LBaseMaxBytes. Levels from the base level to the second-to-last score
// (bytes not being compacted) / target; with dynamic sizing, a level that is
// the base level only because it is the first non-empty one (see
// LevelTargets) scores at least 1 while it holds such bytes, so that it
// drains. Levels above the base level and the last level score 0.
//
// In the Universal style only L0 has a score: the number of sorted runs
// over L0CompactionTrigger, or the size amplification over
// MaxSizeAmplificationPercent when that is larger.
func (p *Picker) Scores(v *LevelsView) [manifest.NumLevels]float64 {
	if p.opts.Style == Universal {
		return p.universalScores(p.analyze(v))
	}
	return p.analyze(v).scores
}

// EstimatedPendingCompactionBytes estimates the compaction debt: the bytes
// that compactions must still read and rewrite to bring every level within
// its target, counting files already being compacted (their work is not
// done). When L0 is due (file count >= L0CompactionTrigger or bytes >=
// LBaseMaxBytes), all of L0 and the base level are counted. Then, from the
// base level down to the second-to-last level, each level's excess over its
// target (including bytes pushed into it from above) is counted together
// with the proportional share of the next level it overlaps, and pushed down.
// The result is monotone in the excess and saturates at MaxUint64; it is 0
// when every level is within target.
//
// In the Universal style it is the bytes of the runs being compacted and of
// the runs the next compaction would merge (none below L0CompactionTrigger
// sorted runs).
func (p *Picker) EstimatedPendingCompactionBytes(v *LevelsView) uint64 {
	st := p.analyze(v)
	if p.opts.Style == Universal {
		return p.universalDebt(st)
	}
	var debt, incoming float64
	if len(st.levels[0]) >= p.opts.L0CompactionTrigger || st.size[0] >= p.opts.LBaseMaxBytes {
		debt = float64(st.size[0]) + float64(st.size[st.base])
		incoming = float64(st.size[0])
	}
	for l := st.base; l < lastLevel; l++ {
		size := float64(st.size[l]) + incoming
		incoming = 0
		target := float64(st.targets[l])
		if size <= target {
			continue
		}
		excess := size - target
		ratio := float64(st.size[l+1]) / size
		debt += excess * (1 + ratio)
		incoming = excess
	}
	return floatToUint(debt)
}

// Pick returns the most urgent compaction that can start now, or nil when no
// level has a score >= 1 that can be compacted, or when inProgress already
// holds MaxConcurrentCompactions compactions. inProgress lists the running
// compactions (nil entries are ignored); their input files must have
// Compacting set in v.
//
// Levels are tried in decreasing score order (ties: lower level first); the
// first level yielding a compaction that does not conflict wins. The returned
// compaction never includes a Compacting file, never writes a key range that
// a running compaction writes into the same level, and never starts from L0
// while another compaction from L0 runs (L0 files overlap, so two L0
// compactions could not be ordered). Compactions of other levels on disjoint
// files run concurrently, including with an L0 compaction.
//
// Within L0 the oldest file not being compacted seeds the input set, which
// is closed over overlapping L0 files. Within L1+ the input is chosen by the
// minimum overlap ratio: among all clean-cut units of the level (a file plus
// the neighbours it shares boundary user keys with) whose inputs are free and
// whose range does not conflict, the one whose overlapping output-level bytes
// divided by its own bytes is smallest, preferring units whose total stays
// within the MaxCompactionBytes cap, then the lowest keys. This minimises
// write amplification per byte moved down (RocksDB's kMinOverlappingRatio)
// at the cost of an O(n log n) scan of the level, and needs no cursor state.
// A chosen unit is then grown with further start-level files inside the
// compaction's range when that adds no output-level file and stays within
// the cap. A single-file input with no output-level overlap and at most
// MaxGrandparentOverlapBytes of grandparent overlap is returned as KindMove.
//
// In the Universal style Pick merges whole sorted runs instead (see
// pickUniversal); the promises on inputs, levels written and concurrency
// hold alike.
func (p *Picker) Pick(v *LevelsView, inProgress []*Compaction) *Compaction {
	if v == nil {
		return nil
	}
	if running(inProgress) >= p.opts.MaxConcurrentCompactions {
		return nil
	}
	st := p.analyze(v)
	if p.opts.Style == Universal {
		return p.pickUniversal(st, inProgress)
	}
	order := make([]int, 0, lastLevel)
	for l := 0; l < lastLevel; l++ {
		if st.scores[l] >= 1 {
			order = append(order, l)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case st.scores[a] > st.scores[b]:
			return -1
		case st.scores[a] < st.scores[b]:
			return 1
		}
		return 0
	})
	for _, l := range order {
		var c *Compaction
		if l == 0 {
			c = p.pickL0(st, inProgress)
		} else {
			c = p.pickLevel(st, l, inProgress)
		}
		if c != nil {
			c.Score = st.scores[l]
			return c
		}
	}
	return nil
}

// running counts the compactions of inProgress (nil entries ignored).
func running(inProgress []*Compaction) int {
	n := 0
	for _, c := range inProgress {
		if c != nil {
			n++
		}
	}
	return n
}

func l0InProgress(inProgress []*Compaction) bool {
	for _, c := range inProgress {
		if c != nil && c.StartLevel == 0 {
			return true
		}
	}
	return false
}

// conflicts reports whether a compaction writing outputLevel over s would run
// alongside one writing the same level over an overlapping range, or start
// from L0 while another L0 compaction runs.
func conflicts(inProgress []*Compaction, startLevel, outputLevel int, s span) bool {
	for _, c := range inProgress {
		if c == nil {
			continue
		}
		if startLevel == 0 && c.StartLevel == 0 {
			return true
		}
		if c.OutputLevel == outputLevel && c.span().overlaps(s) {
			return true
		}
	}
	return false
}

func (p *Picker) pickL0(st *levelState, inProgress []*Compaction) *Compaction {
	if l0InProgress(inProgress) {
		return nil
	}
	files := st.levels[0]
	tried := make([]bool, len(files))
	for i := len(files) - 1; i >= 0; i-- {
		if tried[i] || files[i].Compacting {
			continue
		}
		// The closure of any member of an overlap component is the whole
		// component, so each component is tried once.
		idx, _ := closureL0(files, fileSpan(files[i]))
		inputs := make([]*manifest.FileMetadata, 0, len(idx))
		for _, j := range idx {
			tried[j] = true
			inputs = append(inputs, files[j])
		}
		if c, ok := p.build(st, 0, st.base, inputs, inProgress, KindDefault); ok {
			return c
		}
	}
	return nil
}

func (p *Picker) pickLevel(st *levelState, level int, inProgress []*Compaction) *Compaction {
	out := level + 1
	files := st.levels[level]
	outFiles := st.levels[out]
	limit := p.opts.maxCompactionBytes(out)

	bestLo, bestHi := -1, -1
	var bestRatio float64
	var bestOver bool
	for i := 0; i < len(files); {
		lo, hi, _ := expandSorted(files, fileSpan(files[i]))
		next := max(hi, i+1)
		if lo < hi {
			unit := files[lo:hi]
			if !anyCompacting(unit) {
				smallest, largest, _ := keyBounds(unit)
				s := spanOfKeys(smallest, largest)
				olo, ohi, cover := expandSorted(outFiles, s)
				overlap := outFiles[olo:ohi]
				if !anyCompacting(overlap) && !conflicts(inProgress, level, out, cover) {
					inBytes, outBytes := totalSize(unit), totalSize(overlap)
					ratio := float64(outBytes) / float64(max(inBytes, 1))
					over := satAdd(inBytes, outBytes) > limit
					if bestLo < 0 || (bestOver && !over) || (bestOver == over && ratio < bestRatio) {
						bestLo, bestHi, bestRatio, bestOver = lo, hi, ratio, over
					}
				}
			}
		}
		i = next
	}
	if bestLo < 0 {
		return nil
	}
	c, ok := p.build(st, level, out, files[bestLo:bestHi], inProgress, KindDefault)
	if !ok {
		return nil
	}
	return p.grow(st, c, inProgress)
}

// grow widens a compaction's start inputs to every start-level file inside
// its full key range when that pulls in no further output-level file and the
// total stays within the cap: the extra files ride along for free.
func (p *Picker) grow(st *levelState, c *Compaction, inProgress []*Compaction) *Compaction {
	if c.Kind != KindDefault || len(c.OutputFiles()) == 0 || c.StartLevel == 0 {
		return c
	}
	files := st.levels[c.StartLevel]
	lo, hi, _ := expandSorted(files, c.span())
	grown := files[lo:hi]
	if len(grown) <= len(c.StartFiles()) || anyCompacting(grown) {
		return c
	}
	if satAdd(totalSize(grown), totalSize(c.OutputFiles())) > p.opts.maxCompactionBytes(c.OutputLevel) {
		return c
	}
	g, ok := p.build(st, c.StartLevel, c.OutputLevel, grown, inProgress, KindDefault)
	if !ok || len(g.OutputFiles()) != len(c.OutputFiles()) {
		return c
	}
	return g
}

// build completes a compaction from a clean-cut start input set: it adds the
// clean-cut output-level overlap, the grandparents, and the flags, and
// reports false if any input is Compacting or the range conflicts with
// inProgress.
func (p *Picker) build(
	st *levelState, start, out int, startFiles []*manifest.FileMetadata, inProgress []*Compaction, kind Kind,
) (*Compaction, bool) {
	if len(startFiles) == 0 || anyCompacting(startFiles) {
		return nil, false
	}
	c := &Compaction{Kind: kind, StartLevel: start, OutputLevel: out}
	c.Inputs = []LevelFiles{{Level: start, Files: slices.Clone(startFiles)}}
	var outFiles []*manifest.FileMetadata
	if out != start {
		smallest, largest, _ := keyBounds(startFiles)
		lo, hi, _ := expandSorted(st.levels[out], spanOfKeys(smallest, largest))
		if hi > lo {
			outFiles = slices.Clone(st.levels[out][lo:hi])
		}
		if anyCompacting(outFiles) {
			return nil, false
		}
		c.Inputs = append(c.Inputs, LevelFiles{Level: out, Files: outFiles})
	}
	c.Smallest, c.Largest, _ = keyBounds(startFiles, outFiles)
	s := c.span()
	if conflicts(inProgress, start, out, s) {
		return nil, false
	}
	if out < lastLevel {
		lo, hi := sortedOverlap(st.levels[out+1], s)
		if hi > lo {
			c.Grandparents = slices.Clone(st.levels[out+1][lo:hi])
		}
	}
	c.Bottommost = true
	for l := out + 1; l < manifest.NumLevels; l++ {
		if lo, hi := sortedOverlap(st.levels[l], s); hi > lo {
			c.Bottommost = false
			break
		}
	}
	c.MaxOutputFileSize = p.opts.TargetFileSize[out]
	c.MaxGrandparentOverlapBytes = satMul(c.MaxOutputFileSize, GrandparentOverlapFactor)
	if kind == KindDefault && start != out && len(startFiles) == 1 && len(outFiles) == 0 &&
		totalSize(c.Grandparents) <= c.MaxGrandparentOverlapBytes {
		c.Kind = KindMove
	}
	return c, true
}

// PickPeriodic returns a compaction of the oldest file written at or before
// cutoff (Unix seconds), so that data written long ago is read and rewritten
// (and a compaction filter sees it, RocksDB's periodic and TTL compaction):
// an L0 file with the L0 files it overlaps into the base level, a file of
// L1..L5 into the next level, a file of the last level rewritten in place;
// each expanded to a clean cut like any compaction. Files whose
// CreationTime is 0 (unknown) are never chosen. It returns nil when no such
// file can be compacted now (its inputs busy, a conflicting compaction
// running, or MaxConcurrentCompactions reached). The result is KindPeriodic.
func (p *Picker) PickPeriodic(v *LevelsView, inProgress []*Compaction, cutoff int64) *Compaction {
	if v == nil || running(inProgress) >= p.opts.MaxConcurrentCompactions {
		return nil
	}
	if p.opts.Style == Universal {
		return p.pickUniversalPeriodic(p.analyze(v), inProgress, cutoff)
	}
	type candidate struct {
		f     *manifest.FileMetadata
		level int
	}
	var old []candidate
	for level, files := range v.Levels {
		for _, f := range files {
			if f != nil && !f.Compacting && f.CreationTime != 0 && f.CreationTime <= cutoff {
				old = append(old, candidate{f, level})
			}
		}
	}
	if len(old) == 0 {
		return nil
	}
	slices.SortStableFunc(old, func(a, b candidate) int {
		return cmp.Compare(a.f.CreationTime, b.f.CreationTime)
	})
	st := p.analyze(v)
	for _, c := range old {
		files := st.levels[c.level]
		s := spanOfKeys(c.f.Smallest, c.f.Largest)
		var inputs []*manifest.FileMetadata
		out := c.level + 1
		switch c.level {
		case 0:
			if l0InProgress(inProgress) {
				continue
			}
			out = st.base
			idx, _ := closureL0(files, s)
			for _, j := range idx {
				inputs = append(inputs, files[j])
			}
		case lastLevel:
			out = lastLevel
			fallthrough
		default:
			lo, hi, _ := expandSorted(files, s)
			inputs = files[lo:hi]
		}
		if comp, ok := p.build(st, c.level, out, inputs, inProgress, KindPeriodic); ok {
			comp.Score = st.scores[c.level]
			return comp
		}
	}
	return nil
}

// AtRestL0Bytes returns the bytes in L0 when they are more than
// 1/LevelMultiplier of the bytes in the levels below it, and 0 otherwise or
// in the Universal style. A leveled LSM whose levels are each
// LevelMultiplier times the one above keeps its space amplification within
// 1 + 1/(LevelMultiplier-1), about 1.11 with the default; L0, which gathers
// up to L0CompactionTrigger flushes while writes go on, is what can break
// that bound on a DB whose writes have stopped (PickAtRest).
func (p *Picker) AtRestL0Bytes(v *LevelsView) uint64 {
	if v == nil || p.opts.Style == Universal {
		return 0
	}
	st := p.analyze(v)
	return p.atRestL0Bytes(st)
}

func (p *Picker) atRestL0Bytes(st *levelState) uint64 {
	var below uint64
	for l := 1; l < manifest.NumLevels; l++ {
		below = satAdd(below, st.size[l])
	}
	if st.size[0] == 0 || float64(st.size[0])*p.opts.LevelMultiplier <= float64(below) {
		return 0
	}
	return st.size[0]
}

// PickAtRest returns a compaction of L0 into the base level for a DB whose
// writes have stopped, when L0 holds more than 1/LevelMultiplier of the
// bytes below it (AtRestL0Bytes > 0) although no L0 compaction is due, so
// that the data is not kept twice, and read twice, for as long as the DB
// stays idle. The inputs are the overlap component of the oldest free L0
// file, as for Pick; called again, it takes the next one. It returns nil in
// the Universal style, when L0 is within that bound, when another L0
// compaction runs, or when MaxConcurrentCompactions compactions run. The
// result is KindDefault, or KindMove for a single file that overlaps nothing
// in the base level.
func (p *Picker) PickAtRest(v *LevelsView, inProgress []*Compaction) *Compaction {
	if v == nil || p.opts.Style == Universal || running(inProgress) >= p.opts.MaxConcurrentCompactions {
		return nil
	}
	st := p.analyze(v)
	if p.atRestL0Bytes(st) == 0 {
		return nil
	}
	c := p.pickL0(st, inProgress)
	if c != nil {
		c.Score = st.scores[0]
	}
	return c
}

// PickManual returns a compaction for CompactRange: the files of level
// sharing a user key with [start, end] (inclusive; a nil bound is unbounded),
// expanded to a clean cut, compacted into the next level (the base level for
// L0). For the last level the files are rewritten in place (StartLevel ==
// OutputLevel), e.g. to drop tombstones or apply a compaction filter.
//
// It returns (nil, nil) when no file of level overlaps the range, and an
// error wrapping ErrConflict when an input is already being compacted, when
// the range conflicts with a running compaction writing the same level, or
// when level is 0 and another L0 compaction runs. It ignores scores and
// MaxConcurrentCompactions. The result is always KindManual.
//
// For levels 1..NumLevels-2 a large range is compacted in steps: the result
// covers the longest prefix of clean-cut units whose input (both levels)
// fits MaxCompactionBytes, at least one unit. Each finished step removes its
// files from level, so callers loop — pick, run, install — until PickManual
// returns nil. L0 (whose overlapping files must go together) and the last
// level (whose files stay in it, so the caller runs it once) are never
// split.
func (p *Picker) PickManual(
	v *LevelsView, level int, start, end []byte, inProgress []*Compaction,
) (*Compaction, error) {
	if v == nil {
		return nil, fmt.Errorf("%w: nil view", ErrInvalidArgument)
	}
	if level < 0 || level >= manifest.NumLevels {
		return nil, fmt.Errorf("%w: level %d", ErrInvalidArgument, level)
	}
	if start != nil && end != nil && bytes.Compare(start, end) > 0 {
		return nil, fmt.Errorf("%w: start %q > end %q", ErrInvalidArgument, start, end)
	}
	s := span{start: start, end: end, unboundedStart: start == nil, unboundedEnd: end == nil}
	st := p.analyze(v)
	if p.opts.Style == Universal {
		return p.pickUniversalManual(st, level, s, inProgress)
	}
	files := st.levels[level]

	var inputs []*manifest.FileMetadata
	var out int
	switch level {
	case 0:
		out = st.base
		idx, _ := closureL0(files, s)
		for _, j := range idx {
			inputs = append(inputs, files[j])
		}
		if len(inputs) > 0 && l0InProgress(inProgress) {
			return nil, fmt.Errorf("%w: another L0 compaction is running", ErrConflict)
		}
	case lastLevel:
		out = lastLevel
		lo, hi, _ := expandSorted(files, s)
		inputs = files[lo:hi]
	default:
		out = level + 1
		lo, hi, _ := expandSorted(files, s)
		inputs = p.manualPrefix(st, files, lo, hi, out)
	}
	if len(inputs) == 0 {
		return nil, nil
	}
	for _, f := range inputs {
		if f.Compacting {
			return nil, fmt.Errorf("%w: L%d file %s is being compacted", ErrConflict, level, f.FileNum)
		}
	}
	c, ok := p.build(st, level, out, inputs, inProgress, KindManual)
	if !ok {
		return nil, fmt.Errorf("%w: L%d->L%d over the range is blocked by a running compaction",
			ErrConflict, level, out)
	}
	c.Score = st.scores[level]
	return c, nil
}

// manualPrefix returns the longest prefix of clean-cut units of files[lo:hi]
// whose input bytes (with the output-level overlap) fit the cap, and at least
// the first unit.
func (p *Picker) manualPrefix(st *levelState, files []*manifest.FileMetadata, lo, hi, out int) []*manifest.FileMetadata {
	if lo >= hi {
		return nil
	}
	limit := p.opts.maxCompactionBytes(out)
	end := -1
	for i := lo; i < hi; {
		_, uhi, _ := expandSorted(files, fileSpan(files[i]))
		uhi = min(max(uhi, i+1), hi)
		prefix := files[lo:uhi]
		smallest, largest, _ := keyBounds(prefix)
		olo, ohi, _ := expandSorted(st.levels[out], spanOfKeys(smallest, largest))
		if end >= 0 && satAdd(totalSize(prefix), totalSize(st.levels[out][olo:ohi])) > limit {
			break
		}
		end = uhi
		i = uhi
	}
	return files[lo:end]
}
