package storagebench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
)

type pebbleEngine struct {
	db *pebble.DB
}

// pebbleOptions are the Pebble options the benchmark uses: 64 MiB memtable,
// a cache leaving about 64 MiB for blocks (see Settings.PebbleCacheBytes),
// snappy and a 10 bits/key bloom filter at every level, the rest Pebble's
// defaults. The cache is referenced by the DB once opened; the
// caller drops its own reference after Open.
func pebbleOptions(s Settings) *pebble.Options {
	o := &pebble.Options{
		Cache:        pebble.NewCache(s.pebbleCacheBytes()),
		MemTableSize: uint64(s.MemTableBytes),
		Logger:       quietPebbleLogger{},
	}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(s.BloomBitsPerKey)
		o.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.SnappyCompression }
	}
	return o
}

func openPebble(dir string, s Settings) (Engine, error) {
	o := pebbleOptions(s)
	db, err := pebble.Open(dir, o)
	o.Cache.Unref()
	if err != nil {
		return nil, err
	}
	return &pebbleEngine{db: db}, nil
}

func (e *pebbleEngine) Set(key, value []byte) error { return e.db.Set(key, value, pebble.NoSync) }

func (e *pebbleEngine) NewBatch() Batch { return &pebbleBatch{b: e.db.NewBatch()} }

func (e *pebbleEngine) Get(key []byte) ([]byte, bool, error) {
	v, closer, err := e.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	// The value is only valid until closer.Close; callers look at it only
	// for its length.
	err = closer.Close()
	return v, true, err
}

// MultiGet is a loop of Gets: the engine has no MultiGet.
func (e *pebbleEngine) MultiGet(keys [][]byte) (int, int64, error) {
	return getLoop(e, keys)
}

func (e *pebbleEngine) NewIter() (Iter, error) {
	it, err := e.db.NewIter(nil)
	if err != nil {
		return nil, err
	}
	return pebbleIter{it}, nil
}

func (e *pebbleEngine) Flush() error { return e.db.Flush() }

func (e *pebbleEngine) WaitForCompactions(timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		m := e.db.Metrics()
		// EstimatedDebt counts an L0 below its compaction threshold too, so
		// it need not reach 0 at rest; a level scoring >= 1 is one Pebble
		// still means to compact.
		needs := false
		for _, l := range m.Levels {
			needs = needs || l.Score >= 1
		}
		if m.Compact.NumInProgress == 0 && (m.Compact.EstimatedDebt == 0 || !needs) {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *pebbleEngine) CompactAll() error {
	// Benchmark keys never start with 0xff (see KeyGen), so [nil, 0xff...)
	// covers them all.
	return e.db.Compact(context.Background(), nil, bytes.Repeat([]byte{0xff}, 64), true)
}

func (e *pebbleEngine) SSTBytes() (int64, error) {
	m := e.db.Metrics()
	var n int64
	for _, l := range m.Levels {
		n += l.TablesSize
	}
	return n, nil
}

func (e *pebbleEngine) SSTBytesWritten() (int64, error) {
	t := e.db.Metrics().Total()
	return int64(t.TableBytesFlushed + t.TableBytesCompacted + t.BlobBytesFlushed + t.BlobBytesCompacted), nil
}

func (e *pebbleEngine) Summary() string {
	m := e.db.Metrics()
	t := m.Total()
	var files []string
	for i, l := range m.Levels {
		if l.TablesCount > 0 {
			files = append(files, fmt.Sprintf("L%d:%d", i, l.TablesCount))
		}
	}
	return fmt.Sprintf("pebble metrics: w-amp %.2f, flushes %d, compactions %d, debt %d B, L0 sublevels %d, files %v",
		t.WriteAmp(), m.Flush.Count, m.Compact.Count, m.Compact.EstimatedDebt, m.Levels[0].Sublevels, files)
}

func (e *pebbleEngine) Close() error { return e.db.Close() }

type pebbleBatch struct{ b *pebble.Batch }

func (b *pebbleBatch) Set(key, value []byte) error { return b.b.Set(key, value, nil) }

func (b *pebbleBatch) Commit(sync bool) error {
	o := pebble.NoSync
	if sync {
		o = pebble.Sync
	}
	err := b.b.Commit(o)
	return errors.Join(err, b.b.Close())
}

type pebbleIter struct{ it *pebble.Iterator }

func (i pebbleIter) First() bool            { return i.it.First() }
func (i pebbleIter) SeekGE(key []byte) bool { return i.it.SeekGE(key) }
func (i pebbleIter) Next() bool             { return i.it.Next() }
func (i pebbleIter) Key() []byte            { return i.it.Key() }
func (i pebbleIter) Value() []byte          { return i.it.Value() }
func (i pebbleIter) Close() error           { return i.it.Close() }

// quietPebbleLogger drops Pebble's informational messages ("Found 0 WALs")
// so they do not interleave with the benchmark's output; errors still go to
// Pebble's default logger.
type quietPebbleLogger struct{}

func (quietPebbleLogger) Infof(string, ...any) {}
func (quietPebbleLogger) Errorf(format string, args ...any) {
	pebble.DefaultLogger.Errorf(format, args...)
}
func (quietPebbleLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}
