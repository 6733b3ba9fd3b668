package storage

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/vfs"
)

// arenaPoolCount returns how many spare arenas of size the pool holds.
func arenaPoolCount(s *Shared, size uint32) int {
	s.arenas.mu.Lock()
	defer s.arenas.mu.Unlock()
	return len(s.arenas.free[size])
}

// TestNextArenaPreparedAtHalfFull: once the mutable memtable is half full,
// the arena of the next memtable is allocated in the background and waits
// in the shared pool, and the rotation takes it instead of allocating; a
// memtable written to less than half asks for nothing.
func TestNextArenaPreparedAtHalfFull(t *testing.T) {
	shared := NewShared(nil)
	defer shared.Close()
	opts := apiSmallOptions(vfs.NewMem())
	opts.Shared = shared
	opts.MemTableSize = 1 << 20
	opts.MemTableInitialSize = 1 << 20
	d := apiMustOpen(t, "db", opts)
	defer d.Close()
	size := uint32(1<<20 + skiplistFixedOverhead)

	value := []byte(strings.Repeat("v", 200))
	i := 0
	write := func() {
		t.Helper()
		if err := d.Set(fmt.Appendf(nil, "key%08d", i), value, NoSync); err != nil {
			t.Fatal(err)
		}
		i++
	}
	memBytes := func() (uint64, uint64) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.mem.approxBytes(), d.mem.capacity
	}

	// A quarter full: nothing asked, nothing in the pool.
	for used, c := memBytes(); used < c/4; used, c = memBytes() {
		write()
	}
	time.Sleep(20 * time.Millisecond)
	if n := arenaPoolCount(shared, size); n != 0 {
		t.Fatalf("%d arenas prepared for a memtable a quarter full", n)
	}

	// Past half: the next arena appears in the pool.
	for used, c := memBytes(); used < c/2+c/16; used, c = memBytes() {
		write()
	}
	deadline := time.Now().Add(10 * time.Second)
	for arenaPoolCount(shared, size) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no arena of %d bytes prepared 10s after the memtable passed half full", size)
		}
		time.Sleep(time.Millisecond)
	}

	// The rotation takes it. (An open iterator keeps the first memtable,
	// and so its arena, out of the pool after it is flushed.)
	it, err := d.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	d.mu.Lock()
	first := d.mem
	d.mu.Unlock()
	for {
		d.mu.Lock()
		rotated := d.mem != first
		d.mu.Unlock()
		if rotated {
			break
		}
		write()
	}
	if n := arenaPoolCount(shared, size); n != 0 {
		t.Fatalf("the rotation left the prepared arena in the pool (%d there)", n)
	}
	for k := range i {
		if _, err := d.Get(fmt.Appendf(nil, "key%08d", k)); err != nil {
			t.Fatalf("key%08d: %v", k, err)
		}
	}
}
