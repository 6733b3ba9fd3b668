package compact

import (
	"fmt"
	"math"

	"github.com/shale-db/shale/storage/manifest"
)

// Style is a compaction style: how the picker shapes the tree.
type Style int

const (
	// Leveled keeps one sorted run per level below L0, each level a fixed
	// multiple of the one above (the default; see the package comment).
	Leveled Style = iota
	// Universal (RocksDB's universal, or tiered, compaction) treats each L0
	// file and each non-empty level below L0 as one sorted run, ordered from
	// newest to oldest, and merges runs of similar size whole: fewer
	// rewrites of each byte than leveled compaction (lower write
	// amplification), at the cost of up to MaxSizeAmplificationPercent of
	// extra space before a full compaction and more runs to read.
	Universal
)

// String returns "leveled" or "universal".
func (s Style) String() string {
	switch s {
	case Leveled:
		return "leveled"
	case Universal:
		return "universal"
	}
	return fmt.Sprintf("style(%d)", int(s))
}

// Defaults of UniversalOptions.
const (
	// DefaultUniversalSizeRatio is the default UniversalOptions.SizeRatio.
	DefaultUniversalSizeRatio = 1
	// DefaultUniversalMinMergeWidth is the default
	// UniversalOptions.MinMergeWidth.
	DefaultUniversalMinMergeWidth = 2
	// DefaultUniversalMaxSizeAmplificationPercent is the default
	// UniversalOptions.MaxSizeAmplificationPercent.
	DefaultUniversalMaxSizeAmplificationPercent = 200
)

// UniversalOptions tune the Universal style; Options.L0CompactionTrigger is
// its trigger: the number of sorted runs at which compaction starts.
type UniversalOptions struct {
	// SizeRatio (percent) lets a run join a merge of the newer runs before
	// it while its size is at most their total times (100+SizeRatio)/100.
	// Default 1.
	SizeRatio int
	// MinMergeWidth is the fewest runs a size-ratio merge combines.
	// Default 2; at least 2.
	MinMergeWidth int
	// MaxMergeWidth caps the runs a size-ratio or run-count merge combines.
	// Zero means no cap; otherwise at least MinMergeWidth.
	MaxMergeWidth int
	// MaxSizeAmplificationPercent: when the runs above the oldest hold more
	// than this percentage of the oldest run's bytes, every run is merged
	// into one (a full compaction). Default 200.
	MaxSizeAmplificationPercent int
}

// EnsureDefaults replaces zero or invalid fields with their defaults (see
// each field); it is idempotent.
func (u *UniversalOptions) EnsureDefaults() {
	if u.SizeRatio < 0 {
		u.SizeRatio = 0
	}
	if u.SizeRatio == 0 {
		u.SizeRatio = DefaultUniversalSizeRatio
	}
	if u.MinMergeWidth < 2 {
		u.MinMergeWidth = DefaultUniversalMinMergeWidth
	}
	if u.MaxMergeWidth <= 0 {
		u.MaxMergeWidth = math.MaxInt
	}
	u.MaxMergeWidth = max(u.MaxMergeWidth, u.MinMergeWidth)
	if u.MaxSizeAmplificationPercent <= 0 {
		u.MaxSizeAmplificationPercent = DefaultUniversalMaxSizeAmplificationPercent
	}
}

// sortedRun is one run of the universal style: an L0 file, or a whole level
// below L0.
type sortedRun struct {
	level      int
	files      []*manifest.FileMetadata
	size       uint64
	compacting bool // some file of the run is being compacted
}

// sortedRuns returns the view's runs, newest first: the L0 files (newest
// first), then the non-empty levels from L1 down.
func sortedRuns(st *levelState) []sortedRun {
	var runs []sortedRun
	for _, f := range st.levels[0] {
		runs = append(runs, sortedRun{level: 0, files: []*manifest.FileMetadata{f}, size: f.Size, compacting: f.Compacting})
	}
	for l := 1; l < manifest.NumLevels; l++ {
		if files := st.levels[l]; len(files) > 0 {
			runs = append(runs, sortedRun{level: l, files: files, size: totalSize(files), compacting: anyCompacting(files)})
		}
	}
	return runs
}

