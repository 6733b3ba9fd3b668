package lincheck

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shale-db/shale/client"
)

// Shorthands for hand-made histories.
func put(k, v string) Input { return Input{Kind: KindPut, Key: k, Value: v} }
func get(k string) Input    { return Input{Kind: KindGet, Key: k} }
func del(k string) Input    { return Input{Kind: KindDelete, Key: k} }
func cas(k, exp, v string) Input {
	if exp == "" {
		return Input{Kind: KindCAS, Key: k, Value: v, ExpectAbsent: true}
	}
	return Input{Kind: KindCAS, Key: k, Expect: exp, Value: v}
}

var (
	done   = Output{}
	unk    = Output{Unknown: true}
	absent = Output{}
)

func val(v string) Output { return Output{Found: true, Value: v} }

// casOut is a compare-and-swap's result: cur "" means absent.
func casOut(swapped bool, cur string) Output {
	return Output{Swapped: swapped, Found: cur != "", Value: cur}
}

// hist builds a history; ops are (client, input, output, call, return), and
// an unknown output returns at the end.
type hop struct {
	c         int
	in        Input
	out       Output
	call, ret int64
}

func hist(ops ...hop) *History {
	h := &History{End: 1000}
	for _, o := range ops {
		ret := o.ret
		if o.out.Unknown {
			ret = h.End
		}
		h.Ops = append(h.Ops, Operation{Client: o.c, Row: o.c, Input: o.in, Output: o.out, Call: o.call, Return: ret})
	}
	return h
}

func check(t *testing.T, h *History) Result {
	t.Helper()
	res, err := Check(h, 10*time.Second, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestLinearizable(t *testing.T) {
	cases := map[string]*History{
		"sequential": hist(
			hop{0, get("a"), absent, 0, 1},
			hop{0, put("a", "1"), done, 2, 3},
			hop{0, get("a"), val("1"), 4, 5},
			hop{0, cas("a", "1", "2"), casOut(true, "1"), 6, 7},
			hop{0, cas("a", "1", "3"), casOut(false, "2"), 8, 9},
			hop{0, cas("a", "", "4"), casOut(false, "2"), 10, 11},
			hop{0, del("a"), Output{Deleted: true}, 12, 13},
			hop{0, del("a"), Output{Deleted: false}, 14, 15},
			hop{0, cas("a", "", "5"), casOut(true, ""), 16, 17},
			hop{0, get("a"), val("5"), 18, 19},
		),
		"concurrent read sees either": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{0, put("a", "2"), done, 20, 40},
			hop{1, get("a"), val("1"), 21, 25},
			hop{2, get("a"), val("2"), 22, 30},
			hop{3, get("a"), val("2"), 41, 50},
		),
		"reads order concurrent writes": hist(
			hop{0, put("a", "1"), done, 0, 100},
			hop{1, put("a", "2"), done, 0, 100},
			hop{2, get("a"), val("2"), 10, 20},
			hop{3, get("a"), val("1"), 30, 40},
			hop{2, get("a"), val("1"), 50, 60},
		),
		"keys are independent": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, put("b", "1"), done, 0, 10},
			hop{0, get("b"), val("1"), 20, 30},
			hop{1, get("a"), val("1"), 20, 30},
		),
		"unknown write applied late": hist(
			hop{0, put("a", "1"), unk, 0, 0},
			hop{1, get("a"), absent, 10, 20},
			hop{1, get("a"), val("1"), 30, 40},
		),
		"unknown write never applied": hist(
			hop{0, put("a", "1"), done, 0, 5},
			hop{1, put("a", "2"), unk, 6, 0},
			hop{2, get("a"), val("1"), 10, 20},
			hop{2, get("a"), val("1"), 30, 40},
		),
		"unknown cas applied": hist(
			hop{0, put("a", "1"), done, 0, 5},
			hop{1, cas("a", "1", "2"), unk, 6, 0},
			hop{2, get("a"), val("2"), 10, 20},
		),
		"unknown delete applied": hist(
			hop{0, put("a", "1"), done, 0, 5},
			hop{1, del("a"), unk, 6, 0},
			hop{2, get("a"), val("1"), 10, 20},
			hop{2, get("a"), absent, 30, 40},
		),
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			if res := check(t, h); !res.OK() {
				t.Fatalf("want linearizable: %v", res)
			}
		})
	}
}

