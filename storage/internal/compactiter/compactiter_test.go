package compactiter

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/shale-db/shale/storage/internal/base"
)

func TestTombstoneNeeded(t *testing.T) {
	for _, tc := range []struct {
		seq        base.SeqNum
		snaps      []base.SeqNum
		bottommost bool
		want       bool
	}{
		{seq: 10, want: true},                                                 // lower levels may hold covered data
		{seq: 10, snaps: []base.SeqNum{20}, want: true},                       // idem
		{seq: 10, bottommost: true, want: false},                              // no snapshot: everything covered was dropped
		{seq: 10, snaps: []base.SeqNum{10}, bottommost: true},                 // S sees the tombstone: same stripe as all it covers
		{seq: 10, snaps: []base.SeqNum{20, 30}, bottommost: true},             // earliest stripe
		{seq: 10, snaps: []base.SeqNum{9}, bottommost: true, want: true},      // S=9 sees entries <= 9 the tombstone hides from later readers
		{seq: 25, snaps: []base.SeqNum{30, 20}, bottommost: true, want: true}, // unsorted snapshots
		{seq: 30, snaps: []base.SeqNum{30, 40}, bottommost: true},
	} {
		if got := TombstoneNeeded(tc.seq, tc.snaps, tc.bottommost); got != tc.want {
			t.Errorf("TombstoneNeeded(%d, %v, %v) = %v, want %v", tc.seq, tc.snaps, tc.bottommost, got, tc.want)
		}
	}
}

func mustKVs(t *testing.T, lines ...string) []kv {
	t.Helper()
	var kvs []kv
	for _, l := range lines {
		e, err := parseEntry(l)
		if err != nil {
			t.Fatal(err)
		}
		kvs = append(kvs, e)
	}
	return kvs
}

