package storage

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
)

// apiGate is an errorfs injector whose hook the test sets and clears; the
// hook may block the operation.
type apiGate struct {
	mu   sync.Mutex
	hook func(op errorfs.Op, path string)
}

func (g *apiGate) MaybeError(op errorfs.Op, path string) error {
	g.mu.Lock()
	h := g.hook
	g.mu.Unlock()
	if h != nil {
		h(op, path)
	}
	return nil
}

func (g *apiGate) set(h func(op errorfs.Op, path string)) {
	g.mu.Lock()
	g.hook = h
	g.mu.Unlock()
}

// apiWaitFor polls cond for up to 10 s.
func apiWaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestAPIIngestRacesWithCompactionPick: IngestSST chooses the file's level
// under the DB mutex, then releases it to link or rewrite the file. A
// compaction picked in that window (here: after a flush that finishes
// meanwhile) does not know about the file and may write output overlapping
// it into the same level. Installing that output must not fail or leave
// overlapping files in a level.
//
// Sequence (made deterministic with filesystem hooks): the memtable holds
// "a" and "z"; a flush of it is held at its SST creation; the ingestion of
// a file [m, n] (which overlaps no key, so it targets L6 with no seqnum) is
// held at its link; the flush is released and an L0->L6 compaction of
// [a, z] is picked and held at its output creation; the ingestion then
// installs [m, n] in L6; finally the compaction installs [a, z] in L6.
//
// Known engine bug (reported, not fixed here): the compaction's version
// edit fails the L6 ordering check and the DB enters the background-error
// state, refusing all writes. Run with SHALE_KNOWN_BUGS=1 to see it.
func TestAPIIngestRacesWithCompactionPick(t *testing.T) {
	if os.Getenv("SHALE_KNOWN_BUGS") == "" {
		t.Skip("known engine bug: compaction picked during IngestSST I/O can overlap the ingested file (set SHALE_KNOWN_BUGS=1)")
	}
	mem := vfs.NewMem()
	gate := &apiGate{}
	opts := apiSmallOptions(errorfs.Wrap(mem, gate))
	opts.L0CompactionTrigger = 1
	d := apiMustOpen(t, "db", opts)
	defer d.Close()
	apiWriteSST(t, mem, "ext.sst", apiSet("m", "ingested-m"), apiSet("n", "ingested-n"))
	for _, k := range []string{"a", "z"} {
		if err := d.Set([]byte(k), []byte("mem-"+k), NoSync); err != nil {
			t.Fatal(err)
		}
	}

	var (
		flushHeld   = make(chan struct{})
		flushGo     = make(chan struct{})
		ingestHeld  = make(chan struct{})
		ingestGo    = make(chan struct{})
		compactHeld = make(chan struct{})
		compactGo   = make(chan struct{})
		step        int
		stepMu      sync.Mutex
	)
	gate.set(func(op errorfs.Op, path string) {
		if !strings.HasPrefix(path, "db/") || !strings.HasSuffix(path, ".sst") {
			return
		}
		stepMu.Lock()
		s := step
		switch {
		case op == errorfs.OpCreate && s == 0: // the flush's output
			step++
			stepMu.Unlock()
			close(flushHeld)
			<-flushGo
			return
		case op == errorfs.OpLink && s == 1: // the ingestion's link
			step++
			stepMu.Unlock()
			close(ingestHeld)
			<-ingestGo
			return
		case op == errorfs.OpCreate && s == 2: // the compaction's output
			step++
			stepMu.Unlock()
			close(compactHeld)
			<-compactGo
			return
		}
		stepMu.Unlock()
	})

	flushErr := make(chan error, 1)
	go func() { flushErr <- d.Flush() }()
	<-flushHeld
	ingestErr := make(chan error, 1)
	go func() { ingestErr <- d.IngestSST([]string{"ext.sst"}) }()
	<-ingestHeld
	close(flushGo)
	if err := <-flushErr; err != nil {
		t.Fatal(err)
	}
	// The flush schedules an L0->L6 compaction of [a, z]: either a rewrite
	// (held at its output) or a move (no output file; it completes).
	apiWaitFor(t, "the compaction to be held or to finish", func() bool {
		select {
		case <-compactHeld:
			return true
		default:
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.compactions) == 0 && len(d.vers.Levels[0]) == 0
	})
	close(ingestGo)
	ingErr := <-ingestErr
	close(compactGo)
	apiWaitIdle(t, d)
	if ingErr != nil {
		t.Fatalf("ingest: %v", ingErr)
	}
	apiWaitIdle(t, d)
	gate.set(nil)

	if err := d.Metrics().BackgroundError; err != nil {
		t.Fatalf("background error after an ingestion raced with a compaction: %v", err)
	}
	d.mu.Lock()
	err := d.vers.CheckOrdering()
	d.mu.Unlock()
	if err != nil {
		t.Fatalf("version invalid: %v", err)
	}
	want := oracle{"a": "mem-a", "z": "mem-z", "m": "ingested-m", "n": "ingested-n"}
	apiCheckEqual(t, "after race", apiDump(t, d, nil), want)
	if err := d.Set([]byte("b"), []byte("1"), NoSync); err != nil {
		t.Fatalf("write after the race: %v", err)
	}
}

// TestAPISnapshotDuringIngestLink: a snapshot taken while IngestSST is
// linking a file (no overlap, no snapshot open when it started, so the file
// goes in at sequence number 0) must not start seeing the file's keys when
// the ingestion completes: a snapshot's view never changes.
//
// Known engine bug (reported, not fixed here): ingestLocked decides
// needSeq before releasing d.mu for the link, and NewSnapshot does not
// wait for the commit barrier the ingestion holds; the seq-0 file then
// shows through every snapshot. Run with SHALE_KNOWN_BUGS=1 to see it.
func TestAPISnapshotDuringIngestLink(t *testing.T) {
	if os.Getenv("SHALE_KNOWN_BUGS") == "" {
		t.Skip("known engine bug: snapshot taken during IngestSST's link sees the ingested data later (set SHALE_KNOWN_BUGS=1)")
	}
	mem := vfs.NewMem()
	gate := &apiGate{}
	d := apiMustOpen(t, "db", apiSmallOptions(errorfs.Wrap(mem, gate)))
	defer d.Close()
	if err := d.Set([]byte("a"), []byte("1"), NoSync); err != nil {
		t.Fatal(err)
	}
	apiWriteSST(t, mem, "ext.sst", apiSet("x", "ingested"))
	held, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	gate.set(func(op errorfs.Op, path string) {
		if op == errorfs.OpLink {
			once.Do(func() {
				close(held)
				<-resume
			})
		}
	})
	errc := make(chan error, 1)
	go func() { errc <- d.IngestSST([]string{"ext.sst"}) }()
	<-held
	snap := d.NewSnapshot()
	defer snap.Close()
	before := apiDump(t, d, snap)
	close(resume)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	gate.set(nil)
	after := apiDump(t, d, snap)
	apiCheckEqual(t, "snapshot view after the ingestion completed", after, before)
	if _, err := snap.Get([]byte("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("snapshot taken during the ingestion sees its key: %v", err)
	}
}
