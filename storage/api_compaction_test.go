package storage

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/vfs"
)

// apiTTLFilter removes values containing "EXPIRED" (as a TTL filter drops
// values past their deadline) and rewrites values starting with "CHANGE:".
type apiTTLFilter struct {
	mu     sync.Mutex
	levels map[int]int
	calls  int
}

func (*apiTTLFilter) Name() string { return "api-ttl" }

func (f *apiTTLFilter) Filter(level int, key, value []byte) (base.FilterDecision, []byte) {
	f.mu.Lock()
	if f.levels == nil {
		f.levels = map[int]int{}
	}
	f.levels[level]++
	f.calls++
	f.mu.Unlock()
	switch {
	case bytes.Contains(value, []byte("EXPIRED")):
		return FilterRemove, nil
	case bytes.HasPrefix(value, []byte("CHANGE:")):
		return FilterChangeValue, append([]byte("changed:"), value[len("CHANGE:"):]...)
	}
	return FilterKeep, nil
}

// TestAPIMergeAndCompactionFilter: merges are resolved and the filter
// applied through flushes and compactions; values visible to an open
// snapshot are not filtered until it closes.
func TestAPIMergeAndCompactionFilter(t *testing.T) {
	fs := vfs.NewMem()
	filter := &apiTTLFilter{}
	opts := apiSmallOptions(fs)
	opts.CompactionFilter = filter
	d := apiMustOpen(t, "db", opts)
	defer func() { _ = d.Close() }()
	// Only CompactRange compacts, so the filter's effect is deterministic.
	release := apiHoldCompactions(d)

	model := oracle{}
	apply := func(f func(b *Batch)) {
		t.Helper()
		b := NewBatch()
		f(b)
		if err := d.Apply(b, NoSync); err != nil {
			t.Fatal(err)
		}
		model.apply(b)
	}
	// Background volume so that flushes and automatic compactions happen.
	for i := 0; i < 4000; i += 50 {
		apply(func(b *Batch) {
			for j := i; j < i+50; j++ {
				b.Set(fmt.Appendf(nil, "bulk%05d", j), bytes.Repeat([]byte{'b'}, 50))
			}
		})
	}
	apply(func(b *Batch) {
		b.Set([]byte("plain"), []byte("keep"))
		b.Set([]byte("expired"), []byte("EXPIRED-1"))
		b.Set([]byte("old-expired"), []byte("EXPIRED-old"))
		b.Set([]byte("change"), []byte("CHANGE:me"))
		b.Set([]byte("merge-base"), []byte("a"))
		b.Set([]byte("merge-expire"), []byte("a"))
		b.Merge([]byte("merge-only"), []byte("x"))
	})
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	apply(func(b *Batch) {
		b.Set([]byte("old-expired"), []byte("fresh"))      // newer value survives
		b.Set([]byte("new-expired"), []byte("v"))          // becomes expired below
		b.Merge([]byte("merge-base"), []byte("b"))         // a,b
		b.Merge([]byte("merge-expire"), []byte("EXPIRED")) // a,EXPIRED: dropped after merging
		b.Merge([]byte("merge-only"), []byte("y"))         // x,y
	})
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	apply(func(b *Batch) {
		b.Merge([]byte("merge-base"), []byte("c")) // stays in the memtable until CompactRange
		b.Set([]byte("new-expired"), []byte("EXPIRED-2"))
	})

	// Before any compaction reaches these keys, reads see the raw values.
	snap := d.NewSnapshot()
	snapModel := model.clone()
	apiCheckEqual(t, "before compaction", apiDump(t, d, nil), model)
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	// The snapshot still sees everything it saw.
	apiCheckEqual(t, "snapshot after compaction", apiDump(t, d, snap), snapModel)
	if err := snap.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}

	want := model.clone()
	delete(want, "expired")
	delete(want, "new-expired")
	delete(want, "merge-expire")
	want["change"] = "changed:me"
	if want["old-expired"] != "fresh" || want["merge-base"] != "a,b,c" || want["merge-only"] != "x,y" {
		t.Fatalf("model: %q %q %q", want["old-expired"], want["merge-base"], want["merge-only"])
	}
	got := apiDump(t, d, nil)
	apiCheckEqual(t, "after compaction with the filter", got, want)
	filter.mu.Lock()
	levels := fmt.Sprint(filter.levels)
	_, atL0 := filter.levels[0]
	filter.mu.Unlock()
	if atL0 {
		t.Errorf("filter consulted for L0 output (flushes): levels %s", levels)
	}
	if m := d.Metrics(); m.Compactions == 0 {
		t.Fatal("no compactions ran")
	}
	// Survives a reopen.
	release()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = apiMustOpen(t, "db", opts)
	apiCheckEqual(t, "after reopen", apiDump(t, d, nil), want)
}

func apiTotalSize(t testing.TB, d *DB) (total uint64, files int) {
	t.Helper()
	live, _, err := d.LiveFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range live {
		total += f.Size
	}
	return total, len(live)
}

