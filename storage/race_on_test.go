//go:build race

package storage

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = true