func TestViolations(t *testing.T) {
	cases := map[string]*History{
		"stale read": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{0, put("a", "2"), done, 20, 30},
			hop{1, get("a"), val("1"), 40, 50},
		),
		"stale read after a read of the new value": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{0, put("a", "2"), done, 20, 100},
			hop{1, get("a"), val("2"), 30, 40},
			hop{2, get("a"), val("1"), 50, 60},
		),
		"lost write": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, get("a"), absent, 20, 30},
		),
		"lost write under a later write": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, cas("a", "", "2"), casOut(true, ""), 20, 30},
		),
		"lost update: two swaps from one value": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, cas("a", "1", "2"), casOut(true, "1"), 20, 40},
			hop{2, cas("a", "1", "3"), casOut(true, "1"), 20, 40},
		),
		"read of a value never written": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, get("a"), val("9"), 20, 30},
		),
		"failed cas reports the wrong current value": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, cas("a", "2", "3"), casOut(false, "4"), 20, 30},
		),
		"delete of a present key reports absent": hist(
			hop{0, put("a", "1"), done, 0, 10},
			hop{1, del("a"), Output{Deleted: false}, 20, 30},
		),
		"unknown write cannot be undone": hist(
			hop{0, put("a", "1"), unk, 0, 0},
			hop{1, get("a"), val("1"), 10, 20},
			hop{1, get("a"), absent, 30, 40},
		),
		"read before the write was called": hist(
			hop{1, get("a"), val("1"), 0, 5},
			hop{0, put("a", "1"), unk, 10, 0},
		),
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			h.Annotations = []Annotation{{Tag: "nemesis", Description: "kill node 1", Start: 5, End: 15}}
			res := check(t, h)
			if res.Outcome != porcupine.Illegal {
				t.Fatalf("want a violation, got %v", res)
			}
			html, err := os.ReadFile(res.VisualizationPath)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(html), "kill node 1") || !strings.Contains(string(html), `put(\"a\", \"1\")`) {
				t.Fatalf("visualisation lacks the annotation or the operations")
			}
			back, err := ReadHistory(res.HistoryPath)
			if err != nil {
				t.Fatal(err)
			}
			if len(back.Ops) != len(h.Ops) || back.Ops[0] != h.Ops[0] {
				t.Fatalf("history round trip: %+v", back)
			}
			if again, _ := Check(back, 10*time.Second, ""); again.Outcome != porcupine.Illegal {
				t.Fatalf("reloaded history: %v", again)
			}
		})
	}
}

