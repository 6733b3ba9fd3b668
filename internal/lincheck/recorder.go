package lincheck

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Recorder records the operations of concurrent clients. It is safe for
// concurrent use. Timestamps are nanoseconds since NewRecorder on the
// monotonic clock.
//
// A client ID names a logical client whose operations are sequential (one in
// flight at a time); any number of clients may record concurrently. In the
// history, and so in the visualisation, each client gets a row; after an
// operation with an unknown outcome (which stays open until the end of the
// history) the client continues on a fresh row.
type Recorder struct {
	t0     time.Time
	values atomic.Uint64

	mu          sync.Mutex
	ops         []*Op
	rows        map[int]int // client → current row
	nextRow     int
	annotations []Annotation
}

// NewRecorder returns an empty Recorder whose clock starts now.
func NewRecorder() *Recorder {
	return &Recorder{t0: time.Now(), rows: map[int]int{}}
}

// Now returns the recorder's clock: nanoseconds since NewRecorder.
func (r *Recorder) Now() int64 {
	return int64(time.Since(r.t0))
}

// NewValue returns a value no other call of r's NewValue returns, naming
// client for readability ("v17.c3").
func (r *Recorder) NewValue(client int) string {
	return fmt.Sprintf("v%d.c%d", r.values.Add(1), client)
}

// outcome is the state of a recorded operation.
type outcome uint8

const (
	pending outcome = iota // called, not returned
	known                  // returned with an observed result
	failed                 // definitely without effect
	unknown                // may or may not have taken effect
)

// Op is one operation in flight, from Recorder.Call. Exactly one of Return,
// Fail and Unknown should end it; an Op never ended counts as unknown.
type Op struct {
	r      *Recorder
	client int
	row    int
	in     Input
	call   int64

	// Set under r.mu when the operation ends.
	ret     int64
	out     Output
	state   outcome
	errText string
}

// Call records the invocation of in by client, just before it is sent.
func (r *Recorder) Call(client int, in Input) *Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	row, ok := r.rows[client]
	if !ok {
		row = r.nextRow
		r.nextRow++
		r.rows[client] = row
	}
	op := &Op{r: r, client: client, row: row, in: in, call: r.Now()}
	r.ops = append(r.ops, op)
	return op
}

// end records the operation's end once; later calls are ignored.
func (o *Op) end(state outcome, out Output, err error) {
	now := o.r.Now()
	o.r.mu.Lock()
	defer o.r.mu.Unlock()
	if o.state != pending {
		return
	}
	o.ret, o.out, o.state = now, out, state
	if err != nil {
		o.errText = err.Error()
	}
	if state == unknown && o.in.Kind.IsWrite() {
		// The write stays open to the end of the history: the client
		// continues on a new row.
		delete(o.r.rows, o.client)
	}
}

// Return records that the operation returned out, an observed result.
func (o *Op) Return(out Output) {
	out.Unknown = false
	o.end(known, out, nil)
}

// Fail records that the operation definitely did not take effect (err says
// why); it is left out of the history.
func (o *Op) Fail(err error) { o.end(failed, Output{}, err) }

// Unknown records that the operation's outcome is unknown (err says why): a
// write may or may not have taken effect, a read observed nothing.
func (o *Op) Unknown(err error) { o.end(unknown, Output{Unknown: true}, err) }

// Annotation marks a span of the recorder's clock in the visualisation,
// such as a fault injected by a test.
type Annotation struct {
	// Tag is the row the annotation appears in ("nemesis", say).
	Tag string `json:"tag"`
	// Description is shown on the timeline, Details in its tooltip.
	Description string `json:"description"`
	Details     string `json:"details,omitempty"`
	// Start and End are recorder timestamps; End == Start for a point.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// Annotate adds an annotation.
func (r *Recorder) Annotate(a Annotation) {
	if a.End < a.Start {
		a.End = a.Start
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.annotations = append(r.annotations, a)
}

// Stats counts the operations of a history by outcome.
type Stats struct {
	// Calls is the number of operations called.
	Calls int `json:"calls"`
	// Known had an observed result; Failed definitely did not take effect;
	// Unknown may or may not have (Pending never ended, and counts as
	// Unknown too).
	Known   int `json:"known"`
	Failed  int `json:"failed"`
	Unknown int `json:"unknown"`
	Pending int `json:"pending"`
	// KnownByKind counts the known operations of each kind.
	KnownByKind map[string]int `json:"knownByKind"`
}

// String summarises the counts.
func (s Stats) String() string {
	return fmt.Sprintf("%d operations: %d known (%v), %d failed, %d unknown (%d never returned)",
		s.Calls, s.Known, s.KnownByKind, s.Failed, s.Unknown, s.Pending)
}

// History returns the history recorded so far. Operations still in flight
// count as unknown.
func (r *Recorder) History() *History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := &History{
		Annotations: append([]Annotation(nil), r.annotations...),
		Stats:       Stats{KnownByKind: map[string]int{}},
	}
	var last int64
	for _, op := range r.ops {
		last = max(last, op.call, op.ret)
	}
	for _, a := range h.Annotations {
		last = max(last, a.End)
	}
	h.End = last + 1
	for _, op := range r.ops {
		h.Stats.Calls++
		state, out, ret := op.state, op.out, op.ret
		if state == pending {
			h.Stats.Pending++
			state, out = unknown, Output{Unknown: true}
		}
		switch state {
		case known:
			h.Stats.Known++
			h.Stats.KnownByKind[op.in.Kind.String()]++
		case failed:
			h.Stats.Failed++
			continue
		case unknown:
			h.Stats.Unknown++
			if !op.in.Kind.IsWrite() {
				continue // a read that observed nothing constrains nothing
			}
			ret = h.End
		}
		h.Ops = append(h.Ops, Operation{
			Client: op.client, Row: op.row, Input: op.in, Output: out,
			Call: op.call, Return: ret, Error: op.errText,
		})
	}
	return h
}
