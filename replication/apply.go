package replication

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Committed entries are applied off the Raft loop. The loop persists,
// sends, and hands each replica's committed entries, in log order, to the
// apply workers as tasks; it then advances Raft at once. The workers apply
// the tasks of one replica in order (never two at a time for one replica)
// and the replicas in parallel, answer the proposals of the entries, and
// report the applied index back to the loop, which releases the reads
// waiting for it, truncates the log up to it and removes replicas that left
// their shard. One slow state machine therefore delays only its own shard:
// the loop keeps ticking, heartbeating and persisting every other group.
//
// The order the Raft layer needs is kept: an entry is handed off only once
// it is durable in the local log (the state machine never gets ahead of the
// log a restart replays), configuration changes are applied to Raft at the
// hand-off, in log order, and a snapshot is installed only after the
// replica's earlier tasks have applied. The log is truncated only up to
// what the state machine reports durable (Flush), which is at or below the
// applied index the workers reported.
//
// A snapshot is installed the same way: the loop hands the state machine's
// Restore to the workers as the replica's last task and holds the Ready
// that carries the snapshot (nothing of it is persisted, sent or advanced)
// while the replica takes no messages, ticks or proposals. When the
// worker reports the state machine restored, the loop stages the log reset
// in its next cycle's synced write, sends the Ready's messages and answers
// the snapshot's sender, and advances Raft. Meanwhile every other replica
// of the node keeps persisting, acknowledging and sending.

// applyTask is a run of committed entries of one replica, in log order.
type applyTask struct {
	entries []Entry
	// props[i] is the local proposal waiting for entries[i], or nil.
	props []*proposal
	// removedSelf is set when a configuration change of the run removed
	// this replica from its group.
	removedSelf bool
	// install, when set, makes the task a snapshot's Restore (no entries):
	// always the replica's last task until the loop finishes the install.
	install *snapInstall
}

// applyReport is what a worker tells the loop after applying a replica's
// tasks.
type applyReport struct {
	r       *Replica
	applied uint64 // the last index applied
	// removed says the replica left its shard: a configuration change
	// removed it, or its shard was retired (merged into another).
	removed bool
	err     error // the state machine failed; nothing of the run applied
	// install is the snapshot whose Restore the run ended with; with a nil
	// err the state machine holds it.
	install *snapInstall
	// wake: the loop must take the report in now, not at its next cycle
	// (see report).
	wake bool
}

// applyQueue is a replica's apply state, guarded by applyPool.mu.
type applyQueue struct {
	tasks   []applyTask
	queued  bool // in the pool's ready list or being applied
	running bool // a worker is applying its tasks
	// stopped: the replica halted or was removed; tasks are dropped.
	stopped bool
}

// applyPool is the apply workers of a Store.
type applyPool struct {
	s  *Store
	mu sync.Mutex
	// work wakes idle workers: one per replica made ready (enqueue), all
	// on closing. A worker waits on it only while ready is empty.
	work *sync.Cond
	// idle wakes stopReplica's callers each time a worker ends a run.
	idle    *sync.Cond
	ready   []*Replica
	closing bool
	wg      sync.WaitGroup
}

func newApplyPool(s *Store) *applyPool {
	p := &applyPool{s: s}
	p.work = sync.NewCond(&p.mu)
	p.idle = sync.NewCond(&p.mu)
	return p
}

// start runs n workers.
func (p *applyPool) start(n int) {
	for range n {
		p.wg.Add(1)
		go p.run()
	}
}

// stop lets the workers apply what is queued, then ends them.
func (p *applyPool) stop() {
	p.mu.Lock()
	p.closing = true
	p.work.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// enqueue hands a task of r to the workers.
func (p *applyPool) enqueue(r *Replica, t applyTask) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := &r.applyQ
	if q.stopped {
		dropTask(t, stoppedErr(r))
		return
	}
	q.tasks = append(q.tasks, t)
	if !q.queued {
		q.queued = true
		p.ready = append(p.ready, r)
		// One worker for one ready replica: waking them all would wake
		// the others for nothing (a context switch each, per apply).
		p.work.Signal()
	}
}

