//go:build race

package raftlog

// raceEnabled is set when the race detector is on: long randomized tests
// run fewer steps.
const raceEnabled = true
