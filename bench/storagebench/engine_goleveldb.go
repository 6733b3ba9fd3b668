package storagebench

import (
	"errors"
	"fmt"
	"time"

	"github.com/syndtr/goleveldb/leveldb"
	"github.com/syndtr/goleveldb/leveldb/filter"
	"github.com/syndtr/goleveldb/leveldb/iterator"
	"github.com/syndtr/goleveldb/leveldb/opt"
	"github.com/syndtr/goleveldb/leveldb/util"
)

type goleveldbEngine struct {
	dir string
	o   *opt.Options
	db  *leveldb.DB
}

var (
	goleveldbNoSync = &opt.WriteOptions{Sync: false}
	goleveldbSync   = &opt.WriteOptions{Sync: true}
)

// goleveldbOptions are the goleveldb options the benchmark uses: 64 MiB
// write buffer and block cache, snappy, a 10 bits/key bloom filter, the rest
// goleveldb's defaults.
func goleveldbOptions(s Settings) *opt.Options {
	return &opt.Options{
		BlockCacheCapacity: int(s.BlockCacheBytes),
		Filter:             filter.NewBloomFilter(s.BloomBitsPerKey),
		Compression:        opt.SnappyCompression,
		WriteBuffer:        int(s.MemTableBytes),
	}
}

func openGoLevelDB(dir string, s Settings) (Engine, error) {
	o := goleveldbOptions(s)
	db, err := leveldb.OpenFile(dir, o)
	if err != nil {
		return nil, err
	}
	return &goleveldbEngine{dir: dir, o: o, db: db}, nil
}

func (e *goleveldbEngine) Set(key, value []byte) error { return e.db.Put(key, value, goleveldbNoSync) }

func (e *goleveldbEngine) NewBatch() Batch { return &goleveldbBatch{db: e.db, b: new(leveldb.Batch)} }

func (e *goleveldbEngine) Get(key []byte) ([]byte, bool, error) {
	v, err := e.db.Get(key, nil)
	if errors.Is(err, leveldb.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// MultiGet is a loop of Gets: the engine has no MultiGet.
func (e *goleveldbEngine) MultiGet(keys [][]byte) (int, int64, error) {
	return getLoop(e, keys)
}

func (e *goleveldbEngine) NewIter() (Iter, error) {
	return goleveldbIter{e.db.NewIterator(nil, nil)}, nil
}

// Flush: goleveldb has no flush call. Reopening the DB replays the journal
// and writes the memtable to a level-0 table, which is what the read
// workloads need: their data in tables, like the other engines'.
func (e *goleveldbEngine) Flush() error {
	if err := e.db.Close(); err != nil {
		return err
	}
	db, err := leveldb.OpenFile(e.dir, e.o)
	if err != nil {
		return err
	}
	e.db = db
	return nil
}

// WaitForCompactions: goleveldb reports no compaction debt, so this is a
// short wait: until level 0 is below its compaction trigger, for at most
// min(timeout, 2s).
func (e *goleveldbEngine) WaitForCompactions(timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(min(timeout, 2*time.Second))
	for {
		var st leveldb.DBStats
		if err := e.db.Stats(&st); err != nil {
			return false, err
		}
		if len(st.LevelTablesCounts) == 0 || st.LevelTablesCounts[0] < opt.DefaultCompactionL0Trigger {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *goleveldbEngine) CompactAll() error { return e.db.CompactRange(util.Range{}) }

func (e *goleveldbEngine) SSTBytes() (int64, error) {
	var st leveldb.DBStats
	if err := e.db.Stats(&st); err != nil {
		return 0, err
	}
	return st.LevelSizes.Sum(), nil
}

// SSTBytesWritten: goleveldb counts its writes per level, but Flush
// reopens the DB, which starts the counts again and writes the replayed
// memtable uncounted, so the total is unknown.
func (e *goleveldbEngine) SSTBytesWritten() (int64, error) { return -1, nil }

func (e *goleveldbEngine) Summary() string {
	var st leveldb.DBStats
	if err := e.db.Stats(&st); err != nil {
		return ""
	}
	return fmt.Sprintf("goleveldb stats: write delays %d (%s), tables per level %v", st.WriteDelayCount, st.WriteDelayDuration.Round(time.Millisecond), st.LevelTablesCounts)
}

func (e *goleveldbEngine) Close() error { return e.db.Close() }

type goleveldbBatch struct {
	db *leveldb.DB
	b  *leveldb.Batch
}

func (b *goleveldbBatch) Set(key, value []byte) error { b.b.Put(key, value); return nil }

func (b *goleveldbBatch) Commit(sync bool) error {
	o := goleveldbNoSync
	if sync {
		o = goleveldbSync
	}
	return b.db.Write(b.b, o)
}

type goleveldbIter struct{ it iterator.Iterator }

func (i goleveldbIter) First() bool            { return i.it.First() }
func (i goleveldbIter) SeekGE(key []byte) bool { return i.it.Seek(key) }
func (i goleveldbIter) Next() bool             { return i.it.Next() }
func (i goleveldbIter) Key() []byte            { return i.it.Key() }
func (i goleveldbIter) Value() []byte          { return i.it.Value() }
func (i goleveldbIter) Close() error {
	err := i.it.Error()
	i.it.Release()
	return err
}
