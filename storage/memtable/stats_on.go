//go:build memtablestats

package memtable

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// A diagnostic build (go build -tags memtablestats) counts, per class of
// key, the skiplist's inserts and seeks, the key comparisons they made and
// how many of those needed the key bytes (the 8-byte prefixes were equal),
// and, with MEMTABLESTATS set in the environment, prints the
// running totals to stderr every 10 s. The classes are the
// key layouts of Shale's two kinds of engine (docs/shard-state-machine.md,
// replication/raftlog): a diagnostic only, the skiplist itself knows no
// layout.
const statsEnabled = true

type classTotals struct {
	ops, compares, keyCompares, adjacent, hinted int64
}

var stats struct {
	sync.Mutex
	adds, seeks map[string]*classTotals
}

func statsClass(k []byte) string {
	switch {
	case len(k) == 0:
		return "empty"
	case k[0] == 'r' && len(k) == 18 && k[9] == 'e':
		return "raftlog entry"
	case k[0] == 'r' && len(k) == 10 && k[9] == 'h':
		return "raftlog hardstate"
	case k[0] == 'r':
		return "raftlog other"
	case k[0] == 'd':
		return "shard data"
	case strings.HasPrefix(string(k), "mdedup-id/"):
		return "shard dedup-id"
	case string(k) == "mapplied":
		return "shard applied"
	case k[0] == 'm':
		return "shard meta other"
	}
	return "other"
}

func note(m *map[string]*classTotals, key []byte, st addStats) {
	c := statsClass(key)
	stats.Lock()
	if *m == nil {
		*m = map[string]*classTotals{}
	}
	t := (*m)[c]
	if t == nil {
		t = &classTotals{}
		(*m)[c] = t
	}
	t.ops++
	t.compares += int64(st.compares)
	t.keyCompares += int64(st.keyCompares)
	if st.adjacent {
		t.adjacent++
	}
	if st.hinted {
		t.hinted++
	}
	stats.Unlock()
}

func noteAdd(key []byte, st addStats)  { note(&stats.adds, key, st) }
func noteSeek(key []byte, st addStats) { note(&stats.seeks, key, st) }

// StatsReport returns the totals so far, one line per (operation, class).
func StatsReport() string {
	stats.Lock()
	defer stats.Unlock()
	var b strings.Builder
	for _, op := range []struct {
		name string
		m    map[string]*classTotals
	}{{"add", stats.adds}, {"seek", stats.seeks}} {
		classes := make([]string, 0, len(op.m))
		for c := range op.m {
			classes = append(classes, c)
		}
		slices.Sort(classes)
		for _, c := range classes {
			t := op.m[c]
			fmt.Fprintf(&b, "memtablestats %s %-18s ops %10d  compares/op %6.2f  key-byte compares/op %6.2f  after previous add %5.1f%%  hinted %5.1f%%\n",
				op.name, c, t.ops, float64(t.compares)/float64(t.ops), float64(t.keyCompares)/float64(t.ops),
				100*float64(t.adjacent)/float64(t.ops), 100*float64(t.hinted)/float64(t.ops))
		}
	}
	return b.String()
}

func init() {
	if os.Getenv("MEMTABLESTATS") == "" {
		return
	}
	go func() {
		for range time.Tick(10 * time.Second) {
			fmt.Fprint(os.Stderr, StatsReport())
		}
	}()
}

// StatsReset zeroes the counters.
func StatsReset() {
	stats.Lock()
	stats.adds, stats.seeks = nil, nil
	stats.Unlock()
}

// statsTotals returns the Adds and their comparisons counted so far.
func statsTotals() (adds, compares int64) {
	stats.Lock()
	defer stats.Unlock()
	for _, t := range stats.adds {
		adds += t.ops
		compares += t.compares
	}
	return adds, compares
}