// TestAPIDeleteRangeReclaimsSpace: after a range deletion and a compaction
// the deleted data is gone from the SSTs (but not while a snapshot that can
// see it is open).
// apiFillCompacted writes keys key000000 to key<n-1>, each with the
// returned 100-byte value, and compacts them into sorted files.
func apiFillCompacted(t *testing.T, d *DB, n int) []byte {
	t.Helper()
	val := bytes.Repeat([]byte("x"), 100)
	for i := 0; i < n; i += 100 {
		b := NewBatch()
		for j := i; j < min(n, i+100); j++ {
			b.Set(fmt.Appendf(nil, "key%06d", j), val)
		}
		if err := d.Apply(b, NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	return val
}

func TestAPIDeleteRangeReclaimsSpace(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	opts.Levels[0].Compression = NoCompression
	d := apiMustOpen(t, "db", opts)
	defer d.Close()
	const n = 20000
	val := apiFillCompacted(t, d, n)
	full, fullFiles := apiTotalSize(t, d)

	snap := d.NewSnapshot() // sees the data the range deletion removes
	if err := d.DeleteRange([]byte("key000000"), []byte("key018000"), NoSync); err != nil {
		t.Fatal(err)
	}
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	pinned, _ := apiTotalSize(t, d)
	if pinned < full*9/10 {
		t.Fatalf("with a snapshot open the deleted data was dropped: %d bytes, was %d", pinned, full)
	}
	if v, err := snap.Get([]byte("key000500")); err != nil || !bytes.Equal(v, val) {
		t.Fatalf("snapshot lost deleted data: %q %v", v, err)
	}
	snap.Close()
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	after, afterFiles := apiTotalSize(t, d)
	t.Logf("live SST bytes: %d in %d files before, %d with a snapshot, %d in %d files after", full, fullFiles, pinned, after, afterFiles)
	if after > full/5 {
		t.Fatalf("DeleteRange of 90%% of the keys + compaction left %d of %d bytes", after, full)
	}
	live, _, _ := d.LiveFiles()
	for _, f := range live {
		if string(f.Smallest) < "key018000" {
			t.Errorf("file %s still starts at %q, inside the deleted range", f.Name, f.Smallest)
		}
	}
	got := apiDump(t, d, nil)
	if len(got) != n-18000 {
		t.Fatalf("%d keys left, want %d", len(got), n-18000)
	}
	for k := range got {
		if !strings.HasPrefix(k, "key01") || k < "key018000" {
			t.Fatalf("deleted key %s still readable", k)
		}
	}
}

// TestAPIDeleteFilesInRange: after a DeleteRange, DeleteFilesInRange drops
// the files whose keys all lie in the range, reading and writing no SST;
// files straddling a bound and the range deletion's own file stay, the
// deleted keys stay unreadable and every other key reads back, also after a
// reopen.
func TestAPIDeleteFilesInRange(t *testing.T) {
	fs := vfs.NewMem()
	opts := apiSmallOptions(fs)
	d := apiMustOpen(t, "db", opts)
	const n = 20000
	val := apiFillCompacted(t, d, n)
	full, fullFiles := apiTotalSize(t, d)
	lo, hi := []byte("key005000"), []byte("key015000")
	snap := d.NewSnapshot() // older than the deletion: nothing may go
	del := NewBatch()
	del.DeleteRange(lo, hi)
	if err := d.Apply(del, NoSync); err != nil {
		t.Fatal(err)
	}
	deletedAt := del.SeqNum()
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if files, _, err := d.DeleteFilesInRange(lo, hi, deletedAt); !errors.Is(err, ErrOlderSnapshot) || files != 0 {
		t.Fatalf("with an older snapshot open: %d files, %v; want ErrOlderSnapshot", files, err)
	}
	if v, err := snap.Get([]byte("key010000")); err != nil || !bytes.Equal(v, val) {
		t.Fatalf("the older snapshot lost a deleted key: %q, %v", v, err)
	}
	snap.Close()
	// A write into the range after the deletion (which a shard never makes)
	// stays: files newer than the deletion are kept.
	late := []byte("key010000late")
	if err := d.Set(late, val, NoSync); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	// The flushes above may have started a compaction of their own: hold
	// automatic ones (waiting for any running to finish), so that the count
	// below sees only what DeleteFilesInRange itself did.
	resume := apiHoldCompactions(d)
	before := d.Metrics()
	files, size, err := d.DeleteFilesInRange(lo, hi, deletedAt)
	if err != nil {
		t.Fatal(err)
	}
	m := d.Metrics()
	resume()
	after, afterFiles := apiTotalSize(t, d)
	t.Logf("%d files (%d bytes) dropped: %d bytes in %d files before, %d in %d after", files, size, full, fullFiles, after, afterFiles)
	if files == 0 || size < full/3 || after > full-size+full/10 {
		t.Fatalf("dropped %d files, %d bytes, of %d bytes; %d left", files, size, full, after)
	}
	if m.Compactions != before.Compactions {
		t.Fatalf("DeleteFilesInRange compacted: %d compactions, %d before", m.Compactions, before.Compactions)
	}
	check := func(d *DB) {
		t.Helper()
		got := apiDump(t, d, nil)
		if len(got) != n-10000+1 {
			t.Fatalf("%d keys readable, want %d", len(got), n-10000+1)
		}
		for k := range got {
			if k >= string(lo) && k < string(hi) && k != string(late) {
				t.Fatalf("deleted key %s readable", k)
			}
		}
	}
	check(d)
	apiMustClose(t, d)
	d = apiMustOpen(t, "db", opts)
	defer d.Close()
	check(d)
	// Nothing left to drop; an empty or inverted range drops nothing.
	for _, r := range [][2][]byte{{lo, hi}, {hi, lo}, {lo, lo}} {
		if files, _, err := d.DeleteFilesInRange(r[0], r[1], deletedAt); err != nil || files != 0 {
			t.Fatalf("DeleteFilesInRange(%q, %q) again: %d files, %v", r[0], r[1], files, err)
		}
	}
}
