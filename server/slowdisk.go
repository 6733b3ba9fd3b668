package server

import (
	"context"
	"time"

	"github.com/shale-db/shale/replication"
)

// A node whose Raft-log syncs are slow delays every write of the shards it
// leads (a leader counts its own acknowledgement only once its log is
// durable, and its Raft loop waits for the sync). watchDisk notices it from
// the syncs' durations and moves the node's leaderships to nodes whose
// disks keep up, as TiKV evicts leaders from a slow store.
const (
	// slowDiskWindow is how far back watchDisk looks at syncs.
	slowDiskWindow = 5 * time.Second
	// slowDiskMinSyncs is how many syncs in the window it needs before it
	// judges them (one slow sync is not a slow disk).
	slowDiskMinSyncs = 3
	// slowDiskHold is how long a node keeps its leaderships away after its
	// disk last looked slow: long enough that a disk slow in bursts does
	// not get them back between bursts.
	slowDiskHold = 15 * time.Second
	// slowDiskCheck is how often watchDisk looks.
	slowDiskCheck = 250 * time.Millisecond
)

// diskSlow reports whether the node's recent Raft-log syncs (r) make its
// disk slow: most of those in the window took the threshold or longer, or
// the one in progress has taken twice the threshold already (a stuck disk).
func (n *Node) diskSlow() (slow bool, r replication.LogSyncReport) {
	th := n.cfg.SlowDiskThreshold
	r = n.store.LogSyncs(slowDiskWindow, th)
	return r.Running >= 2*th || (r.Finished >= slowDiskMinSyncs && 2*r.Slow > r.Finished), r
}

// watchDisk hands the node's leaderships away while its disk is slow (see
// Config.SlowDiskThreshold) and takes them back slowDiskHold after.
func (n *Node) watchDisk() {
	defer n.wg.Done()
	if n.cfg.SlowDiskThreshold < 0 {
		return // turned off
	}
	t := time.NewTicker(slowDiskCheck)
	defer t.Stop()
	ctx := n.stopContext()
	slow := false
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		if isSlow, r := n.diskSlow(); isSlow {
			n.slowDiskUntil.Store(now.Add(slowDiskHold).UnixNano())
			n.refuseTransfersWhileDraining()
			if !slow {
				slow = true
				n.slowDisk.Set(1)
				n.slowDiskEvents.Inc()
				n.log.Warn("disk slow: handing this node's shard leaderships to other nodes",
					"syncs", r.Finished, "slow_syncs", r.Slow, "running_sync", r.Running, "threshold", n.cfg.SlowDiskThreshold)
				// Tell the placement leader at once (it gives this node no
				// leaderships while it drains).
				hctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
				n.sendHeartbeat(hctx)
				cancel()
			}
			n.keepDrained()
			continue
		}
		if slow && now.UnixNano() >= n.slowDiskUntil.Load() {
			slow = false
			n.slowDisk.Set(0)
			n.log.Info("disk fast again: this node takes shard leaderships again", "after", slowDiskHold)
		}
	}
}
