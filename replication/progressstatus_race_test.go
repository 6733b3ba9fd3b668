package replication

import (
	"context"
	"testing"
	"time"
)

// TestProgressStatusAbandonedByCaller is a regression test for a data race
// found by server's TestLinearizability under -race: ProgressStatus runs a
// closure on the Store's loop that writes its result variable, but when the
// caller's context ends first runOnLoop returns and ProgressStatus reads (and
// returns) that variable while the loop may still be writing it. Run with
// -race; a context that is already done reproduces it reliably.
func TestProgressStatusAbandonedByCaller(t *testing.T) {
	c := newTestCluster(t, nil)
	c.startNode(1)
	c.bootstrap(1, 1)
	lead := c.leader(1)
	r := c.get(lead).store.Replica(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 200; i++ {
		_, _ = r.ProgressStatus(ctx)
	}
	time.Sleep(50 * time.Millisecond) // let the loop run the abandoned closures
}
