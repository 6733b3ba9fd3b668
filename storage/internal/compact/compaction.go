package compact

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
)

// Kind says how a compaction is carried out.
type Kind int

const (
	// KindDefault merges the inputs of both levels and writes new files into
	// OutputLevel.
	KindDefault Kind = iota
	// KindMove moves the single start-level input file into OutputLevel by a
	// version edit alone, without rewriting it. The picker chooses it only
	// when the file overlaps no OutputLevel file and at most
	// MaxGrandparentOverlapBytes of grandparents. A caller that must rewrite
	// anyway (for example to change compression per level) may execute it as
	// KindDefault; the inputs are valid for both.
	KindMove
	// KindManual is a compaction requested through PickManual (CompactRange).
	// It is always a rewrite, never a move, so that range tombstones can be
	// applied and compaction filters run.
	KindManual
	// KindPeriodic is a compaction chosen by PickPeriodic because its
	// oldest input was written too long ago. It is always a rewrite, never
	// a move, so that compaction filters run on old data.
	KindPeriodic
)

// String returns "default", "move", "manual" or "periodic".
func (k Kind) String() string {
	switch k {
	case KindDefault:
		return "default"
	case KindMove:
		return "move"
	case KindManual:
		return "manual"
	case KindPeriodic:
		return "periodic"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Compaction describes one compaction chosen by a Picker. The picker fills
// every exported field; the caller owns the value, must set Compacting on
// every file of Inputs before the next Pick/PickManual, pass it in
// inProgress until it finishes, and clear the flags afterwards.
//
// Guarantees at the moment it is returned (for the LevelsView and inProgress
// it was picked from):
//   - no input file has Compacting set;
//   - the StartLevel inputs are a clean cut of StartLevel: no StartLevel file
//     outside them shares a user key with them (for L0: no L0 file outside
//     them overlaps their key range at all, so no older version of an input
//     key is left above);
//   - the OutputLevel inputs (OutputFiles) are every OutputLevel file sharing
//     a user key with the compaction's key range, a clean cut of OutputLevel;
//   - the key range does not overlap the range of any in-progress compaction
//     writing the same OutputLevel, and no other compaction starting from L0
//     is in progress when StartLevel is 0;
//   - in the Universal style: the inputs are whole sorted runs, consecutive
//     from newest to oldest, every level between StartLevel and OutputLevel
//     holds no file outside them, and no in-progress compaction writes
//     OutputLevel.
type Compaction struct {
	// Kind is how to execute the compaction.
	Kind Kind
	// StartLevel is the level the compaction reads from; OutputLevel is the
	// level it writes. OutputLevel is StartLevel+1, except that L0 compacts
	// into the base level, and a manual compaction of the last level
	// rewrites it in place (StartLevel == OutputLevel). In the Universal
	// style StartLevel is the level of the newest input run and OutputLevel
	// the level just above the next older run (the last level when none is
	// left).
	StartLevel, OutputLevel int
	// Inputs are the input files by level, newest level first, each
	// level's files in level order (newest first for L0, by key otherwise).
	// Inputs[0] is StartLevel. A leveled compaction has two entries, the
	// second OutputLevel's (possibly without files), or one when
	// StartLevel == OutputLevel. A universal compaction has an entry for
	// every level from StartLevel to OutputLevel that holds input files.
	Inputs []LevelFiles
	// Grandparents are the files of OutputLevel+1 overlapping the key range,
	// by key; ShouldSplitBefore uses them to cut outputs.
	Grandparents []*manifest.FileMetadata
	// Smallest and Largest are the smallest and largest internal keys of all
	// inputs (Largest may be a range-deletion sentinel, an exclusive bound).
	Smallest, Largest base.InternalKey
	// Score is the StartLevel score when the compaction was picked (0 for
	// manual compactions of levels without a score).
	Score float64
	// Bottommost is true when no file in any level below OutputLevel
	// overlaps [Smallest, Largest]: no older version of any key in the range
	// exists outside the inputs, so tombstones with no snapshot below them
	// may be dropped and sequence numbers zeroed.
	Bottommost bool
	// MaxOutputFileSize is the size at which an output file should be cut:
	// the options' TargetFileSize for OutputLevel.
	MaxOutputFileSize uint64
	// MaxGrandparentOverlapBytes bounds the grandparent bytes one output file
	// may overlap (GrandparentOverlapFactor x MaxOutputFileSize).
	MaxGrandparentOverlapBytes uint64

	split splitState
}

// splitState is the cursor ShouldSplitBefore keeps over Grandparents.
type splitState struct {
	gpIndex int    // first grandparent not entirely before the last key
	overlap uint64 // grandparent bytes passed while the current output was open
	lastKey []byte
	hasLast bool
}

// LevelFiles are a compaction's input files of one level.
type LevelFiles struct {
	Level int
	Files []*manifest.FileMetadata
}

// StartFiles returns the StartLevel input files (Inputs[0]).
func (c *Compaction) StartFiles() []*manifest.FileMetadata {
	if len(c.Inputs) == 0 {
		return nil
	}
	return c.Inputs[0].Files
}

// OutputFiles returns the OutputLevel files among the inputs (none when
// StartLevel == OutputLevel or the output level held nothing to merge).
func (c *Compaction) OutputFiles() []*manifest.FileMetadata {
	if len(c.Inputs) < 2 || c.Inputs[len(c.Inputs)-1].Level != c.OutputLevel {
		return nil
	}
	return c.Inputs[len(c.Inputs)-1].Files
}

// InputBytes returns the total size of all input files.
func (c *Compaction) InputBytes() uint64 {
	var n uint64
	for _, in := range c.Inputs {
		n = satAdd(n, totalSize(in.Files))
	}
	return n
}

// ShouldSplitBefore reports whether the output file being written should be
// finished before user key key is added, starting a new output with key. The
// compaction writer calls it once per distinct user key, in increasing key
// order, before writing the first version of that key; currentOutputSize is
// the (estimated) size of the open output file, or 0 when none is open. It
// returns true when an output is open and either it has reached
// MaxOutputFileSize or the grandparent files it spans since it was opened
// exceed MaxGrandparentOverlapBytes (so that compacting that file one level
// down later stays cheap).
//
// It never splits between two versions of one user key: a call with the same
// key as the previous call returns false. It never returns true when
// currentOutputSize is 0. The method keeps a cursor in c, so one compaction's
// outputs must be cut by one goroutine at a time; it touches no exported
// field, so the picker may read c concurrently.
func (c *Compaction) ShouldSplitBefore(key []byte, currentOutputSize uint64) bool {
	st := &c.split
	if st.hasLast && bytes.Equal(st.lastKey, key) {
		return false
	}
	st.lastKey = append(st.lastKey[:0], key...)
	st.hasLast = true

	var passed uint64
	for st.gpIndex < len(c.Grandparents) {
		g := c.Grandparents[st.gpIndex]
		if g != nil && !fileSpan(g).endsBefore(key) {
			break
		}
		if g != nil {
			passed = satAdd(passed, g.Size)
		}
		st.gpIndex++
	}
	if currentOutputSize == 0 {
		// A new output starts with key; grandparents entirely before key do
		// not overlap it.
		st.overlap = 0
		return false
	}
	st.overlap = satAdd(st.overlap, passed)
	if (c.MaxOutputFileSize > 0 && currentOutputSize >= c.MaxOutputFileSize) ||
		(c.MaxGrandparentOverlapBytes > 0 && st.overlap > c.MaxGrandparentOverlapBytes) {
		st.overlap = 0
		return true
	}
	return false
}

// String formats the compaction on one line for logs, e.g.
// "L0->L4 default score=1.50 [000003 000002]+[000010] a#12,SET-z#3,SET".
func (c *Compaction) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "L%d->L%d %s score=%.2f [", c.StartLevel, c.OutputLevel, c.Kind, c.Score)
	for i, in := range c.Inputs {
		if i > 0 {
			b.WriteString("]+[")
		}
		writeFiles(&b, in.Files)
	}
	if len(c.Inputs) < 2 {
		b.WriteString("]+[")
	}
	fmt.Fprintf(&b, "] %s-%s", c.Smallest, c.Largest)
	if c.Bottommost {
		b.WriteString(" bottommost")
	}
	return b.String()
}

func writeFiles(b *strings.Builder, files []*manifest.FileMetadata) {
	for i, f := range files {
		if i > 0 {
			b.WriteByte(' ')
		}
		if f == nil {
			b.WriteString("<nil>")
			continue
		}
		b.WriteString(f.FileNum.String())
	}
}

// span returns the user-key span of the compaction's key range.
func (c *Compaction) span() span { return spanOfKeys(c.Smallest, c.Largest) }
