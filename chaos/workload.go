// Package chaos is Shale's fault-injection test suite: a seeded schedule of
// faults (harness.Cluster's nemeses) against a containerised cluster while
// concurrent clients run a recorded key-value workload, then checks of the
// history: linearizability per key (porcupine, through internal/lincheck)
// and no acknowledged write lost. See README.md for how to run it and the
// bugs it found.
package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/lincheck"
)

// WorkloadOptions shape a Workload.
type WorkloadOptions struct {
	// Keys is the number of key slots, k00, k01, ... (default 40).
	Keys int
	// OpsPerKey is how many operations a slot's key takes before the slot
	// moves to a fresh key (k07/0, k07/1, ...; default 300): porcupine's
	// search grows with the writes of unknown outcome a key's history
	// holds (each stays open to the history's end), so short histories per
	// key keep the check decidable however long the run (as Jepsen's
	// independent keys do).
	OpsPerKey int
	// Workers is the number of concurrent logical clients (default 16).
	Workers int
	// MaxInFlightPerKey bounds the operations in flight on one key
	// (default 8), which keeps porcupine's search tractable.
	MaxInFlightPerKey int
	// OpTimeout is the deadline of one operation, retries included
	// (default 2s); a write that times out has an unknown outcome.
	OpTimeout time.Duration
	// Seed makes the workload's choices repeatable.
	Seed uint64
}

// slotPrefix is the prefix of slot i's keys; consecutive slots' keys sort
// in slot order, so a scan of slots i to j reads [slotPrefix(i),
// slotPrefix(j+1)).
func slotPrefix(i int) string { return fmt.Sprintf("k%02d", i) }

// slotKey is slot i's key of generation gen.
func slotKey(i, gen int) string { return fmt.Sprintf("%s/%d", slotPrefix(i), gen) }

// Workload runs get, put, compare-and-swap, delete and short scans over a
// few keys spread over several shards, recording every operation (with a
// unique value per write) in a lincheck.Recorder.
type Workload struct {
	opts    WorkloadOptions
	rec     *lincheck.Recorder
	clients []*client.Client
	sems    []chan struct{}

	mu    sync.Mutex
	seen  map[string]string // last value seen per key, for CAS expectations
	gen   []int             // per slot: the generation of its key
	calls []int             // per slot: operations called on its key
}

// NewWorkload returns a workload that records into rec and spreads its
// workers over clients.
func NewWorkload(rec *lincheck.Recorder, clients []*client.Client, opts WorkloadOptions) *Workload {
	if opts.Keys == 0 {
		opts.Keys = 40
	}
	if opts.Workers == 0 {
		opts.Workers = 16
	}
	if opts.MaxInFlightPerKey == 0 {
		opts.MaxInFlightPerKey = 8
	}
	if opts.OpTimeout == 0 {
		opts.OpTimeout = 2 * time.Second
	}
	if opts.OpsPerKey == 0 {
		opts.OpsPerKey = 300
	}
	w := &Workload{opts: opts, rec: rec, clients: clients, seen: map[string]string{},
		gen: make([]int, opts.Keys), calls: make([]int, opts.Keys)}
	for i := 0; i < opts.Keys; i++ {
		w.sems = append(w.sems, make(chan struct{}, opts.MaxInFlightPerKey))
	}
	return w
}

// Client IDs: worker w uses w*clientStride for single-key operations and
// w*clientStride+1+j for the j-th key of a scan (each ID's operations are
// sequential, as lincheck requires).
const clientStride = 16

// maxScanKeys is the most keys a scan covers.
const maxScanKeys = 5

// Run runs the workers until ctx ends.
func (w *Workload) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := 0; i < w.opts.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.worker(ctx, i)
		}()
	}
	wg.Wait()
}

func (w *Workload) acquire(ctx context.Context, keys ...int) bool {
	for n, k := range keys {
		select {
		case w.sems[k] <- struct{}{}:
		case <-ctx.Done():
			w.release(keys[:n]...)
			return false
		}
	}
	return true
}

func (w *Workload) release(keys ...int) {
	for _, k := range keys {
		<-w.sems[k]
	}
}