func TestCheckWritesNothingWhenLinearizable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	res, err := Check(hist(hop{0, put("a", "1"), done, 0, 1}), time.Second, dir)
	if err != nil || !res.OK() || res.VisualizationPath != "" || res.HistoryPath != "" {
		t.Fatalf("%v %v", res, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("output directory created: %v", err)
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder()
	const clients, perClient = 8, 50
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", c)
			last := ""
			for i := 0; i < perClient; i++ {
				switch i % 5 {
				case 0, 1:
					v := r.NewValue(c)
					op := r.Call(c, put(key, v))
					op.Return(Output{})
					last = v
				case 2:
					r.Call(c, get(key)).Return(val(last))
				case 3:
					// A write that timed out: it did apply (the next
					// read sees it), which an unk outcome allows.
					v := r.NewValue(c)
					r.Call(c, put(key, v)).Unknown(errors.New("deadline exceeded"))
					last = v
				case 4:
					r.Call(c, get(key)).Unknown(errors.New("unavailable")) // dropped
					r.Call(c, put(key, "")).Fail(errors.New("invalid"))    // dropped
				}
			}
		}()
	}
	wg.Wait()
	pendingOp := r.Call(99, put("k0", r.NewValue(99))) // never ends: unk
	r.Annotate(Annotation{Tag: "nemesis", Description: "isolate 2", Start: 10, End: 5})
	h := r.History()

	want := Stats{
		Calls:   clients*perClient + clients*perClient/5 + 1,
		Known:   clients * perClient * 3 / 5,
		Failed:  clients * perClient / 5,
		Unknown: clients*perClient*2/5 + 1,
		Pending: 1,
	}
	got := h.Stats
	got.KnownByKind = nil
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stats %v, want %v", got, want)
	}
	if n := len(h.Ops); n != clients*perClient*4/5+1 {
		t.Fatalf("%d operations in the history", n)
	}
	rows := map[int]map[int]bool{} // row → clients
	seen := map[string]bool{}
	for _, op := range h.Ops {
		if op.Input.Kind == KindGet && op.Output.Unknown {
			t.Fatalf("unknown read kept: %+v", op)
		}
		if op.Output.Unknown != (op.Return == h.End) || op.Call > op.Return || op.Return > h.End {
			t.Fatalf("bad times: %+v (end %d)", op, h.End)
		}
		if op.Input.Kind == KindPut {
			if seen[op.Input.Value] {
				t.Fatalf("value %q written twice", op.Input.Value)
			}
			seen[op.Input.Value] = true
		}
		if rows[op.Row] == nil {
			rows[op.Row] = map[int]bool{}
		}
		rows[op.Row][op.Client] = true
	}
	for row, cs := range rows {
		if len(cs) != 1 {
			t.Fatalf("row %d shared by clients %v", row, cs)
		}
	}
	// Every client moved to a new row after each of its unk writes.
	if len(rows) != clients*perClient/5+1 {
		t.Fatalf("%d rows", len(rows))
	}
	if a := h.Annotations; len(a) != 1 || a[0].End != a[0].Start {
		t.Fatalf("annotations %+v", a)
	}
	if res := check(t, h); !res.OK() {
		t.Fatalf("recorded history: %v", res)
	}
	pendingOp.Return(Output{}) // too late: History was taken, but must not panic
}

