package storage

import (
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
// The bug this reproduced: the compaction's version edit failed the L6
// ordering check and the DB entered the background-error state, refusing
// all writes. Compactions now wait while an ingestion places files.
func TestAPIIngestRacesWithCompactionPick(t *testing.T) {
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
	// Before the fix, the flush scheduled an L0->L6 compaction of [a, z]
	// here, picked without seeing the file being ingested. Now compactions
	// wait for the ingestion, so give one half a second to (wrongly) start.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		select {
		case <-compactHeld:
			t.Fatal("a compaction started while an ingestion was placing its files")
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
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
// The bug this reproduced: ingestLocked decided needSeq before releasing
// d.mu for the link, and NewSnapshot did not wait; the seq-0 file then
// showed through every snapshot. NewSnapshot now waits for ingestions.
func TestAPISnapshotDuringIngestLink(t *testing.T) {
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
	// A snapshot requested now waits for the ingestion: whether the file
	// needed a sequence number was decided from the snapshots open when it
	// started.
	snapc := make(chan *Snapshot, 1)
	go func() { snapc <- d.NewSnapshot() }()
	select {
	case <-snapc:
		t.Fatal("NewSnapshot returned while an ingestion was placing its files")
	case <-time.After(200 * time.Millisecond):
	}
	close(resume)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	snap := <-snapc
	defer snap.Close()
	before := apiDump(t, d, snap)
	gate.set(nil)
	if err := d.Set([]byte("x"), []byte("later"), NoSync); err != nil {
		t.Fatal(err)
	}
	after := apiDump(t, d, snap)
	apiCheckEqual(t, "snapshot view after a later write", after, before)
	if v, err := snap.Get([]byte("x")); err != nil || string(v) != "ingested" {
		t.Fatalf("snapshot taken after the ingestion: x = %q, %v; want the ingested value", v, err)
	}
}