// stopReplica drops r's queued tasks (their proposals' outcome is unknown:
// the entries committed) and waits until no worker applies for r: then
// nothing applies to r's state machine any more.
func (p *applyPool) stopReplica(r *Replica, err error) {
	p.mu.Lock()
	q := &r.applyQ
	q.stopped = true
	tasks := q.tasks
	q.tasks = nil
	for q.running {
		p.idle.Wait()
	}
	p.mu.Unlock()
	for _, t := range tasks {
		dropTask(t, err)
	}
}

// run is a worker: it applies ready replicas' tasks until the pool closes
// and nothing is ready. A replica with more tasks after a run goes back on
// the ready list; this worker, which does not wait while the list is
// non-empty, takes it or another one next, so another worker is woken only
// when the list holds more than one.
func (p *applyPool) run() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		for len(p.ready) == 0 && !p.closing {
			p.work.Wait()
		}
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return
		}
		r := p.ready[0]
		p.ready[0] = nil
		p.ready = p.ready[1:]
		q := &r.applyQ
		tasks := q.tasks
		if len(tasks) == 0 {
			// stopReplica took its tasks while it waited on this list:
			// nothing to apply or report.
			q.queued = false
			p.mu.Unlock()
			continue
		}
		q.tasks = nil
		q.running = true
		p.mu.Unlock()

		rep, ok := p.s.applyTasks(r, tasks)

		p.mu.Lock()
		q.running = false
		if rep.err != nil {
			q.stopped = true
		}
		if len(q.tasks) > 0 && !q.stopped {
			p.ready = append(p.ready, r)
			if len(p.ready) > 1 {
				// This worker takes one; an idle one may take the other.
				p.work.Signal()
			}
		} else {
			q.queued = false
			for _, t := range q.tasks {
				dropTask(t, stoppedErr(r))
			}
			q.tasks = nil
		}
		p.idle.Broadcast()
		p.mu.Unlock()
		if ok {
			p.s.report(rep)
		}
	}
}

// stoppedErr is the error of proposals whose entries a stopped replica
// will not apply: they committed, so they may apply elsewhere.
func stoppedErr(r *Replica) error {
	return fmt.Errorf("%w: replication: shard %d: the replica stopped before applying the entry", ErrOutcomeUnknown, r.shardID)
}

func dropTask(t applyTask, err error) {
	if inst := t.install; inst != nil {
		// Never restored: the received checkpoint is not needed.
		_ = os.RemoveAll(inst.in.dir)
		inst.in.answer(err)
	}
	for _, p := range t.props {
		if p != nil {
			if p.trace != nil {
				p.trace.applied(0, err)
			}
			p.finish(nil, err)
		}
	}
}

// applyTasks applies a replica's tasks as one state machine call (worker
// side) and answers their proposals, then runs the Restore of a snapshot
// install that ends them. ok is false when there was nothing to report.
func (s *Store) applyTasks(r *Replica, tasks []applyTask) (applyReport, bool) {
	inst := tasks[len(tasks)-1].install
	if inst != nil {
		tasks = tasks[:len(tasks)-1]
	}
	rep, ok := s.applyEntries(r, tasks)
	if inst == nil {
		return rep, ok
	}
	rep.install = inst
	rep.wake = true
	if rep.err != nil {
		return rep, true
	}
	if h := s.cfg.applyHook; h != nil {
		h(r.shardID)
	}
	if err := r.sm.Restore(inst.in.dir); err != nil {
		rep.err = fmt.Errorf("restore snapshot at index %d: %w", inst.rd.Snapshot.GetMetadata().GetIndex(), err)
	}
	return rep, true
}

