package compact

import (
	"math"

	"github.com/shale-db/shale/storage/manifest"
)

// Default option values, applied by Options.EnsureDefaults to zero (or
// invalid) fields.
const (
	// DefaultL0CompactionTrigger is the default Options.L0CompactionTrigger.
	DefaultL0CompactionTrigger = 4
	// DefaultL0SlowdownTrigger is the default Options.L0SlowdownTrigger.
	DefaultL0SlowdownTrigger = 20
	// DefaultL0StopTrigger is the default Options.L0StopTrigger.
	DefaultL0StopTrigger = 36
	// DefaultLBaseMaxBytes is the default Options.LBaseMaxBytes (256 MiB,
	// RocksDB's default).
	DefaultLBaseMaxBytes = 256 << 20
	// DefaultLevelMultiplier is the default Options.LevelMultiplier.
	DefaultLevelMultiplier = 10
	// DefaultL0TargetFileSize is the default Options.TargetFileSize[0]
	// (2 MiB); later levels derive from it.
	DefaultL0TargetFileSize = 2 << 20
	// DefaultMaxConcurrentCompactions is the default
	// Options.MaxConcurrentCompactions.
	DefaultMaxConcurrentCompactions = 2
	// DefaultMaxCompactionBytesFactor is the multiple of the output level's
	// target file size used as the input cap when MaxCompactionBytes is 0.
	DefaultMaxCompactionBytesFactor = 25
	// GrandparentOverlapFactor is the multiple of a compaction's
	// MaxOutputFileSize that bounds how many grandparent bytes one output file
	// may overlap (see Compaction.ShouldSplitBefore) and how many grandparent
	// bytes a trivial move may overlap.
	GrandparentOverlapFactor = 10
)

// Options configure a Picker. The zero value is valid once EnsureDefaults has
// run; NewPicker runs it on its own copy.
type Options struct {
	// L0CompactionTrigger is the number of L0 files (not already being
	// compacted) at which L0 scores 1 and an L0 compaction becomes due.
	// Default 4.
	L0CompactionTrigger int
	// L0SlowdownTrigger is the L0 file count at which the write controller
	// should begin slowing writes. The picker does not use it. Default 20;
	// EnsureDefaults raises it to at least L0CompactionTrigger.
	L0SlowdownTrigger int
	// L0StopTrigger is the L0 file count at which the write controller may
	// stop writes. The picker does not use it. Default 36; EnsureDefaults
	// raises it to at least L0SlowdownTrigger.
	L0StopTrigger int
	// LBaseMaxBytes is the target size of the base level (the level L0
	// compacts into). With DynamicLevelBytes the base level's target is at
	// most this (unless every level is already occupied, see LevelTargets).
	// It is also the L0 byte budget: L0 scores 1 when it holds this many
	// bytes. Default 256 MiB.
	LBaseMaxBytes uint64
	// LevelMultiplier is the size ratio between adjacent levels below the
	// base level. Values <= 1 (and NaN/Inf) are replaced by the default, 10.
	LevelMultiplier float64
	// DynamicLevelBytes selects the dynamic level sizing of the RocksDB
	// space-amplification paper (§3.1): level targets are derived from the
	// size of the largest (normally the last) level, dividing by
	// LevelMultiplier for each level upwards; the base level is the deepest
	// level whose target fits LBaseMaxBytes; levels above it have target 0
	// and stay empty, and L0 compacts straight into the base level. When
	// false, L0 compacts into L1, whose target is LBaseMaxBytes, and each
	// lower level's target is LevelMultiplier times the one above.
	//
	// EnsureDefaults cannot tell an explicit false from "unset", so the
	// default (true) is applied by NewOptions/DefaultOptions, not by
	// EnsureDefaults.
	DynamicLevelBytes bool
	// TargetFileSize[i] is the size at which compaction output files written
	// into level i are cut (Compaction.MaxOutputFileSize). Zero entries are
	// filled by EnsureDefaults: entry 0 becomes 2 MiB, entry 1 equals entry
	// 0, and every later zero entry is twice the entry above it, giving
	// 2, 2, 4, 8, 16, 32, 64 MiB for L0..L6 when nothing is set.
	TargetFileSize [manifest.NumLevels]uint64
	// MaxCompactionBytes caps the total input bytes (both levels) of an
	// automatic compaction's optional growth and of each step of a manual
	// compaction. The minimal clean-cut input set is never split to honour
	// it, so a single compaction can exceed it. Zero means 25 times the
	// output level's TargetFileSize, computed per compaction.
	MaxCompactionBytes uint64
	// MaxConcurrentCompactions is the number of automatic compactions that
	// may run at once; Pick returns nil when inProgress already holds this
	// many. Compactions running at once always have disjoint inputs, and two
	// that write the same level have disjoint key ranges. Default 2;
	// EnsureDefaults makes it at least 1.
	MaxConcurrentCompactions int
	// Style is the compaction style: Leveled (the zero value) or Universal.
	// With Universal, L0CompactionTrigger counts sorted runs, and the level
	// sizing fields (LBaseMaxBytes, LevelMultiplier, DynamicLevelBytes,
	// MaxCompactionBytes) are not used by the picker.
	Style Style
	// Universal tunes the Universal style; zero fields take their
	// defaults.
	Universal UniversalOptions
}

