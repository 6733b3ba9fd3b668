package storage

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// atRestFill writes keys [0, n) with values of generation gen, flushes, and
// waits for background work.
func atRestFill(t *testing.T, d *DB, n int, gen int) {
	t.Helper()
	for i := range n {
		v := fmt.Sprintf("gen%d-%s", gen, strings.Repeat("v", 80))
		if err := d.Set(fmt.Appendf(nil, "key%05d", i), []byte(v), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	apiWaitIdle(t, d)
}

func atRestBytesBelow(m *Metrics) uint64 {
	var below uint64
	for _, l := range m.Levels[1:] {
		below += l.Bytes
	}
	return below
}

// atRestWithinBound reports whether L0 holds at most a tenth of the bytes
// below it (the default LevelMultiplier's bound).
func atRestWithinBound(m *Metrics) bool {
	return m.Levels[0].Bytes*10 <= atRestBytesBelow(m)
}

func atRestL0Files(d *DB) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.vers.Levels[0])
}

// TestAtRestCompaction: L0 holding more than a tenth of the bytes below it
// is merged down once the DB has had no write for AtRestCompactionDelay,
// and not while writes go on; L0 within that bound, and a DB with the
// option off, keep their L0 files. The timer is driven by hand (the delay
// is an hour), so the test does not depend on the machine's speed.
func TestAtRestCompaction(t *testing.T) {
	opts := apiSmallOptions(vfs.NewMem())
	opts.L0CompactionTrigger = 6 // L0 is never due by count here
	opts.LBaseMaxBytes = 64 << 20
	opts.AtRestCompactionDelay = time.Hour
	d := apiMustOpen(t, "db", opts)
	defer d.Close()

	const n = 2000
	atRestFill(t, d, n, 1)
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	apiWaitIdle(t, d)

	// A few keys rewritten: L0 is well within a tenth of the levels below.
	atRestFill(t, d, n/50, 2)
	if m := d.Metrics(); m.Levels[0].Files == 0 || m.AtRestCompactionBytes != 0 {
		t.Fatalf("small L0: %d files, AtRestCompactionBytes %d; want files and 0", m.Levels[0].Files, m.AtRestCompactionBytes)
	}

	// Half the keys rewritten: L0 is now past the bound.
	atRestFill(t, d, n/2, 3)
	m := d.Metrics()
	if m.AtRestCompactionBytes == 0 || m.AtRestCompactionBytes != m.Levels[0].Bytes {
		t.Fatalf("AtRestCompactionBytes %d with L0 %d bytes over %v", m.AtRestCompactionBytes, m.Levels[0].Bytes, m.Levels)
	}
	l0 := atRestL0Files(d)

	// A write since the check was armed: not at rest, nothing runs, and the
	// check is armed again.
	if err := d.Set([]byte("key99999"), []byte("late"), NoSync); err != nil {
		t.Fatal(err)
	}
	d.atRestCheck()
	apiWaitIdle(t, d)
	d.mu.Lock()
	armed, due := d.atRestArmed, d.atRestDue
	d.mu.Unlock()
	if !armed || due || atRestL0Files(d) != l0 || d.Metrics().AtRestCompactions != 0 {
		t.Fatalf("after a write: armed %v due %v, L0 %d files (was %d); want armed, not due, unchanged", armed, due, atRestL0Files(d), l0)
	}

	// No write since: L0 is merged down.
	d.atRestCheck()
	apiWaitIdle(t, d)
	m = d.Metrics()
	if !atRestWithinBound(m) || m.AtRestCompactions == 0 || m.AtRestCompactionBytes != 0 {
		t.Fatalf("at rest: L0 %d files of %d bytes, %d at-rest compactions, AtRestCompactionBytes %d; want L0 within a tenth of %d bytes below, >0, 0",
			m.Levels[0].Files, m.Levels[0].Bytes, m.AtRestCompactions, m.AtRestCompactionBytes, atRestBytesBelow(m))
	}
	d.mu.Lock()
	due = d.atRestDue
	d.mu.Unlock()
	if due {
		t.Fatal("still due with L0 merged down")
	}
	for i := range n {
		want := 1
		if i < n/2 {
			want = 3
		}
		v, err := d.Get(fmt.Appendf(nil, "key%05d", i))
		if err != nil || !strings.HasPrefix(string(v), fmt.Sprintf("gen%d-", want)) {
			t.Fatalf("key%05d = %.8q, %v; want generation %d", i, v, err, want)
		}
	}

	// Off: the same L0 stays, and reports nothing to wait for.
	opts2 := apiSmallOptions(vfs.NewMem())
	opts2.L0CompactionTrigger = 6
	opts2.LBaseMaxBytes = 64 << 20
	opts2.AtRestCompactionDelay = -1
	d2 := apiMustOpen(t, "db", opts2)
	defer d2.Close()
	atRestFill(t, d2, n, 1)
	if err := d2.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	atRestFill(t, d2, n/2, 3)
	d2.mu.Lock()
	armed = d2.atRestArmed
	d2.mu.Unlock()
	if m := d2.Metrics(); armed || m.AtRestCompactionBytes != 0 || m.Levels[0].Files == 0 {
		t.Fatalf("option off: armed %v, AtRestCompactionBytes %d, L0 %d files", armed, m.AtRestCompactionBytes, m.Levels[0].Files)
	}
}

// TestAtRestCompactionTimer: with a short delay the DB's own timer merges
// L0 down after the writes stop, and a reopened DB whose L0 is past the
// bound does so too.
func TestAtRestCompactionTimer(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	opts.L0CompactionTrigger = 6
	opts.LBaseMaxBytes = 64 << 20
	opts.AtRestCompactionDelay = time.Hour
	d := apiMustOpen(t, "db", opts)
	atRestFill(t, d, 2000, 1)
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	atRestFill(t, d, 1000, 2)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	opts.AtRestCompactionDelay = 20 * time.Millisecond
	d = apiMustOpen(t, "db", opts)
	defer d.Close()
	if atRestL0Files(d) == 0 {
		t.Fatal("reopened with no L0 file")
	}
	deadline := time.Now().Add(20 * time.Second)
	for m := d.Metrics(); !atRestWithinBound(m) || m.AtRestCompactionBytes != 0 || m.AtRestCompactions == 0; m = d.Metrics() {
		if time.Now().After(deadline) {
			t.Fatalf("L0 not merged down 20s after open: %v", d.Metrics().Levels)
		}
		time.Sleep(5 * time.Millisecond)
	}
	apiWaitIdle(t, d)
	if _, err := d.Get([]byte("key00000")); err != nil {
		t.Fatal(err)
	}
}