// applyEntries applies the entries of tasks as one state machine call.
func (s *Store) applyEntries(r *Replica, tasks []applyTask) (applyReport, bool) {
	var ents []Entry
	var props []*proposal
	rep := applyReport{r: r}
	for _, t := range tasks {
		ents = append(ents, t.entries...)
		props = append(props, t.props...)
		rep.removed = rep.removed || t.removedSelf
	}
	if len(ents) == 0 {
		return rep, false
	}
	rep.applied = ents[len(ents)-1].Index
	for i := range ents {
		// A configuration change may name replicas on nodes the loop
		// does not know yet (updateNodes).
		rep.wake = rep.wake || ents[i].ConfChange != nil
	}
	if h := s.cfg.applyHook; h != nil {
		h(r.shardID)
	}
	// Applies run together; claiming the place of a replica created on
	// demand waits for them (a split's apply creates its new shard's
	// replica).
	s.hostMu.RLock()
	applied, err := r.sm.Apply(ents)
	if err == nil {
		err = s.carryOut(r, applied.Effects)
	}
	s.hostMu.RUnlock()
	rep.wake = rep.wake || len(applied.Effects) > 0
	if err != nil {
		rep.err, rep.wake = err, true
		dropTask(applyTask{props: props}, fmt.Errorf("%w: replication: shard %d: apply: %w", ErrOutcomeUnknown, r.shardID, err))
		return rep, true
	}
	now := time.Now()
	for i, p := range props {
		if p == nil {
			continue
		}
		var res any
		if i < len(applied.Results) {
			res = applied.Results[i]
		}
		if p.trace != nil {
			p.trace.applied(len(ents), nil)
		}
		p.finish(res, nil)
		if m := s.cfg.Metrics; m != nil {
			m.commitLatency.Observe(now.Sub(p.start).Seconds())
		}
	}
	if r.sm.AppliedDescriptor().GetRetired() {
		rep.removed = true
	}
	rep.wake = rep.wake || rep.removed
	return rep, true
}

// carryOut carries out the effects of r's applied entries (worker side,
// under hostMu's read lock).
func (s *Store) carryOut(r *Replica, effects []Effect) error {
	for _, e := range effects {
		switch e := e.(type) {
		case HostShard:
			id := e.StateMachine.AppliedState().Descriptor.GetShardId()
			nr, err := s.AddReplica(e.StateMachine)
			if err != nil {
				_ = e.StateMachine.Close()
				return fmt.Errorf("host shard %d: %w", id, err)
			}
			nr.awaitFirstLeader()
			var wait time.Duration
			switch {
			case e.LeaderNodeID == s.cfg.NodeID, e.LeaderNodeID == 0 && r.IsLeader():
			case r.IsLeader():
				// Another node should lead; take over if it does not.
				wait = s.cfg.TickInterval * time.Duration(max(1, s.cfg.ElectionTicks/2))
			default:
				continue
			}
			s.bg.Add(1)
			go func() {
				defer s.bg.Done()
				s.campaignNew(nr, wait)
			}()
		default:
			return fmt.Errorf("unknown effect %T", e)
		}
	}
	return nil
}

// campaignNew makes the new replica nr (a split's new shard) campaign
// until its group has a leader, for at most one election timeout, after
// waiting up to wait for a leader to appear without it. The other replicas
// create theirs when they apply the split, and until then drop its votes:
// a single campaign would mostly fail and leave the shard without a leader
// for a randomized election timeout, while requests for its keys wait. So
// the replica campaigns again every tick, except while it is a candidate
// past its pre-vote: a quorum hosts the shard then, and a new campaign
// would discard the votes on their way (on a loaded node they take longer
// than a tick, and every tick's campaign threw away the last one's).
func (s *Store) campaignNew(nr *Replica, wait time.Duration) {
	retry := s.cfg.TickInterval
	// settled waits a tick and reports whether nr's group has a leader (or
	// the replica or the Store stopped).
	settled := func() bool {
		select {
		case <-s.stop:
			return true
		case <-time.After(retry):
		}
		st := nr.Status()
		return st.LeaderNodeID != 0 || st.Stopped != ""
	}
	for end := time.Now().Add(wait); time.Now().Before(end); {
		if settled() {
			return
		}
	}
	deadline := time.Now().Add(s.electionTimeout())
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), retry)
		err := nr.campaignUnlessStanding(ctx)
		cancel()
		if errors.Is(err, ErrStopped) || errors.Is(err, ErrReplicaRemoved) || settled() {
			return
		}
	}
	s.cfg.Logger.Debug("a new shard has no leader after an election timeout of campaigns", "shard", nr.ShardID())
}