func (w *Workload) worker(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.opts.Seed, uint64(id)+1))
	cl := w.clients[id%len(w.clients)]
	cid := (id + 1) * clientStride
	for ctx.Err() == nil {
		p := rng.IntN(100)
		if p < 15 {
			w.scan(ctx, rng, cl, cid)
			continue
		}
		k := rng.IntN(w.opts.Keys)
		key := w.useKey(k)
		var in lincheck.Input
		switch {
		case p < 45:
			in = lincheck.Input{Kind: lincheck.KindGet, Key: key}
		case p < 70:
			in = lincheck.Input{Kind: lincheck.KindPut, Key: key, Value: w.rec.NewValue(cid)}
		case p < 88:
			in = lincheck.Input{Kind: lincheck.KindCAS, Key: key, Value: w.rec.NewValue(cid)}
			w.mu.Lock()
			if v, ok := w.seen[key]; ok && rng.IntN(4) != 0 {
				in.Expect = v
			} else {
				in.ExpectAbsent = true
			}
			w.mu.Unlock()
		default:
			in = lincheck.Input{Kind: lincheck.KindDelete, Key: key}
		}
		if !w.acquire(ctx, k) {
			return
		}
		opCtx, cancel := context.WithTimeout(ctx, w.opts.OpTimeout)
		out, err := lincheck.Exec(opCtx, w.rec, cl, cid, in)
		cancel()
		w.release(k)
		if err == nil {
			w.note(in, out)
		}
	}
}

// useKey returns slot k's current key and counts an operation on it,
// moving the slot to a fresh key after OpsPerKey operations. A slot's
// operations in flight when it moves finish on the old key, which nothing
// touches after them.
func (w *Workload) useKey(k int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := slotKey(k, w.gen[k])
	if w.calls[k]++; w.calls[k] >= w.opts.OpsPerKey {
		w.gen[k], w.calls[k] = w.gen[k]+1, 0
	}
	return key
}

// usedKeys returns every key the workload has used, slot by slot.
func (w *Workload) usedKeys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var keys []string
	for k, last := range w.gen {
		for g := 0; g <= last; g++ {
			keys = append(keys, slotKey(k, g))
		}
	}
	return keys
}

// note remembers the key's value as this operation saw or left it.
func (w *Workload) note(in lincheck.Input, out lincheck.Output) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case in.Kind == lincheck.KindPut || (in.Kind == lincheck.KindCAS && out.Swapped):
		w.seen[in.Key] = in.Value
	case in.Kind == lincheck.KindGet && out.Found, in.Kind == lincheck.KindCAS && out.Found:
		w.seen[in.Key] = out.Value
	default:
		delete(w.seen, in.Key)
	}
}

// scan reads 2 to maxScanKeys consecutive slots with one Scan and records
// it as a read of each slot's current key: every page of a scan is a
// linearizable read, so each key's presence and value as returned held at
// some point between the scan's call and its end. (The range holds the
// slots' earlier keys too; their reads are not recorded.)
func (w *Workload) scan(ctx context.Context, rng *rand.Rand, cl *client.Client, cid int) {
	n := 2 + rng.IntN(maxScanKeys-1)
	first := rng.IntN(w.opts.Keys - n + 1)
	keys := make([]int, n)
	for j := range keys {
		keys[j] = first + j
	}
	if !w.acquire(ctx, keys...) {
		return
	}
	defer w.release(keys...)
	ops := make([]*lincheck.Op, n)
	names := make([]string, n)
	for j, k := range keys {
		names[j] = w.useKey(k)
		ops[j] = w.rec.Call(cid+1+j, lincheck.Input{Kind: lincheck.KindGet, Key: names[j]})
	}
	opCtx, cancel := context.WithTimeout(ctx, w.opts.OpTimeout)
	defer cancel()
	got := map[string]string{}
	it := cl.Scan(opCtx, []byte(slotPrefix(first)), []byte(slotPrefix(first+n)))
	for it.Next() {
		got[string(it.KV().Key)] = string(it.KV().Value)
	}
	err := it.Err()
	it.Close()
	for j := range keys {
		if err != nil {
			ops[j].Unknown(err) // a read that observed nothing
			continue
		}
		v, ok := got[names[j]]
		ops[j].Return(lincheck.Output{Found: ok, Value: v})
	}
}

// FinalReads reads every key the workload used once more (after the faults
// are healed), as the history's last operations, and returns what it read
// (absent keys are missing from the map).
func (w *Workload) FinalReads(ctx context.Context, cl *client.Client) (map[string]string, error) {
	out := map[string]string{}
	for _, key := range w.usedKeys() {
		in := lincheck.Input{Kind: lincheck.KindGet, Key: key}
		var (
			res lincheck.Output
			err error
		)
		for attempt := 0; attempt < 10; attempt++ {
			opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err = lincheck.Exec(opCtx, w.rec, cl, 1, in)
			cancel()
			if err == nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("final read of %s: %w", key, err)
		}
		if res.Found {
			out[key] = res.Value
		}
	}
	return out, nil
}
