package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// tracedCluster starts a 3-node cluster whose nodes trace into exp, each
// with its own provider that samples only what its caller sampled (so the
// cluster's own background work leaves no spans), and a client that
// traces every call into exp too.
func tracedCluster(t *testing.T, exp *tracetest.InMemoryExporter) (*testcluster.Cluster, trace.TracerProvider) {
	t.Helper()
	newTP := func(sampler sdktrace.Sampler) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sampler))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	c := testcluster.Start(t, testcluster.Options{Configure: func(cfg *server.Config) {
		cfg.TracerProvider = newTP(sdktrace.ParentBased(sdktrace.NeverSample()))
	}})
	return c, newTP(sdktrace.AlwaysSample())
}

// spanSet indexes a trace's spans.
type spanSet struct {
	t     *testing.T
	spans tracetest.SpanStubs
}

func (s spanSet) byID(id trace.SpanID) (tracetest.SpanStub, bool) {
	for _, sp := range s.spans {
		if sp.SpanContext.SpanID() == id {
			return sp, true
		}
	}
	return tracetest.SpanStub{}, false
}

// find returns the spans named name of kind kind whose attributes include
// want.
func (s spanSet) find(name string, kind trace.SpanKind, want ...attribute.KeyValue) []tracetest.SpanStub {
	var out []tracetest.SpanStub
next:
	for _, sp := range s.spans {
		if sp.Name != name || sp.SpanKind != kind {
			continue
		}
		for _, w := range want {
			if !hasAttr(sp.Attributes, w) {
				continue next
			}
		}
		out = append(out, sp)
	}
	return out
}

func hasAttr(attrs []attribute.KeyValue, w attribute.KeyValue) bool {
	for _, a := range attrs {
		if a.Key == w.Key && a.Value.Emit() == w.Value.Emit() {
			return true
		}
	}
	return false
}

// chain checks that from leaf up, each span's parent is the next one
// described (name and kind, as "name/kind"), all in one trace, and
// returns the spans from leaf to the last described.
func (s spanSet) chain(leaf tracetest.SpanStub, up ...string) []tracetest.SpanStub {
	s.t.Helper()
	out := []tracetest.SpanStub{leaf}
	cur := leaf
	for _, want := range up {
		p, ok := s.byID(cur.Parent.SpanID())
		if !ok {
			s.t.Fatalf("the parent of %s (%s) is not among the spans; want %s\n%s", cur.Name, cur.SpanKind, want, s.dump())
		}
		if got := p.Name + "/" + p.SpanKind.String(); got != want {
			s.t.Fatalf("the parent of %s (%s) is %s, want %s\n%s", cur.Name, cur.SpanKind, got, want, s.dump())
		}
		if p.SpanContext.TraceID() != leaf.SpanContext.TraceID() {
			s.t.Fatalf("%s is in trace %s, %s in %s", p.Name, p.SpanContext.TraceID(), leaf.Name, leaf.SpanContext.TraceID())
		}
		out = append(out, p)
		cur = p
	}
	return out
}

// fromWrite finds the one engine write span of shardID (0: of any shard)
// and checks the chain up from it: the apply, the proposal, then the
// spans described by up (as for chain), which it returns from the write.
func (s spanSet) fromWrite(shardID uint64, up ...string) []tracetest.SpanStub {
	s.t.Helper()
	var want []attribute.KeyValue
	if shardID != 0 {
		want = append(want, attribute.Int64("shale.shard.id", int64(shardID)))
	}
	writes := s.find("shale.engine.write", trace.SpanKindInternal, want...)
	if len(writes) != 1 {
		s.t.Fatalf("%d engine write spans of shard %d, want 1\n%s", len(writes), shardID, s.dump())
	}
	return s.chain(writes[0], append([]string{"shale.raft.apply/internal", "shale.raft.propose/internal"}, up...)...)
}

func (s spanSet) dump() string {
	var b strings.Builder
	for _, sp := range s.spans {
		fmt.Fprintf(&b, "  %s %s/%s parent %s %v\n", sp.SpanContext.SpanID(), sp.Name, sp.SpanKind, sp.Parent.SpanID(), sp.Attributes)
	}
	return b.String()
}

func nodeAttr(id uint64) attribute.KeyValue { return attribute.Int64("shale.node.id", int64(id)) }

// callModes are the client's two ways of sending KV calls: over a
// KV.Calls stream (the trace context in each call) and unary (in the
// metadata).
var callModes = []struct {
	name string
	opts []client.Option
}{{"calls-stream", nil}, {"unary", []client.Option{client.WithUnaryCalls()}}}