// CampaignFounding makes r, a replica of a shard just created with the
// same state on every node hosting it (a founding node's bootstrapped or
// restored shard), campaign at once in the background, as a split's new
// shard does (campaignNew): again every tick until its group has a leader,
// for at most foundingCampaignTimeouts election timeouts, never discarding
// a campaign whose votes are on their way. The shard then gets its leader
// as soon as a quorum of its replicas runs, without waiting out a
// randomized election timeout. The founding nodes must call it on one
// replica of each shard (one they agree on without talking, such as the
// first in the descriptor): two replicas campaigning at once split the
// vote. The others elect a leader as usual if it fails. It returns at
// once; Stop waits for the campaigns.
func (s *Store) CampaignFounding(r *Replica) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		for range foundingCampaignTimeouts {
			select {
			case <-s.stop:
				return
			default:
			}
			if st := r.Status(); st.LeaderNodeID != 0 || st.Stopped != "" {
				return
			}
			s.campaignNew(r, 0)
		}
	}()
}

// foundingCampaignTimeouts is how many election timeouts a founding
// node's replica campaigns for (CampaignFounding): the founding nodes start
// at different moments (a restore's copying and log replay end at
// different times on each), and the votes of a node that is not up yet are
// lost.
const foundingCampaignTimeouts = 3

// report queues a worker's report for the loop, and wakes the loop only
// when the report asks for it (rep.wake: an error, a snapshot's install,
// a removal, a configuration change, a split's new shard) or a read on
// the replica waits for its applied index (Replica.awaitApplied). Any
// other report waits for the loop's next cycle, at most a tick away: the
// proposals were answered by the worker, and what the loop does with the
// applied index (quiescence, log truncation, the replica's status) can
// wait that long. At 16 clients this spares a wake-up and a cycle of the
// loop per apply on every node.
func (s *Store) report(rep applyReport) {
	s.mu.Lock()
	s.applyReports = append(s.applyReports, rep)
	// Read under s.mu: awaitApplied sets the flag, then checks for
	// queued reports under s.mu, so one of the two sees the other.
	wake := rep.wake || rep.r.readsWaitApplied.Load()
	s.mu.Unlock()
	if wake {
		s.signal()
	}
}

// handleApplyReports takes in the workers' reports (loop side).
func (s *Store) handleApplyReports() {
	s.mu.Lock()
	reps := s.applyReports
	s.applyReports = nil
	s.mu.Unlock()
	for _, rep := range reps {
		r := rep.r
		if inst := rep.install; inst != nil && r.installing == inst {
			switch {
			case r.dead():
				r.installing = nil
				inst.in.answer(fmt.Errorf("%w: replication: shard %d: the replica stopped during the snapshot's install", ErrStopped, r.shardID))
			case rep.err != nil:
				r.installing = nil
				inst.in.answer(rep.err)
			default:
				// The next cycle persists the held Ready (finishInstall).
				inst.restored = true
				s.active[r] = struct{}{}
			}
		}
		if r.dead() {
			continue
		}
		if rep.err != nil {
			r.fatal(rep.err)
			continue
		}
		r.applied = max(r.applied, rep.applied)
		if len(r.appliedWaiters) > 0 {
			keep := r.appliedWaiters[:0]
			for _, w := range r.appliedWaiters {
				if w.index <= r.applied {
					w.done <- nil
				} else {
					keep = append(keep, w)
				}
			}
			r.appliedWaiters = keep
			if len(keep) == 0 {
				r.readsWaitApplied.Store(false)
			}
		}
		if d := r.sm.AppliedDescriptor(); d != r.nodesDesc {
			r.updateNodes(d)
			r.nodesDesc = d
		}
		if rep.removed {
			s.removeReplica(r)
			continue
		}
		r.refreshStatus()
	}
}

