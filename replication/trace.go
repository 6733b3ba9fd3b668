package replication

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (docs/tracing.md). A proposal made under a recording span (the
// handler span of a sampled request) gets two spans on the replica that
// proposed it: shale.raft.propose, from Propose until its entry committed
// and is in the local log (its hand-off to the apply workers), and
// shale.raft.apply, a child of it, from then until the state machine
// applied the entry. The state machine gets the apply span in Entry.Span,
// so that its own work (the engine write) nests under it. Nothing of this
// is in the replicated entry, and the other replicas make no spans.
//
// Without Config.TracerProvider the Store has no tracer, and Propose only
// compares a nil field; with one, a proposal whose context holds no
// recording span costs a context lookup and allocates nothing.

// tracerName names the replication layer's tracer.
const tracerName = "github.com/shale-db/shale/replication"

// Attribute keys of the replication spans (docs/tracing.md).
const (
	attrShardID      = attribute.Key("shale.shard.id")
	attrIndex        = attribute.Key("shale.raft.index")
	attrTerm         = attribute.Key("shale.raft.term")
	attrPayloadBytes = attribute.Key("shale.raft.payload_bytes")
	attrApplyEntries = attribute.Key("shale.apply.entries")
)

// proposalTrace is the spans of a traced proposal.
type proposalTrace struct {
	propose trace.Span
	// apply is started at the hand-off (loop side) and ended by the apply
	// worker that applies or drops the entry; the task queue orders the two.
	apply trace.Span
}

// traceProposal starts the propose span of a proposal of payloadBytes made
// under ctx, or returns nil when ctx holds no recording span or the Store
// traces nothing.
func (s *Store) traceProposal(ctx context.Context, shardID uint64, payloadBytes int) *proposalTrace {
	if s.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return nil
	}
	_, sp := s.tracer.Start(ctx, "shale.raft.propose", trace.WithAttributes(
		attrShardID.Int64(int64(shardID)), attrPayloadBytes.Int(payloadBytes)))
	return &proposalTrace{propose: sp}
}

// proposed ends the propose span of a proposal that Propose returned with
// err. A proposal that committed ended it at its hand-off already, and
// ending a span again does nothing.
func (t *proposalTrace) proposed(err error) {
	if err != nil {
		t.propose.SetStatus(codes.Error, err.Error())
	}
	t.propose.End()
}

// committed ends the propose span of the proposal of entry (index, term)
// at its hand-off and starts its apply span (loop side), which it returns.
func (t *proposalTrace) committed(tracer trace.Tracer, shardID, index, term uint64) trace.Span {
	t.propose.SetAttributes(attrIndex.Int64(int64(index)), attrTerm.Int64(int64(term)))
	t.propose.End()
	_, t.apply = tracer.Start(trace.ContextWithSpan(context.Background(), t.propose), "shale.raft.apply",
		trace.WithAttributes(attrShardID.Int64(int64(shardID)), attrIndex.Int64(int64(index))))
	return t.apply
}

// applied ends the apply span: the entry applied in a state machine call
// of entries entries, or was dropped with err.
func (t *proposalTrace) applied(entries int, err error) {
	if t.apply == nil {
		return
	}
	if err != nil {
		t.apply.SetStatus(codes.Error, err.Error())
	} else {
		t.apply.SetAttributes(attrApplyEntries.Int(entries))
	}
	t.apply.End()
}