// TestTracingPutAcrossNodes: one put, sent by a tracing client first to
// a node that no longer leads the key's shard, is one trace: the client's
// call span; under it an attempt span per node tried; under the first,
// the handler span of the node that refused (NotLeader); under the second,
// the leader's handler span, and below it the Raft proposal, its apply and
// the engine write, each the parent of the next. Over a KV.Calls stream
// (the trace context in the call) and as unary calls (in the metadata).
func TestTracingPutAcrossNodes(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	c, ctp := tracedCluster(t, exp)
	ctx := context.Background()
	for _, mode := range callModes {
		t.Run(mode.name, func(t *testing.T) {
			cl := newClient(t, c, append(mode.opts, client.WithTracerProvider(ctp))...)
			key := []byte("traced-" + mode.name)
			if _, err := cl.Put(ctx, key, []byte("warm-up")); err != nil {
				t.Fatal(err)
			}
			shardID := c.ShardIDs()[1] // the user shard
			old := c.Leader(shardID)
			target := old%3 + 1
			c.MoveLeader(shardID, target, 20*time.Second)
			exp.Reset()

			if _, err := cl.Put(ctx, key, []byte("v")); err != nil {
				t.Fatal(err)
			}
			s := spanSet{t: t, spans: exp.GetSpans()}
			ch := s.fromWrite(shardID, "shale.v1.KV/Put/server", "shale.v1.KV/Put/client", "shale.client.put/internal")
			if h := ch[3]; !hasAttr(h.Attributes, nodeAttr(target)) || !hasAttr(h.Attributes, attribute.Int64("shale.request.keys", 1)) {
				t.Errorf("the leader's handler span has attributes %v, want node %d and 1 key", h.Attributes, target)
			}
			if a := ch[4]; !hasAttr(a.Attributes, nodeAttr(target)) {
				t.Errorf("the second attempt's span has attributes %v, want node %d", a.Attributes, target)
			}
			if mode.name == "calls-stream" && !hasAttr(ch[3].Attributes, attribute.Bool("shale.kv_calls", true)) {
				t.Errorf("the leader's handler span has attributes %v, want shale.kv_calls", ch[3].Attributes)
			}
			refused := s.find("shale.v1.KV/Put", trace.SpanKindServer, nodeAttr(old))
			if len(refused) != 1 {
				t.Fatalf("%d handler spans on node %d (no longer leader), want 1\n%s", len(refused), old, s.dump())
			}
			rch := s.chain(refused[0], "shale.v1.KV/Put/client", "shale.client.put/internal")
			if rch[2].SpanContext.SpanID() != ch[5].SpanContext.SpanID() {
				t.Errorf("the refused attempt belongs to another call span\n%s", s.dump())
			}
			if !hasAttr(refused[0].Attributes, attribute.Int("rpc.grpc.status_code", 9)) {
				t.Errorf("the refusing node's span has attributes %v, want status FailedPrecondition (9)", refused[0].Attributes)
			}
			if n := len(s.find("shale.raft.propose", trace.SpanKindInternal)); n != 1 {
				t.Errorf("%d propose spans, want 1 (only the leader proposes)\n%s", n, s.dump())
			}
		})
	}
}

// TestTracingCallerSpan: a client that makes no spans of its own (no
// WithTracerProvider) still carries the trace of the caller's span, so the
// node's spans are its children.
func TestTracingCallerSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	c, app := tracedCluster(t, exp)
	for _, mode := range callModes {
		t.Run(mode.name, func(t *testing.T) {
			cl := newClient(t, c, mode.opts...)
			exp.Reset()
			ctx, root := app.Tracer("app").Start(context.Background(), "app.request")
			_, err := cl.Put(ctx, []byte("k"), []byte("v"))
			root.End()
			if err != nil {
				t.Fatal(err)
			}
			s := spanSet{t: t, spans: exp.GetSpans()}
			s.fromWrite(0, "shale.v1.KV/Put/server", "app.request/internal")
		})
	}
}

// TestTracingForwardedRequest: a split sent to a node that does not lead
// the shard is forwarded to the leader, and the trace shows it: the
// client's spans, the first node's handler span, its forward span, the
// leader's handler span, then the proposal, apply and engine write of the
// split on the leader.
func TestTracingForwardedRequest(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	c, ctp := tracedCluster(t, exp)
	shardID := c.ShardIDs()[1]
	lead := c.Leader(shardID)
	via := lead%3 + 1
	cl, err := client.New(context.Background(), []string{c.Node(via).Addr()}, client.WithTracerProvider(ctp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	c.MoveLeader(shardID, lead, 20*time.Second)
	exp.Reset()

	if _, _, err := cl.SplitShard(context.Background(), []byte("m")); err != nil {
		t.Fatal(err)
	}
	s := spanSet{t: t, spans: exp.GetSpans()}
	ch := s.fromWrite(shardID, "shale.v1.Admin/SplitShard/server") // the split's, on the shard's leader
	// Up from the leader's handler: a forward from another node, up to the
	// client's call.
	cur := ch[len(ch)-1]
	if !hasAttr(cur.Attributes, nodeAttr(lead)) {
		t.Errorf("the proposing handler span has attributes %v, want node %d", cur.Attributes, lead)
	}
	fwd := s.chain(cur, "forward shale.v1.Admin/SplitShard/client", "shale.v1.Admin/SplitShard/server")
	if !hasAttr(fwd[1].Attributes, attribute.Bool("shale.forwarded", true)) || hasAttr(fwd[1].Attributes, nodeAttr(lead)) {
		t.Errorf("the forward span has attributes %v, want shale.forwarded on a node other than %d", fwd[1].Attributes, lead)
	}
	// The first node may itself have been forwarded to (by a node that led
	// the system shard, which allocates the new shard's ID); the chain ends
	// at the client's call on the node it sent to.
	top := fwd[len(fwd)-1]
	for hasParentNamed(s, top, "forward shale.v1.Admin/SplitShard") {
		up := s.chain(top, "forward shale.v1.Admin/SplitShard/client", "shale.v1.Admin/SplitShard/server")
		top = up[len(up)-1]
	}
	if !hasAttr(top.Attributes, nodeAttr(via)) {
		t.Errorf("the first handler span has attributes %v, want node %d (the client's endpoint)", top.Attributes, via)
	}
	s.chain(top, "shale.v1.Admin/SplitShard/client", "shale.client.split-shard/internal")
}

func hasParentNamed(s spanSet, sp tracetest.SpanStub, name string) bool {
	p, ok := s.byID(sp.Parent.SpanID())
	return ok && p.Name == name
}
