package storagebench

import (
	"errors"
	"fmt"
	"time"

	"github.com/shale-db/shale/storage"
)

type shaleEngine struct {
	db     *storage.DB
	shared *storage.Shared
}

// shaleOptions are the Shale options the benchmark uses: 64 MiB memtable and
// block cache, snappy and a 10 bits/key bloom filter at every level, the
// rest defaulted by storage.Open.
func shaleOptions(s Settings) *storage.Options {
	o := &storage.Options{
		MemTableSize: uint64(s.MemTableBytes),
		Shared:       storage.NewShared(&storage.SharedOptions{BlockCacheBytes: s.BlockCacheBytes}),
		// The peers delete WAL files once flushed; Shale keeps an archive of
		// them for UpdatesSince by default. Compare like with like.
		WALArchiveMaxBytes:    -1,
		AtRestCompactionDelay: s.ShaleAtRestDelay,
	}
	for i := range o.Levels {
		o.Levels[i].Compression = storage.SnappyCompression
		o.Levels[i].FilterBitsPerKey = s.BloomBitsPerKey
	}
	return o
}

func openShale(dir string, s Settings) (Engine, error) {
	return openShaleWith(dir, shaleOptions(s))
}

// openShaleUniversal is openShale with universal compaction (its defaults).
func openShaleUniversal(dir string, s Settings) (Engine, error) {
	o := shaleOptions(s)
	o.Compaction = storage.UniversalCompaction
	return openShaleWith(dir, o)
}

// openShaleVector is openShale with the vector memtable, for bulk loads:
// unsorted appends, sorted once at flush.
func openShaleVector(dir string, s Settings) (Engine, error) {
	o := shaleOptions(s)
	o.MemTable = storage.VectorMemTable
	return openShaleWith(dir, o)
}

func openShaleWith(dir string, o *storage.Options) (Engine, error) {
	db, err := storage.Open(dir, o)
	if err != nil {
		_ = o.Shared.Close()
		return nil, err
	}
	return &shaleEngine{db: db, shared: o.Shared}, nil
}

func (e *shaleEngine) Set(key, value []byte) error { return e.db.Set(key, value, storage.NoSync) }

func (e *shaleEngine) NewBatch() Batch { return &shaleBatch{db: e.db, b: storage.NewBatch()} }

func (e *shaleEngine) Get(key []byte) ([]byte, bool, error) {
	v, err := e.db.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

func (e *shaleEngine) MultiGet(keys [][]byte) (int, int64, error) {
	vals, errs := e.db.MultiGet(keys)
	found, n := 0, int64(0)
	for i, err := range errs {
		switch {
		case err == nil:
			found++
			n += int64(len(keys[i]) + len(vals[i]))
		case !errors.Is(err, storage.ErrNotFound):
			return 0, 0, err
		}
	}
	return found, n, nil
}

func (e *shaleEngine) NewIter() (Iter, error) {
	it, err := e.db.NewIter(nil)
	if err != nil {
		return nil, err
	}
	return shaleIter{it}, nil
}

func (e *shaleEngine) Flush() error { return e.db.Flush() }

func (e *shaleEngine) WaitForCompactions(timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		m := e.db.Metrics()
		if m.BackgroundError != nil {
			return false, fmt.Errorf("background error: %w", m.BackgroundError)
		}
		// AtRestCompactionBytes: L0 past its at-rest bound is merged down
		// once the DB has had no write for AtRestCompactionDelay; that is
		// background work like any other compaction.
		if m.CompactionsRunning == 0 && m.PendingCompactionBytes == 0 && m.AtRestCompactionBytes == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *shaleEngine) CompactAll() error { return e.db.CompactRange(nil, nil) }

func (e *shaleEngine) SSTBytes() (int64, error) {
	var n uint64
	for _, l := range e.db.Metrics().Levels {
		n += l.Bytes
	}
	return int64(n), nil
}

func (e *shaleEngine) SSTBytesWritten() (int64, error) {
	m := e.db.Metrics()
	return int64(m.FlushBytesOut + m.CompactionBytesOut), nil
}

func (e *shaleEngine) Summary() string {
	m := e.db.Metrics()
	var files []string
	for i, l := range m.Levels {
		if l.Files > 0 {
			files = append(files, fmt.Sprintf("L%d:%d", i, l.Files))
		}
	}
	return fmt.Sprintf("shale metrics: stall %s (%d stalls), pacing delay %s, w-amp %.2f, flushes %d, compactions %d (+%d moves), pending %d B, files %v",
		m.StallTime.Round(time.Millisecond), m.Stalls, m.PacingDelay.Round(time.Millisecond), m.WriteAmp,
		m.Flushes, m.Compactions, m.CompactionMoves, m.PendingCompactionBytes, files)
}

func (e *shaleEngine) Close() error {
	err := e.db.Close()
	return errors.Join(err, e.shared.Close())
}

type shaleBatch struct {
	db *storage.DB
	b  *storage.Batch
}

func (b *shaleBatch) Set(key, value []byte) error { b.b.Set(key, value); return nil }

func (b *shaleBatch) Commit(sync bool) error {
	o := storage.NoSync
	if sync {
		o = storage.Sync
	}
	return b.db.Apply(b.b, o)
}

type shaleIter struct{ it *storage.Iterator }

func (i shaleIter) First() bool            { return i.it.First() }
func (i shaleIter) SeekGE(key []byte) bool { return i.it.SeekGE(key) }
func (i shaleIter) Next() bool             { return i.it.Next() }
func (i shaleIter) Key() []byte            { return i.it.Key() }
func (i shaleIter) Value() []byte          { return i.it.Value() }
func (i shaleIter) Close() error {
	err := i.it.Error()
	return errors.Join(err, i.it.Close())
}
