package base

// Merger is a user-supplied merge operator: it folds Merge operands into a
// value, at read time and during compactions. Implementations must be
// deterministic and safe for concurrent use; they must not retain or modify
// their argument slices.
type Merger interface {
	// Name identifies the operator in logs and errors. It is not recorded in
	// the database: reading with a different operator is not detected.
	Name() string
	// FullMerge returns the value that results from applying operands (oldest
	// first) to existing. hasExisting is false when the key had no value (it
	// never existed or its newest older entry is a deletion). An error makes
	// the read (or compaction) fail with that error.
	FullMerge(key, existing []byte, hasExisting bool, operands [][]byte) ([]byte, error)
	// PartialMerge combines operands (oldest first) into a single operand
	// equivalent to applying them in order. ok is false when they cannot be
	// combined without the base value; the operands are then kept as they are.
	PartialMerge(key []byte, operands [][]byte) (merged []byte, ok bool)
}

// FilterDecision is what a CompactionFilter decides for one entry.
type FilterDecision int

const (
	// FilterKeep keeps the entry unchanged.
	FilterKeep FilterDecision = iota
	// FilterRemove drops the entry (it behaves as deleted: older versions of
	// the key are removed with it).
	FilterRemove
	// FilterChangeValue replaces the entry's value with the returned value.
	FilterChangeValue
)

// CompactionFilter is a user hook consulted during compactions for each
// value (Set entries, after merges are resolved) that no snapshot can still
// see in its earlier form. Typical use: expiring entries past a TTL.
// Implementations must be safe for concurrent use.
type CompactionFilter interface {
	// Name identifies the filter for logs and metrics.
	Name() string
	// Filter decides the fate of key/value found while compacting into
	// level. The returned value is used only with FilterChangeValue.
	Filter(level int, key, value []byte) (FilterDecision, []byte)
}