// universalScores is Scores for the Universal style: L0's score is the run
// count over the trigger (or, from the trigger on, the size amplification
// over its bound, when that is larger); the levels below have none.
func (p *Picker) universalScores(st *levelState) [manifest.NumLevels]float64 {
	var scores [manifest.NumLevels]float64
	runs := sortedRuns(st)
	scores[0] = float64(len(runs)) / float64(p.opts.L0CompactionTrigger)
	if amp, ok := sizeAmplification(runs); ok && scores[0] >= 1 {
		scores[0] = max(scores[0], amp/float64(p.opts.Universal.MaxSizeAmplificationPercent))
	}
	return scores
}

// sizeAmplification returns the bytes of the runs above the oldest as a
// percentage of the oldest run's.
func sizeAmplification(runs []sortedRun) (float64, bool) {
	if len(runs) < 2 {
		return 0, false
	}
	var newer uint64
	for _, r := range runs[:len(runs)-1] {
		newer = satAdd(newer, r.size)
	}
	return 100 * float64(newer) / float64(max(runs[len(runs)-1].size, 1)), true
}

// universalDebt is EstimatedPendingCompactionBytes for the Universal style:
// the bytes of the runs being compacted (their work is not done) and of the
// runs the next compaction would merge (none below the trigger).
func (p *Picker) universalDebt(st *levelState) uint64 {
	var debt uint64
	for _, r := range sortedRuns(st) {
		if r.compacting {
			debt = satAdd(debt, r.size)
		}
	}
	if c := p.pickUniversal(st, nil); c != nil {
		debt = satAdd(debt, c.InputBytes())
	}
	return debt
}

// pickUniversal is Pick for the Universal style. Once the runs number
// L0CompactionTrigger or more it tries, in this order: a full compaction
// when size amplification is past its bound; a merge of consecutive runs of
// similar size (SizeRatio) starting from the newest run that allows one; a
// merge of the newest runs that brings the count back under the trigger
// (RocksDB waits for the trigger to be exceeded; here a score of 1 always
// means a compaction is due). Runs being compacted are skipped, and so
// several compactions of disjoint runs may run at once.
func (p *Picker) pickUniversal(st *levelState, inProgress []*Compaction) *Compaction {
	runs := sortedRuns(st)
	u := p.opts.Universal
	trigger := p.opts.L0CompactionTrigger
	if len(runs) < trigger || len(runs) < 2 {
		return nil
	}
	score := float64(len(runs)) / float64(trigger)
	if amp, ok := sizeAmplification(runs); ok && amp > float64(u.MaxSizeAmplificationPercent) {
		if c := p.universalCompaction(st, runs, 0, len(runs), KindDefault, inProgress); c != nil {
			c.Score = max(score, amp/float64(u.MaxSizeAmplificationPercent))
			return c
		}
	}
	for i := 0; i < len(runs); i++ {
		if runs[i].compacting {
			continue
		}
		sum := runs[i].size
		j := i + 1
		for j < len(runs) && j-i < u.MaxMergeWidth && !runs[j].compacting {
			// runs[j].size <= sum * (100+SizeRatio)/100, without overflow.
			if float64(runs[j].size) > float64(sum)*float64(100+u.SizeRatio)/100 {
				break
			}
			sum = satAdd(sum, runs[j].size)
			j++
		}
		if j-i >= u.MinMergeWidth {
			if c := p.universalCompaction(st, runs, i, j, KindDefault, inProgress); c != nil {
				c.Score = score
				return c
			}
		}
	}
	{
		// Merge the newest runs so that trigger-1 remain.
		width := min(max(len(runs)-trigger+2, 2), u.MaxMergeWidth)
		if c := p.universalCompaction(st, runs, 0, width, KindDefault, inProgress); c != nil {
			c.Score = score
			return c
		}
	}
	return nil
}

