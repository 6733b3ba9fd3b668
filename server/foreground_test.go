package server

import (
	"testing"
	"time"
)

// TestForeground: a node is busy for foregroundWindow after a client
// request, or while its Raft log syncs at least foregroundSyncs times per
// window; requests long gone do not count.
func TestForeground(t *testing.T) {
	syncs := 0
	f := &foreground{syncs: func(time.Duration) int { return syncs }}
	if f.Busy() {
		t.Fatal("busy before any work")
	}
	f.request()
	time.Sleep(foregroundCheckEvery)
	if !f.Busy() {
		t.Fatal("not busy right after a request")
	}
	f.lastRequest.Store(time.Now().Add(-2 * foregroundWindow).UnixNano())
	time.Sleep(foregroundCheckEvery)
	if f.Busy() {
		t.Fatal("busy with the last request two windows ago")
	}
	syncs = foregroundSyncs - 1
	time.Sleep(foregroundCheckEvery)
	if f.Busy() {
		t.Fatalf("busy with %d log syncs in the window", syncs)
	}
	syncs = foregroundSyncs
	time.Sleep(foregroundCheckEvery)
	if !f.Busy() {
		t.Fatalf("not busy with %d log syncs in the window", syncs)
	}
}
