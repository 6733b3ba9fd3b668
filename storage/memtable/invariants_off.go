//go:build !(invariants || race)

package memtable

// invariants turns on expensive self-checks; see invariants_on.go.
const invariants = false