func TestClassify(t *testing.T) {
	wrapped := fmt.Errorf("call: %w", client.ErrUnavailable)
	cases := []struct {
		k    Kind
		err  error
		want Outcome
	}{
		{KindPut, nil, Known},
		{KindGet, client.ErrNotFound, Known},
		{KindDelete, client.ErrNotFound, Unknown},
		{KindPut, fmt.Errorf("x: %w", client.ErrInvalidArgument), Failed},
		{KindCAS, wrapped, Unknown},
		{KindGet, wrapped, Unknown},
		{KindDelete, client.ErrClosed, Unknown},
		{KindPut, errors.New("connection reset"), Unknown},
	}
	for _, c := range cases {
		if got := Classify(c.k, c.err); got != c.want {
			t.Errorf("Classify(%v, %v) = %v, want %v", c.k, c.err, got, c.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	for in, want := range map[string]string{
		Describe(get("a"), val("1")):                     `get("a") → "1"`,
		Describe(get("a"), absent):                       `get("a") → absent`,
		Describe(put("a", "1"), unk):                     `put("a", "1") → ?`,
		Describe(cas("a", "", "2"), casOut(true, "")):    `cas("a", absent→"2") → swapped (was absent)`,
		Describe(cas("a", "1", "2"), casOut(false, "3")): `cas("a", "1"→"2") → not swapped (is "3")`,
		Describe(del("a"), Output{Deleted: true}):        `delete("a") → deleted`,
	} {
		if in != want {
			t.Errorf("got %s, want %s", in, want)
		}
	}
}

// TestCheckKeyByKey: a violation on one key is found among other keys'
// linearizable operations, and the visualisation draws that key alone.
func TestCheckKeyByKey(t *testing.T) {
	var ops []hop
	for i := int64(0); i < 50; i++ {
		ops = append(ops, hop{0, put("b", fmt.Sprint(i)), done, 100 * i, 100*i + 10})
	}
	ops = append(ops,
		hop{1, put("a", "1"), done, 0, 10},
		hop{1, put("a", "2"), done, 20, 30},
		hop{2, get("a"), val("1"), 40, 50}, // stale
	)
	res := check(t, hist(ops...))
	if res.Outcome != porcupine.Illegal {
		t.Fatalf("want a violation, got %v", res)
	}
	html, err := os.ReadFile(res.VisualizationPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), `put(\"a\", \"2\")`) || strings.Contains(string(html), `put(\"b\"`) {
		t.Fatal("the visualisation should draw key a's operations and no other key's")
	}
}

// simChaosHistory simulates a linearizable history of the chaos workload's
// shape: workers call gets, puts, compare-and-swaps and deletes of a few
// keys back to back, each known operation taking effect at a random point
// of its interval. During the fault windows (two fifths of every quarter of
// the run, and its last 5%) a quarter of the operations fail with an
// unknown outcome: a read is left out, a write takes effect with
// probability tookEffect, at a random time up to 5,000 units (about 100
// operations of the worker) after its call, or never. Keys are slots k00,
// k01, ...; with opsPerKey > 0 a slot moves to a fresh key (k07/1, k07/2,
// ...) after that many operations, as the chaos workload does.
func simChaosHistory(seed int64, workers, keys, opsPerWorker, opsPerKey int, tookEffect float64) *History {
	rng := rand.New(rand.NewSource(seed))
	type ev struct {
		op   Operation
		lin  int64
		eff  bool
		keep bool
	}
	span := int64(opsPerWorker) * 60
	inFault := func(t int64) bool {
		f := t * 20 / span
		return f%5 >= 3 || t > span*95/100
	}
	var evs []*ev
	written := map[string][]string{}
	gen, calls := make([]int, keys), make([]int, keys)
	n := 0
	for w := 0; w < workers; w++ {
		t := rng.Int63n(50)
		for i := 0; i < opsPerWorker; i++ {
			slot := rng.Intn(keys)
			key := fmt.Sprintf("k%02d/%d", slot, gen[slot])
			if calls[slot]++; opsPerKey > 0 && calls[slot] == opsPerKey {
				gen[slot], calls[slot] = gen[slot]+1, 0
			}
			var in Input
			switch p := rng.Intn(85); {
			case p < 30:
				in = get(key)
			case p < 55:
				in = put(key, fmt.Sprint("v", n))
			case p < 73:
				in = Input{Kind: KindCAS, Key: key, Value: fmt.Sprint("v", n), ExpectAbsent: true}
				if ws := written[key]; len(ws) > 0 && rng.Intn(4) != 0 {
					in = cas(key, ws[max(0, len(ws)-1-rng.Intn(3))], in.Value)
				}
			default:
				in = del(key)
			}
			if in.Kind.IsWrite() && in.Kind != KindDelete {
				written[key] = append(written[key], in.Value)
			}
			n++
			d := 5 + rng.Int63n(50)
			e := &ev{op: Operation{Client: w, Row: w, Input: in, Call: t, Return: t + d}, lin: t + rng.Int63n(d+1), eff: true, keep: true}
			if inFault(t) && rng.Intn(100) < 25 {
				if in.Kind == KindGet {
					e.eff, e.keep = false, false
				} else {
					e.op.Output.Unknown = true
					e.eff = rng.Float64() < tookEffect
					e.lin = t + rng.Int63n(5000)
				}
			}
			evs = append(evs, e)
			t += d + rng.Int63n(10)
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].lin < evs[j].lin })
	states := map[string]State{}
	end := int64(0)
	for _, e := range evs {
		end = max(end, e.op.Return, e.lin)
		if !e.eff {
			continue
		}
		in, s := e.op.Input, states[e.op.Input.Key]
		out := Output{}
		switch in.Kind {
		case KindGet:
			out = Output{Found: s.Present, Value: s.Value}
		case KindPut:
			s = State{Present: true, Value: in.Value}
		case KindCAS:
			out = Output{Found: s.Present, Value: s.Value, Swapped: casMatches(s, in)}
			if out.Swapped {
				s = State{Present: true, Value: in.Value}
			}
		case KindDelete:
			out = Output{Deleted: s.Present}
			s = State{}
		}
		states[in.Key] = s
		if !e.op.Output.Unknown {
			e.op.Output = out
		}
	}
	h := &History{End: end + 1}
	for _, e := range evs {
		if !e.keep {
			continue
		}
		if e.op.Output.Unknown {
			e.op.Return = h.End
		}
		h.Ops = append(h.Ops, e.op)
	}
	sort.Slice(h.Ops, func(i, j int) bool { return h.Ops[i].Call < h.Ops[j].Call })
	return h
}

// TestCheckManyUnknownWrites checks histories of the chaos workload's shape
// with thousands of writes of unknown outcome whose keys rotate every 300
// operations: each unknown write stays open to the history's end, and the
// same history on 40 fixed keys (opsPerKey 0) was undecided after 20 s of
// search in both cases (the chaos smoke run's check ran out of its 5
// minutes on 3,334 unknown operations), while with rotated keys each check
// takes under a second.
func TestCheckManyUnknownWrites(t *testing.T) {
	for _, tookEffect := range []float64{0.2, 0.8} {
		h := simChaosHistory(1, 16, 40, 3000, 300, tookEffect)
		unknown := 0
		for _, op := range h.Ops {
			if op.Output.Unknown {
				unknown++
			}
		}
		res, err := Check(h, 2*time.Minute, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("took effect %v: %d operations, %d unknown: %v", tookEffect, len(h.Ops), unknown, res)
		if res.Outcome != porcupine.Ok {
			t.Fatalf("took effect %v: %v", tookEffect, res)
		}
		// A stale read of another key must still be found.
		bad := *h
		bad.Ops = append(append([]Operation(nil), h.Ops...),
			Operation{Client: 99, Row: 99, Input: put("kx", "1"), Call: 10, Return: 20},
			Operation{Client: 99, Row: 99, Input: put("kx", "2"), Call: 30, Return: 40},
			Operation{Client: 98, Row: 98, Input: get("kx"), Output: val("1"), Call: 50, Return: 60})
		if res, err := Check(&bad, 2*time.Minute, ""); err != nil || res.Outcome != porcupine.Illegal {
			t.Fatalf("took effect %v with a stale read: %v %v", tookEffect, res, err)
		}
	}
}

// TestCheckUnobservedWriteNeededByDelete checks the case where a write
// nothing observed is the only explanation of a delete that found the key:
// the history is linearizable, and Check must not call it a violation.
func TestCheckUnobservedWriteNeededByDelete(t *testing.T) {
	h := hist(
		hop{0, put("a", "1"), unk, 0, 0},
		hop{1, del("a"), Output{Deleted: true}, 10, 20},
		hop{1, get("a"), absent, 30, 40},
	)
	if res := check(t, h); res.Outcome != porcupine.Ok {
		t.Fatalf("want linearizable, got %v", res)
	}
	// The same without the unknown write is a violation.
	h = hist(
		hop{1, del("a"), Output{Deleted: true}, 10, 20},
	)
	if res := check(t, h); res.Outcome != porcupine.Illegal {
		t.Fatalf("want a violation, got %v", res)
	}
}
