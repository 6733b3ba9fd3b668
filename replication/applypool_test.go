package replication

import (
	"errors"
	"testing"
)

// TestApplyPoolReplicaStoppedWhileReady: a replica stopped while it waits
// on the ready list (its tasks dropped by stopReplica, the list still
// holding it) is taken off the list by the next worker without a run.
// Before, that worker ran an empty apply and panicked (index out of range
// in applyTasks), seen in `go test -race ./server/` and in a placement
// benchmark's server on 2026-11-29.
func TestApplyPoolReplicaStoppedWhileReady(t *testing.T) {
	p := newApplyPool(&Store{})
	r := &Replica{shardID: 7}
	p.enqueue(r, applyTask{}) // no worker yet: r waits on the ready list
	p.stopReplica(r, errors.New("test: stopped"))
	p.start(1)
	p.stop() // the worker takes r off the list before it ends
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.applyQ.queued || len(p.ready) != 0 {
		t.Fatalf("after the stop: queued %v, ready list %d long", r.applyQ.queued, len(p.ready))
	}
}
