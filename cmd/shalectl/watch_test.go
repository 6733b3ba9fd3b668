package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/internal/testcluster"
)

// TestWatch: shalectl watch prints the changes under a prefix as they
// happen, across both shards of a real cluster, with previous values, and
// replays them from a start revision; --count ends it.
func TestWatch(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("w/m")}})
	eps := strings.Join(c.Endpoints(), ",")
	args := func(a ...string) []string { return append([]string{"--endpoints", eps, "--timeout", "20s"}, a...) }

	done := make(chan result, 1)
	go func() { done <- shalectl(t, args("watch", "w/", "--prev-kv", "--count", "5")...) }()
	// Write until the watch has seen its five changes (it may start after
	// the first writes: it only prints new changes).
	var r result
	for i := 0; ; i++ {
		ok(t, args("kv", "put", fmt.Sprintf("w/%c", "az"[i%2]), fmt.Sprint("v", i))...)
		ok(t, args("kv", "put", "x", "outside")...)
		select {
		case r = <-done:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	if r.code != 0 {
		t.Fatalf("watch: exit %d: %s", r.code, r.stderr)
	}
	ls := lines(r.stdout)
	if len(ls) != 5 {
		t.Fatalf("watch printed %d lines, want 5:\n%s", len(ls), r.stdout)
	}
	seen := map[string]bool{}
	for _, l := range ls {
		f := strings.Fields(l)
		if f[0] != "PUT" || !strings.HasPrefix(f[1], "w/") {
			t.Fatalf("unexpected line %q", l)
		}
		seen[f[1]] = true
	}
	if !seen["w/a"] || !seen["w/z"] {
		t.Fatalf("changes of both shards expected:\n%s", r.stdout)
	}

	// From the start: every change to w/a, in order, as JSON.
	ok(t, args("kv", "del", "w/a")...)
	out := ok(t, args("watch", "w/a", "--range-end", "w/b", "--start-revision", "1", "--prev-kv", "--count", "3", "-o", "json")...)
	var recs []watchRecord
	for _, l := range lines(out) {
		var rec watchRecord
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		recs = append(recs, rec)
	}
	if len(recs) != 3 || recs[0].Type != "PUT" || *recs[0].KV.Value != "v0" || recs[0].PrevKV != nil ||
		recs[1].PrevKV == nil || *recs[1].PrevKV.Value != "v0" || recs[1].Revision <= recs[0].Revision {
		t.Fatalf("watch from revision 1: %s", out)
	}

	// Bad input.
	contains(t, "no prefix", fails(t, args("watch")...), "PREFIX")
	contains(t, "negative count", fails(t, args("watch", "w/", "--count", "-1")...), "--count")
}