// DefaultOptions returns Options with every default applied, including
// DynamicLevelBytes = true.
func DefaultOptions() Options {
	o := Options{DynamicLevelBytes: true}
	o.EnsureDefaults()
	return o
}

// EnsureDefaults replaces zero or invalid fields with their defaults (see each
// field) and makes the L0 triggers ordered (trigger <= slowdown <= stop). It
// never changes DynamicLevelBytes (see that field) and is idempotent.
func (o *Options) EnsureDefaults() {
	if o.L0CompactionTrigger <= 0 {
		o.L0CompactionTrigger = DefaultL0CompactionTrigger
	}
	if o.L0SlowdownTrigger <= 0 {
		o.L0SlowdownTrigger = DefaultL0SlowdownTrigger
	}
	if o.L0SlowdownTrigger < o.L0CompactionTrigger {
		o.L0SlowdownTrigger = o.L0CompactionTrigger
	}
	if o.L0StopTrigger <= 0 {
		o.L0StopTrigger = DefaultL0StopTrigger
	}
	if o.L0StopTrigger < o.L0SlowdownTrigger {
		o.L0StopTrigger = o.L0SlowdownTrigger
	}
	if o.LBaseMaxBytes == 0 {
		o.LBaseMaxBytes = DefaultLBaseMaxBytes
	}
	if !(o.LevelMultiplier > 1) || math.IsInf(o.LevelMultiplier, 0) {
		o.LevelMultiplier = DefaultLevelMultiplier
	}
	if o.TargetFileSize[0] == 0 {
		o.TargetFileSize[0] = DefaultL0TargetFileSize
	}
	if o.TargetFileSize[1] == 0 {
		o.TargetFileSize[1] = o.TargetFileSize[0]
	}
	for i := 2; i < manifest.NumLevels; i++ {
		if o.TargetFileSize[i] == 0 {
			o.TargetFileSize[i] = satMul(o.TargetFileSize[i-1], 2)
		}
	}
	if o.MaxConcurrentCompactions <= 0 {
		o.MaxConcurrentCompactions = DefaultMaxConcurrentCompactions
	}
	o.Universal.EnsureDefaults()
}

// maxCompactionBytes is the input cap for compactions writing level out.
func (o *Options) maxCompactionBytes(out int) uint64 {
	if o.MaxCompactionBytes != 0 {
		return o.MaxCompactionBytes
	}
	return satMul(o.TargetFileSize[out], DefaultMaxCompactionBytesFactor)
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

func satMul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// floatToUint converts a non-negative float to uint64, saturating.
func floatToUint(f float64) uint64 {
	switch {
	case !(f > 0):
		return 0
	case f >= math.MaxUint64:
		return math.MaxUint64
	}
	return uint64(math.Round(f))
}
