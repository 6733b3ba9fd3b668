// Package storagebench is a db_bench-style benchmark of key-value storage
// engines: Shale's own engine (github.com/shale-db/shale/storage) and the
// peers it is compared with, Pebble and goleveldb. Every engine is driven
// through the same small Engine interface with the same settings, and every
// workload runs against every engine in the same process, engines
// interleaved per workload.
package storagebench

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Settings are the knobs every engine is opened with. They are the same for
// all engines; what is not listed here is left at each engine's default.
type Settings struct {
	// MemTableBytes is the size of one memtable (write buffer).
	MemTableBytes int64
	// BlockCacheBytes is the capacity of the block cache.
	BlockCacheBytes int64
	// BloomBitsPerKey sizes the bloom filters of every level.
	BloomBitsPerKey int
	// PebbleCacheBytes is the size of Pebble's cache. Pebble charges its
	// memtables to its block cache (each memtable arena, plus one recycled
	// arena, is reserved in the cache), so a Pebble cache of BlockCacheBytes
	// with 64 MiB memtables leaves no room for blocks at all. 0 means
	// BlockCacheBytes + 2*MemTableBytes, which leaves Pebble about
	// BlockCacheBytes for blocks, like the other engines.
	PebbleCacheBytes int64
	// ShaleAtRestDelay is Shale's Options.AtRestCompactionDelay (0: its
	// default); the unit tests shorten it so that waiting for compactions
	// to settle does not wait seconds per run.
	ShaleAtRestDelay time.Duration
}

// pebbleCacheBytes resolves PebbleCacheBytes.
func (s Settings) pebbleCacheBytes() int64 {
	if s.PebbleCacheBytes > 0 {
		return s.PebbleCacheBytes
	}
	return s.BlockCacheBytes + 2*s.MemTableBytes
}

// DefaultSettings are the settings the benchmark uses: 64 MiB memtable,
// 64 MiB block cache (for Pebble: 64 MiB plus its memtable reservation, see
// PebbleCacheBytes), 10 bits/key bloom filters. Compression is snappy and
// the WAL is on for every engine (not configurable).
func DefaultSettings() Settings {
	return Settings{MemTableBytes: 64 << 20, BlockCacheBytes: 64 << 20, BloomBitsPerKey: 10}
}

// Engine is one open database of the engine under test. Methods are called
// from one goroutine at a time.
type Engine interface {
	// Set writes one key without syncing the WAL.
	Set(key, value []byte) error
	// NewBatch returns an empty write batch.
	NewBatch() Batch
	// Get looks a key up. The value is not retained by the caller.
	Get(key []byte) (value []byte, found bool, err error)
	// MultiGet looks keys up together: with the engine's MultiGet where it
	// has one, a loop of Gets otherwise (what its users would write). It
	// returns how many keys were found and their keys' and values' bytes.
	MultiGet(keys [][]byte) (found int, bytes int64, err error)
	// NewIter returns an iterator over the whole key space.
	NewIter() (Iter, error)
	// Flush makes the memtable contents durable in SST files, as far as
	// the engine supports it.
	Flush() error
	// WaitForCompactions waits until background compactions have settled
	// or the timeout expires; it returns false on timeout.
	WaitForCompactions(timeout time.Duration) (settled bool, err error)
	// CompactAll compacts the whole key space (a full manual compaction).
	CompactAll() error
	// SSTBytes is the total size of the live SST files.
	SSTBytes() (int64, error)
	// SSTBytesWritten is the SST bytes flushes and compactions wrote
	// since the engine was opened, by the engine's own count, or -1 when
	// the engine cannot tell.
	SSTBytesWritten() (int64, error)
	// Summary is a short engine-specific metrics report printed in table
	// mode after fill workloads ("" when there is none).
	Summary() string
	// Close closes the database and releases its resources.
	Close() error
}

// Batch is a write batch of one engine.
type Batch interface {
	Set(key, value []byte) error
	// Commit applies the batch, syncing the WAL when sync is set. The batch
	// is not used after Commit.
	Commit(sync bool) error
}

// Iter is an iterator of one engine, positioned by First or SeekGE.
type Iter interface {
	First() bool
	SeekGE(key []byte) bool
	Next() bool
	Key() []byte
	Value() []byte
	Close() error
}

// Opener opens (creating) an engine's database in dir.
type Opener func(dir string, s Settings) (Engine, error)

var engines = map[string]Opener{
	"shale":           openShale,
	"shale-universal": openShaleUniversal,
	"shale-vector":    openShaleVector,
	"pebble":          openPebble,
	"goleveldb":       openGoLevelDB,
}

// EngineNames lists the engines a run compares by default, Shale first.
// "shale-universal" (Shale with storage.UniversalCompaction) and
// "shale-vector" (Shale with storage.VectorMemTable, for bulk loads) are
// known too, and run when named.
func EngineNames() []string { return []string{"shale", "pebble", "goleveldb"} }

// OpenEngine opens the named engine in dir.
func OpenEngine(name, dir string, s Settings) (Engine, error) {
	open, ok := engines[name]
	if !ok {
		return nil, fmt.Errorf("unknown engine %q (known: %s)", name, strings.Join(EngineNames(), ", "))
	}
	return open(dir, s)
}

// ParseEngines splits and checks a comma-separated engine list.
func ParseEngines(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, ok := engines[n]; !ok {
			known := make([]string, 0, len(engines))
			for k := range engines {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("unknown engine %q (known: %s)", n, strings.Join(known, ", "))
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no engines given")
	}
	return out, nil
}

// getLoop is MultiGet as a loop of e's Gets.
func getLoop(e Engine, keys [][]byte) (found int, bytes int64, err error) {
	for _, k := range keys {
		v, ok, err := e.Get(k)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			found++
			bytes += int64(len(k) + len(v))
		}
	}
	return found, bytes, nil
}
