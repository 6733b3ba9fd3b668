package replication

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// spanSM is a memSM that, like the shard's state machine, starts a child
// span of every traced entry's apply span, and counts the entries it was
// given with a span.
type spanSM struct {
	*memSM
	mu     sync.Mutex
	traced int
}

func (s *spanSM) Apply(ents []Entry) (Applied, error) {
	for _, e := range ents {
		if e.Span == nil {
			continue
		}
		s.mu.Lock()
		s.traced++
		s.mu.Unlock()
		_, sp := e.Span.TracerProvider().Tracer("test").Start(trace.ContextWithSpan(context.Background(), e.Span), "test.sm.write")
		defer sp.End()
	}
	return s.memSM.Apply(ents)
}

func (s *spanSM) tracedEntries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.traced
}

// TestProposalSpans: a proposal made under a recording span on the leader
// gets a propose span (its child) and an apply span (the propose span's
// child, with the entry's index), and the state machine gets the apply
// span with the entry, so that its span nests under it; the followers'
// state machines get no span, and a proposal without a recording span
// makes no span at all.
func TestProposalSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := newTestCluster(t, func(cfg *Config) { cfg.TracerProvider = tp })
	for id := uint64(1); id <= 3; id++ {
		c.startNode(id)
	}
	desc := &shalev1.ShardDescriptor{ShardId: 1, Epoch: 1, NextReplicaId: 4}
	for i := uint64(1); i <= 3; i++ {
		desc.Replicas = append(desc.Replicas, &shalev1.ReplicaDescriptor{NodeId: i, ReplicaId: i})
	}
	sms := map[uint64]*spanSM{}
	for id := uint64(1); id <= 3; id++ {
		n := c.get(id)
		m, err := newMemSM(filepath.Join(n.dir, "shard1"), BootstrapState(desc))
		if err != nil {
			t.Fatal(err)
		}
		sms[id] = &spanSM{memSM: m}
		n.mu.Lock()
		n.sms[1] = m
		n.mu.Unlock()
		if _, err := n.store.AddReplica(sms[id]); err != nil {
			t.Fatal(err)
		}
	}
	lead := c.leader(1)
	r := c.get(lead).store.Replica(1)

	// Untraced: no span.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Propose(ctx, []byte("a=1")); err != nil {
		t.Fatal(err)
	}
	if got := exp.GetSpans(); len(got) != 0 {
		t.Fatalf("an untraced proposal made %d spans: %v", len(got), got.Snapshots())
	}

	before := r.Status().Applied // at most the untraced entry's index (it may lag)
	rctx, root := tp.Tracer("test").Start(ctx, "request")
	if _, err := r.Propose(rctx, []byte("b=2")); err != nil {
		t.Fatal(err)
	}
	root.End()
	c.converged(1, 1, 2, 3)

	byName := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if _, dup := byName[s.Name]; dup {
			t.Fatalf("two %q spans: %v", s.Name, exp.GetSpans().Snapshots())
		}
		byName[s.Name] = s
	}
	parentOf := map[string]string{"shale.raft.propose": "request", "shale.raft.apply": "shale.raft.propose", "test.sm.write": "shale.raft.apply"}
	for child, parent := range parentOf {
		cs, ok := byName[child]
		if !ok {
			t.Fatalf("no %q span; spans: %v", child, names(exp.GetSpans()))
		}
		if cs.SpanContext.TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, not the request's %s", child, cs.SpanContext.TraceID(), root.SpanContext().TraceID())
		}
		if got, want := cs.Parent.SpanID(), byName[parent].SpanContext.SpanID(); got != want {
			t.Errorf("%s's parent is %s, want %s (%s)", child, got, want, parent)
		}
	}
	// Both spans name the traced entry's index: past the entries before
	// it, and applied (the replica's status reports applied indexes a
	// little after the apply, so wait for it).
	index := attrMap(byName["shale.raft.propose"].Attributes)["shale.raft.index"]
	for _, name := range []string{"shale.raft.propose", "shale.raft.apply"} {
		attrs := attrMap(byName[name].Attributes)
		if attrs["shale.shard.id"] != "1" {
			t.Errorf("%s: shale.shard.id = %q, want 1", name, attrs["shale.shard.id"])
		}
		if attrs["shale.raft.index"] != index {
			t.Errorf("%s: shale.raft.index = %q, the proposal's is %q", name, attrs["shale.raft.index"], index)
		}
	}
	idx, err := strconv.ParseUint(index, 10, 64)
	if err != nil || idx <= before {
		t.Fatalf("shale.raft.index = %q, want an index above %d (applied before the proposal)", index, before)
	}
	for deadline := time.Now().Add(5 * time.Second); r.Status().Applied < idx; {
		if time.Now().After(deadline) {
			t.Fatalf("shale.raft.index %d was never applied (applied %d)", idx, r.Status().Applied)
		}
		time.Sleep(time.Millisecond)
	}
	for id, sm := range sms {
		want := 0
		if id == lead {
			want = 1
		}
		if got := sm.tracedEntries(); got != want {
			t.Errorf("node %d (leader %d): the state machine got %d entries with a span, want %d", id, lead, got, want)
		}
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func attrMap(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}
