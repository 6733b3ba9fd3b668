package placement

import (
	"sync"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// History keeps the most recent scheduling decisions, up to a bound, and
// which of them are still running. It is safe for concurrent use.
type History struct {
	mu    sync.Mutex
	limit int
	ops   []*shalev1.PlacementOperation // oldest first
}

// NewHistory returns a history keeping at most limit operations.
func NewHistory(limit int) *History {
	if limit < 1 {
		limit = 1
	}
	return &History{limit: limit}
}

// Start records a started operation and returns it; Finish marks it done.
func (h *History) Start(op *shalev1.PlacementOperation) *shalev1.PlacementOperation {
	op.State = "running"
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
	if over := len(h.ops) - h.limit; over > 0 {
		h.ops = append(h.ops[:0:0], h.ops[over:]...)
	}
	return op
}

// Finish marks op (returned by Start) done, or failed with err.
func (h *History) Finish(op *shalev1.PlacementOperation, finishedUnixNanos int64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.FinishedUnixNanos = finishedUnixNanos
	op.State = "done"
	if err != nil {
		op.State, op.Error = "failed", err.Error()
	}
}

// List returns copies of the last limit operations (all kept when limit
// is 0), oldest first.
func (h *History) List(limit int) []*shalev1.PlacementOperation {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := h.ops
	if limit > 0 && len(ops) > limit {
		ops = ops[len(ops)-limit:]
	}
	out := make([]*shalev1.PlacementOperation, len(ops))
	for i, op := range ops {
		out[i] = proto.Clone(op).(*shalev1.PlacementOperation)
	}
	return out
}

// Running returns copies of the operations still running, oldest first.
func (h *History) Running() []*shalev1.PlacementOperation {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*shalev1.PlacementOperation
	for _, op := range h.ops {
		if op.State == "running" {
			out = append(out, proto.Clone(op).(*shalev1.PlacementOperation))
		}
	}
	return out
}
