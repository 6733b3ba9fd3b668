package shard

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
)

// TestReadLogAfterReplays: the entries ReadLogAfter gives after a
// checkpoint, replayed onto that checkpoint by BootstrapFrom, give the data
// of a later checkpoint exactly (up to any entry: a point in time), and a
// log that no longer reaches back is refused.
func TestReadLogAfterReplays(t *testing.T) {
	e := newTestEnv(t, nil)
	e.keepWAL = true
	s := e.bootstrap("/s", userDesc(7, "", ""), 0)
	f := newFeeder(s)
	apply := func(from, to int) {
		t.Helper()
		var ents []replication.Entry
		for i := from; i < to; i++ {
			var ttlMs int64
			if i == 150 { // the only record with a TTL: after the second checkpoint
				ttlMs = 60_000
			}
			v := fmt.Sprintf("v%d", i)
			if i >= 120 && i < 200 {
				// The replays after the second checkpoint write several
				// engine batches (replayBatchBytes each).
				v += strings.Repeat("x", 8<<10)
			}
			ops := []*shalev1.RequestOp{putOp(fmt.Sprintf("k%03d", i%40), v, ttlMs, false)}
			if i%9 == 0 {
				ops = append(ops, &shalev1.RequestOp{Op: &shalev1.RequestOp_DeleteRange{DeleteRange: &shalev1.DeleteRangeOp{StartKey: []byte(fmt.Sprintf("k%03d", i%40+1)), EndKey: []byte(fmt.Sprintf("k%03d", i%40+3))}}})
			}
			ents = append(ents, f.entry(marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{Success: ops}))))
			if i%13 == 0 {
				ents = append(ents, f.entry(nil))
			}
		}
		if _, err := s.Apply(ents); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func(dir string) uint64 {
		t.Helper()
		st, err := s.Checkpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		return st.Index
	}
	apply(0, 50)
	base := checkpoint("/ck1")
	apply(50, 120)
	mid := checkpoint("/ck2")
	checkpoint("/ck2b")
	checkpoint("/ck2c")
	checkpoint("/ck2d")
	apply(120, 200)

	var log []*LoggedEntry
	if err := s.ReadLogAfter(base, func(le *LoggedEntry) error { log = append(log, le); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := s.AppliedState().Index - base; uint64(len(log)) != want {
		t.Fatalf("%d entries after %d, want %d", len(log), base, want)
	}
	logBytes := 0
	for i, le := range log {
		if le.Mark.Index != base+1+uint64(i) {
			t.Fatalf("entry %d has index %d", i, le.Mark.Index)
		}
		for _, op := range le.Ops {
			logBytes += len(op.Key) + len(op.Value)
		}
	}
	if logBytes < 2*replayBatchBytes {
		t.Fatalf("the log holds %d bytes: a replay of it writes one engine batch, want several", logBytes)
	}
	// Restored from the first checkpoint and the log up to the second's
	// index: the second checkpoint's data.
	newState := replication.BootstrapState(userDesc(9, "", ""))
	var sumNoTTL func(dir, src string, from, upTo uint64, noTTL *bool) uint64
	sum := func(dir, src string, from, upTo uint64) uint64 {
		return sumNoTTL(dir, src, from, upTo, nil)
	}
	sumNoTTL = func(dir, src string, from, upTo uint64, noTTL *bool) uint64 {
		t.Helper()
		r, err := BootstrapFrom(dir, src, newState, e.opts(0), func(apply func(*LoggedEntry) error) error {
			for _, le := range log {
				if le.Mark.Index <= from {
					continue
				}
				if le.Mark.Index > upTo {
					break
				}
				if err := apply(le); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if noTTL != nil {
			*noTTL = r.NoTTL()
		}
		_, c, err := r.ChecksumAt()
		if err != nil {
			t.Fatal(err)
		}
		if upTo > 0 && upTo < ^uint64(0) {
			var rev uint64
			for _, le := range log {
				if le.Mark.Index <= upTo {
					rev = le.Mark.Revision
				}
			}
			if got := r.st.Load().rev; got != rev {
				t.Fatalf("replayed to %d: revision %d, want %d", upTo, got, rev)
			}
		}
		return c
	}
	if got, want := sum("/r1", "/ck1", base, mid), sum("/r2", "/ck2", mid, 0); got != want {
		t.Fatalf("checkpoint %d + log to %d: checksum %016x, checkpoint %d: %016x", base, mid, got, mid, want)
	}
	// ... and with the whole log, the live shard's.
	_, live, err := s.ChecksumAt()
	if err != nil {
		t.Fatal(err)
	}
	var noTTL bool
	if got := sumNoTTL("/r3", "/ck2b", mid, ^uint64(0), &noTTL); got != live {
		t.Fatalf("checkpoint %d + the rest of the log: checksum %016x, live %016x", mid, got, live)
	}
	// The replayed log wrote a record with a TTL: the restored shard is not
	// marked as holding none, as the checkpoint was.
	if noTTL {
		t.Fatal("a shard restored with a log that wrote a TTL is marked as holding none")
	}
	if sumNoTTL("/r5", "/ck2d", mid, mid, &noTTL); !noTTL {
		t.Fatal("a shard restored from a checkpoint without TTLs lost its mark")
	}
	// An entry out of order stops the replay.
	if _, err := BootstrapFrom("/r4", "/ck2c", newState, e.opts(0), func(apply func(*LoggedEntry) error) error {
		return apply(log[0])
	}); err == nil {
		t.Fatal("a replay of an entry before the checkpoint's was taken")
	}
	// The failed bootstrap left its directory as a stopped node would: it
	// is refused as unfinished, not opened with the backup's state.
	if r, err := Open("/r4", e.opts(0)); !errors.Is(err, ErrUnfinishedRestore) {
		if err == nil {
			r.Close()
		}
		t.Fatalf("open of an unfinished bootstrap: %v, want ErrUnfinishedRestore", err)
	}
	// The next read after where this one stopped starts there, not at the
	// oldest batch (a backup stream reads every few seconds).
	if err := s.ReadLogAfter(base, func(*LoggedEntry) error { return nil }); err != nil {
		t.Fatal(err)
	}
	last := s.AppliedState().Index
	apply(200, 203) // three batches of one entry (plus empty ones)
	s.logBatchesRead.Store(0)
	var got []uint64
	if err := s.ReadLogAfter(last, func(le *LoggedEntry) error { got = append(got, le.Mark.Index); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := s.AppliedState().Index - last; uint64(len(got)) != want || got[0] != last+1 {
		t.Fatalf("entries after %d: %v, want %d from %d", last, got, want, last+1)
	}
	if n := s.logBatchesRead.Load(); n > 3 {
		t.Fatalf("reading 3 new entries read %d batches: not from where the last read stopped", n)
	}
	// From the bootstrap on, the log is whole; from before it, it is not.
	if err := s.ReadLogAfter(replication.InitialIndex, func(*LoggedEntry) error { return nil }); err != nil {
		t.Fatalf("reading the whole log: %v", err)
	}
	if err := s.ReadLogAfter(1, func(*LoggedEntry) error { return nil }); !errors.Is(err, ErrLogUnavailable) {
		t.Fatalf("reading from before the bootstrap: %v", err)
	}

	// Without a WAL archive, flushed entries are gone.
	e.keepWAL = false
	s2 := e.bootstrap("/s2", userDesc(8, "", ""), 0)
	f2 := newFeeder(s2)
	for i := 0; i < 400; i++ {
		op := putOp(fmt.Sprintf("k%03d", i), string(make([]byte, 1024)), 0, false)
		if _, err := s2.Apply([]replication.Entry{f2.entry(marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{Success: []*shalev1.RequestOp{op}})))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s2.ReadLogAfter(replication.InitialIndex, func(*LoggedEntry) error { return nil }); !errors.Is(err, ErrLogUnavailable) {
		t.Fatalf("reading a log whose WAL files were deleted: %v", err)
	}
}

// TestReadLogAfterBackupCheckpoint: the first incremental backup after a
// full one asks for the entries after the full backup's checkpoint; it
// reads them from the log's end as it was at the checkpoint, not from the
// oldest batch, and gets exactly them.
func TestReadLogAfterBackupCheckpoint(t *testing.T) {
	e := newTestEnv(t, nil)
	e.keepWAL = true
	s := e.bootstrap("/s", userDesc(7, "", ""), 0)
	f := newFeeder(s)
	apply := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ { // one batch per entry
			ops := []*shalev1.RequestOp{putOp(fmt.Sprintf("k%03d", i%40), fmt.Sprintf("v%d", i), 0, false)}
			if _, err := s.Apply([]replication.Entry{f.entry(marshalCmd(t, txnCmd(1, &shalev1.TxnRequest{Success: ops})))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(0, 200)
	ck, _, _, err := s.BackupCheckpoint("/ck")
	if err != nil {
		t.Fatal(err)
	}
	apply(200, 203)
	s.logBatchesRead.Store(0)
	var got []uint64
	if err := s.ReadLogAfter(ck.Index, func(le *LoggedEntry) error { got = append(got, le.Mark.Index); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := s.AppliedState().Index - ck.Index; uint64(len(got)) != want || got[0] != ck.Index+1 {
		t.Fatalf("entries after the checkpoint's %d: %v, want %d from %d", ck.Index, got, want, ck.Index+1)
	}
	if n := s.logBatchesRead.Load(); n > 3 {
		t.Fatalf("reading the 3 entries after a backup checkpoint read %d batches: not from the log's end at the checkpoint", n)
	}
	// From before the checkpoint, the oldest batch is where it starts.
	got = got[:0]
	if err := s.ReadLogAfter(ck.Index-5, func(le *LoggedEntry) error { got = append(got, le.Mark.Index); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 || got[0] != ck.Index-4 {
		t.Fatalf("entries after %d: %v", ck.Index-5, got)
	}
}
