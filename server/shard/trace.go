package shard

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/storage"
)

// tracerName names the shard state machine's tracer.
const tracerName = "github.com/shale-db/shale/server/shard"

// writeBatch writes the batch of an Apply call of entries to the shard's
// engine (not synced: the Raft log is the durable record). When some of
// the entries were traced (replication.Entry.Span, on the replica that
// proposed them), the write gets a shale.engine.write span: a child of
// the first traced entry's apply span, linked to the others', since one
// write carries them all (docs/tracing.md). The span comes from that apply
// span's tracer provider, the node's. Untraced, it looks at each entry's
// Span and allocates nothing.
func (s *Shard) writeBatch(shardID uint64, entries []replication.Entry, b *storage.Batch) error {
	first := -1
	for i := range entries {
		if entries[i].Span != nil {
			first = i
			break
		}
	}
	if first < 0 {
		return s.db.Apply(b, storage.NoSync)
	}
	parent := entries[first].Span
	var links []trace.Link
	for _, e := range entries[first+1:] {
		if e.Span != nil {
			links = append(links, trace.Link{SpanContext: e.Span.SpanContext()})
		}
	}
	_, sp := parent.TracerProvider().Tracer(tracerName).Start(trace.ContextWithSpan(context.Background(), parent), "shale.engine.write",
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.Int64("shale.shard.id", int64(shardID)),
			attribute.Int("shale.apply.entries", len(entries)),
			attribute.Int64("shale.raft.index.first", int64(entries[0].Index)),
			attribute.Int64("shale.raft.index.last", int64(entries[len(entries)-1].Index)),
			attribute.Int64("shale.engine.batch.count", int64(b.Count())),
			attribute.Int("shale.engine.batch.bytes", b.Len()),
		))
	defer sp.End()
	err := s.db.Apply(b, storage.NoSync)
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	return err
}
