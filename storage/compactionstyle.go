package storage

import "github.com/shale-db/shale/storage/internal/compact"

// CompactionStyle is a compaction style (Options.Compaction).
type CompactionStyle = compact.Style

// The compaction styles.
const (
	// LeveledCompaction is the default style: one sorted run per level below
	// L0, each level a fixed multiple of the one above (RocksDB's leveled
	// compaction with the dynamic level sizes of its space-amplification
	// paper).
	LeveledCompaction = compact.Leveled
	// UniversalCompaction merges whole sorted runs of similar size
	// (RocksDB's universal compaction): less write amplification, more
	// space amplification. See Options.Compaction.
	UniversalCompaction = compact.Universal
)

// UniversalOptions tune UniversalCompaction (Options.Universal): the size
// ratio that lets runs merge, the fewest and most runs one merge takes, and
// the size amplification that forces a full compaction.
type UniversalOptions = compact.UniversalOptions
