//go:build !memtablestats

package memtable

// statsEnabled turns on the comparison counters of a diagnostic build
// (-tags memtablestats, stats_on.go). Off, the counting code compiles away.
const statsEnabled = false

func noteAdd([]byte, addStats)  {}
func noteSeek([]byte, addStats) {}

// StatsReport returns the comparison counters of a diagnostic build
// (-tags memtablestats): empty in other builds.
func StatsReport() string { return "" }

// StatsReset zeroes the counters of a diagnostic build.
func StatsReset() {}

func statsTotals() (adds, compares int64) { return 0, 0 }