func TestCorruptInput(t *testing.T) {
	for name, lines := range map[string][]string{
		"keys out of order":   {"b#5,SET x", "a#6,SET y"},
		"versions ascending":  {"a#5,SET x", "a#6,SET y"},
		"duplicate seq":       {"a#5,MERGE x", "a#5,SET y"},
		"duplicate in merges": {"a#7,MERGE x", "a#6,MERGE y", "a#6,DEL"},
		"range delete kind":   {"a#5,RANGEDEL b"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, m := range []base.Merger{nil, concatMerger{}} {
				it := New(newSliceIter(mustKVs(t, lines...)), Options{Merger: m})
				_, err := runIter(it)
				if !errors.Is(err, base.ErrCorruption) {
					t.Fatalf("got %v, want corruption", err)
				}
				if it.Next() || it.Key().UserKey != nil || it.Value() != nil {
					t.Fatal("iterator positioned after error")
				}
				if cerr := it.Close(); !errors.Is(cerr, base.ErrCorruption) {
					t.Fatalf("Close = %v", cerr)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	// Input error in the middle of a merge run and between keys.
	for errAt := range 5 {
		in := newSliceIter(mustKVs(t, "a#9,MERGE m9", "a#8,MERGE m8", "b#7,SET v", "c#6,MERGE x", "c#5,MERGE y"))
		in.errAt = errAt
		it := New(in, Options{Merger: concatMerger{}})
		out, err := runIter(it)
		if !errors.Is(err, errInjected) {
			t.Fatalf("errAt %d: got %v (output %v)", errAt, err, out)
		}
		if !errors.Is(it.Close(), errInjected) {
			t.Fatalf("errAt %d: Close did not report the error", errAt)
		}
	}
	// Merge operator failure.
	it := New(newSliceIter(mustKVs(t, "a#9,MERGE fail", "a#8,SET v")), Options{Merger: concatMerger{}})
	if _, err := runIter(it); !errors.Is(err, errMergeFailed) {
		t.Fatalf("got %v, want merge failure", err)
	}
}

func TestPositioning(t *testing.T) {
	in := newSliceIter(mustKVs(t, "a#9,SET x", "b#8,DEL"))
	it := New(in, Options{})
	if it.Valid() || it.Key().UserKey != nil || it.Value() != nil || it.Error() != nil {
		t.Fatal("unstarted iterator looks positioned")
	}
	// Next before First starts the iteration.
	if !it.Next() || string(it.Key().UserKey) != "a" {
		t.Fatalf("Next before First: %v", it.Key())
	}
	if !it.Next() || it.Key().Kind() != base.KindDelete || it.Value() != nil {
		t.Fatalf("second entry: %v %q", it.Key(), it.Value())
	}
	if it.Next() || it.Next() || it.Error() != nil {
		t.Fatal("expected clean exhaustion")
	}
	// First restarts, with fresh stats.
	if !it.First() || it.Stats().EntriesIn != 1 {
		t.Fatalf("restart: %v %+v", it.Key(), it.Stats())
	}
	if err := it.Close(); err != nil || !in.closed {
		t.Fatalf("Close = %v, closed %v", err, in.closed)
	}
	if it.First() || it.Next() || it.Valid() {
		t.Fatal("closed iterator positioned")
	}
	// A nil input is an empty one.
	if New(nil, Options{}).First() {
		t.Fatal("nil input yielded an entry")
	}
}

// TestDataDriven runs the scripts in testdata. The command is
//
//	compact [snapshots=(s1, ...)] [bottommost] [merger] [filter] [elide=(k1, ...)]
//
// with one input per line: "key#seq,KIND [value]" for point entries,
// "rangedel start-end#seq" for tombstones. The output lists the yielded
// entries, the tombstones TombstoneNeeded keeps, and the stats.
func TestDataDriven(t *testing.T) {
	datadriven.RunTest(t, "testdata/compact", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "compact" {
			d.Fatalf(t, "unknown command %s", d.Cmd)
		}
		var opts Options
		var ts tombs
		for _, a := range d.CmdArgs {
			switch a.Key {
			case "snapshots":
				for _, v := range a.Vals {
					var s uint64
					if _, err := fmt.Sscan(v, &s); err != nil {
						d.Fatalf(t, "bad snapshot %q", v)
					}
					opts.Snapshots = append(opts.Snapshots, base.SeqNum(s))
				}
			case "bottommost":
				opts.Bottommost = true
			case "merger":
				opts.Merger = concatMerger{}
			case "filter":
				opts.Filter = &testFilter{}
			case "elide":
				keys := a.Vals
				opts.ElideTombstone = func(k []byte) bool {
					for _, e := range keys {
						if e == string(k) {
							return true
						}
					}
					return false
				}
			default:
				d.Fatalf(t, "unknown argument %s", a.Key)
			}
		}
		var input []kv
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			if r, ok := strings.CutPrefix(line, "rangedel "); ok {
				tb, err := parseTomb(r)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				ts = append(ts, tb)
				continue
			}
			e, err := parseEntry(line)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			input = append(input, e)
		}
		sortKVs(input)
		if len(ts) > 0 {
			opts.RangeDels = ts
		}
		it := New(newSliceIter(input), opts)
		out, err := runIter(it)
		var b strings.Builder
		for _, e := range out {
			fmt.Fprintf(&b, "%s\n", e)
		}
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
		}
		if err := checkOrder(out); err != nil {
			fmt.Fprintf(&b, "ORDER: %v\n", err)
		}
		var kept []string
		for _, tb := range ts {
			if TombstoneNeeded(tb.seq, opts.Snapshots, opts.Bottommost) {
				kept = append(kept, tb.String())
			}
		}
		if len(ts) > 0 {
			fmt.Fprintf(&b, "tombstones kept: %s\n", strings.Join(kept, " "))
		}
		st := it.Stats()
		fmt.Fprintf(&b, "stats: in=%d out=%d shadowed=%d tombstoned=%d filtered=%d elided=%d merged=%d zeroed=%d\n",
			st.EntriesIn, st.EntriesOut, st.DroppedShadowed, st.DroppedByTombstone, st.DroppedByFilter,
			st.ElidedDeletes, st.Merged, st.SeqZeroed)
		_ = it.Close()
		return b.String()
	})
}
