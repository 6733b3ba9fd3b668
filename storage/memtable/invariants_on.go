//go:build invariants || race

package memtable

// invariants turns on expensive self-checks (the splice's, on every Add):
// in race-detector builds and with -tags invariants.
const invariants = true
