package shard

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// TestEngineWriteSpan: an Apply call whose entries include traced ones
// writes its batch under one shale.engine.write span, the child of the
// first traced entry's apply span, linked to the other traced entries'
// apply spans, with the shard, the entries and the batch as attributes;
// an untraced call makes no span.
func TestEngineWriteSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env := newTestEnv(t, nil)
	s := env.bootstrap("shard", userDesc(2, "", ""), 100)
	f := newFeeder(s)
	put := func(i int) *shalev1.RaftCommand {
		return txnCmd(int64(i), &shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(fmt.Sprintf("k%d", i), "v", 0, false)}})
	}

	if _, err := s.Apply([]replication.Entry{f.entry(marshalCmd(t, put(1)))}); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("an untraced Apply made %d spans", n)
	}

	tr := tp.Tracer("test")
	_, a1 := tr.Start(context.Background(), "apply-1")
	_, a2 := tr.Start(context.Background(), "apply-2")
	ents := []replication.Entry{f.entry(marshalCmd(t, put(2))), f.entry(marshalCmd(t, put(3))), f.entry(marshalCmd(t, put(4)))}
	ents[1].Span, ents[2].Span = a1, a2
	if _, err := s.Apply(ents); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "shale.engine.write" {
		t.Fatalf("spans %v, want one shale.engine.write", spans.Snapshots())
	}
	w := spans[0]
	if w.Parent.SpanID() != a1.SpanContext().SpanID() || w.SpanContext.TraceID() != a1.SpanContext().TraceID() {
		t.Errorf("the write's parent is %v, want the first traced entry's apply span %v", w.Parent, a1.SpanContext())
	}
	if len(w.Links) != 1 || w.Links[0].SpanContext.SpanID() != a2.SpanContext().SpanID() {
		t.Errorf("the write's links are %v, want one to the second traced entry's apply span", w.Links)
	}
	want := map[string]int64{"shale.shard.id": 2, "shale.apply.entries": 3,
		"shale.raft.index.first": int64(ents[0].Index), "shale.raft.index.last": int64(ents[2].Index)}
	got := map[string]int64{}
	for _, kv := range w.Attributes {
		got[string(kv.Key)] = kv.Value.AsInt64()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %d, want %d", k, got[k], v)
		}
	}
	if got["shale.engine.batch.count"] < 3 || got["shale.engine.batch.bytes"] <= 0 {
		t.Errorf("batch attributes %v: want at least the 3 puts counted and some bytes", got)
	}
}