// universalCompaction builds the merge of runs[i:j] (newest first), or nil
// when it cannot run now. The set is widened as order requires: a set that
// starts in L0 takes every older L0 file too (its output lands below L0,
// and an older L0 file left above it would shadow newer data), and a set
// whose next older run is in L1 takes that run (there is no free level
// above it). The output goes to the level just above the next older run,
// or to the last level when the set reaches the oldest run, in which case
// it is bottommost. It returns nil when a widened set meets a run being
// compacted or a running compaction writes the output level.
func (p *Picker) universalCompaction(st *levelState, runs []sortedRun, i, j int, kind Kind, inProgress []*Compaction) *Compaction {
	if i >= j {
		return nil
	}
	// The next older run must leave a free level above it for the output:
	// an older L0 file has none (and left above the output it would shadow
	// newer data), nor has an L1 run. Take them in.
	for j < len(runs) && runs[j].level <= 1 {
		j++
	}
	for _, r := range runs[i:j] {
		if r.compacting {
			return nil
		}
	}
	out := lastLevel
	if j < len(runs) {
		out = runs[j].level - 1
	}
	for _, r := range inProgress {
		// Never two compactions writing one level (the runs' order
		// already keeps them apart; this keeps the promise of Pick).
		if r != nil && r.OutputLevel == out {
			return nil
		}
	}
	c := &Compaction{Kind: kind, StartLevel: runs[i].level, OutputLevel: out}
	var all []*manifest.FileMetadata
	for _, r := range runs[i:j] {
		if n := len(c.Inputs); n > 0 && c.Inputs[n-1].Level == r.level {
			c.Inputs[n-1].Files = append(c.Inputs[n-1].Files, r.files...)
		} else {
			c.Inputs = append(c.Inputs, LevelFiles{Level: r.level, Files: append([]*manifest.FileMetadata(nil), r.files...)})
		}
		all = append(all, r.files...)
	}
	c.Smallest, c.Largest, _ = keyBounds(all)
	c.Bottommost = true
	s := c.span()
	for l := out + 1; l < manifest.NumLevels; l++ {
		if lo, hi := sortedOverlap(st.levels[l], s); hi > lo {
			c.Bottommost = false
			break
		}
	}
	c.MaxOutputFileSize = p.opts.TargetFileSize[out]
	return c
}

// pickUniversalPeriodic is PickPeriodic for the Universal style: the run
// holding the oldest file written at or before cutoff is merged with every
// older run into the last level (the oldest run alone is rewritten in
// place).
func (p *Picker) pickUniversalPeriodic(st *levelState, inProgress []*Compaction, cutoff int64) *Compaction {
	runs := sortedRuns(st)
	oldest, at := int64(math.MaxInt64), -1
	for i, r := range runs {
		for _, f := range r.files {
			if f.CreationTime != 0 && f.CreationTime <= cutoff && f.CreationTime < oldest {
				oldest, at = f.CreationTime, i
			}
		}
	}
	if at < 0 {
		return nil
	}
	c := p.universalCompaction(st, runs, at, len(runs), KindPeriodic, inProgress)
	if c != nil {
		c.Score = p.universalScores(st)[0]
	}
	return c
}

// pickUniversalManual is PickManual for the Universal style: when a file of
// level overlaps [start, end], every run is merged into the last level (the
// last level alone, when it is the only run, is rewritten in place), as
// RocksDB's CompactRange does for universal compaction. It returns an error
// wrapping ErrConflict when a compaction runs.
func (p *Picker) pickUniversalManual(st *levelState, level int, s span, inProgress []*Compaction) (*Compaction, error) {
	lo, hi := 0, 0
	if level == 0 {
		for _, f := range st.levels[0] {
			if fileSpan(f).overlaps(s) {
				hi = 1
				break
			}
		}
	} else {
		lo, hi = sortedOverlap(st.levels[level], s)
	}
	if hi <= lo {
		return nil, nil
	}
	if running(inProgress) > 0 {
		return nil, fmt.Errorf("%w: a universal compaction merges every run and one is running", ErrConflict)
	}
	runs := sortedRuns(st)
	c := p.universalCompaction(st, runs, 0, len(runs), KindManual, inProgress)
	if c == nil {
		return nil, fmt.Errorf("%w: runs are being compacted", ErrConflict)
	}
	return c, nil
}
