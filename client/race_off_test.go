//go:build !race

package client_test

// raceEnabled is set when the race detector is on: it makes sync.Pool drop
// objects at random, so allocation counts measure the pools, not the code.
const raceEnabled = false
