package lincheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