// handOff turns committed entries into an apply task: it decodes them,
// applies configuration changes to Raft (in log order, now), and takes the
// local proposals they answer (loop side).
func (r *Replica) handOff(ents []*raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	t := applyTask{entries: make([]Entry, len(ents)), props: make([]*proposal, len(ents))}
	// i is the entry's place in the task: a packed entry takes one per
	// command, and moves the later ones.
	i := -1
	for _, e := range ents {
		i++
		t.entries[i] = Entry{Index: e.GetIndex(), Term: e.GetTerm()}
		var id uint64
		switch e.GetType() {
		case raftpb.EntryNormal:
			if len(e.GetData()) == 0 {
				continue
			}
			if e.GetData()[0] == entryVersionPacked {
				cmds, err := decodePacked(e.GetData())
				if err != nil {
					return fmt.Errorf("entry %d: %w", e.GetIndex(), err)
				}
				t.entries = slices.Insert(t.entries, i+1, make([]Entry, len(cmds)-1)...)
				t.props = slices.Insert(t.props, i+1, make([]*proposal, len(cmds)-1)...)
				for k, c := range cmds {
					t.entries[i] = Entry{Index: e.GetIndex(), Term: e.GetTerm(), Payload: c.payload, Part: k, Parts: len(cmds)}
					r.takeWaiter(&t, i, c.id)
					i++
				}
				i--
				continue
			}
			pid, payload, err := decodeEntry(e.GetData())
			if err != nil {
				return fmt.Errorf("entry %d: %w", e.GetIndex(), err)
			}
			id, t.entries[i].Payload = pid, payload
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			var cc *raftpb.ConfChangeV2
			if e.GetType() == raftpb.EntryConfChange {
				var v1 raftpb.ConfChange
				if err := proto.Unmarshal(e.GetData(), &v1); err != nil {
					return fmt.Errorf("entry %d: conf change: %w", e.GetIndex(), err)
				}
				cc = v1.AsV2()
			} else {
				cc = &raftpb.ConfChangeV2{}
				if err := proto.Unmarshal(e.GetData(), cc); err != nil {
					return fmt.Errorf("entry %d: conf change: %w", e.GetIndex(), err)
				}
			}
			acc := &AppliedConfChange{Change: cc}
			if len(cc.GetContext()) > 0 {
				pid, payload, err := decodeEntry(cc.GetContext())
				if err != nil {
					return fmt.Errorf("entry %d: conf change context: %w", e.GetIndex(), err)
				}
				id = pid
				var cctx shalev1.ConfChangeContext
				if err := proto.Unmarshal(payload, &cctx); err != nil {
					return fmt.Errorf("entry %d: conf change context: %w", e.GetIndex(), err)
				}
				acc.Context = &cctx
				for _, rd := range cctx.GetReplicas() {
					r.noteNode(rd.GetReplicaId(), rd.GetNodeId(), "conf change context")
				}
			}
			acc.ConfState = r.rn.ApplyConfChange(cc)
			t.entries[i].ConfChange = acc
			t.removedSelf = !inConf(acc.ConfState, r.replicaID)
		}
		r.takeWaiter(&t, i, id)
	}
	r.store.applier.enqueue(r, t)
	return nil
}

// takeWaiter makes the local proposal id, if it waits here, t's proposal of
// entry i (loop side).
func (r *Replica) takeWaiter(t *applyTask, i int, id uint64) {
	if id == 0 {
		return
	}
	p, ok := r.waiters[id]
	if !ok {
		return
	}
	delete(r.waiters, id)
	t.props[i] = p
	t.entries[i].Decoded = p.decoded
	if p.trace != nil {
		e := &t.entries[i]
		e.Span = p.trace.committed(r.store.tracer, r.shardID, e.Index, e.Term)
	}
}
