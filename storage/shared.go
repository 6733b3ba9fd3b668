package storage

import (
	"container/list"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/shale-db/shale/storage/cache"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/memtable"
	"github.com/shale-db/shale/storage/sstable"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// SharedOptions size the resources many DBs in one process share.
type SharedOptions struct {
	// BlockCacheBytes is the capacity of the block cache. Default 64 MiB.
	BlockCacheBytes int64
	// TableCacheFiles is how many SST files are kept open. Default 1000.
	TableCacheFiles int
	// CompactionWorkers is the number of background workers running
	// compactions (flushes may use them too). Default max(1, NumCPU-1).
	CompactionWorkers int
	// FlushWorkers is the number of workers reserved for flushes, so a
	// flush never queues behind long compactions. Default 1.
	FlushWorkers int
	// MemTableBudget bounds the memory of all memtables of all DBs sharing
	// these resources; past it, the writing DB flushes its memtable early,
	// and a DB with a flush pending waits for it rather than take more.
	// The memtables stay within the budget plus one memtable per DB.
	// Default 0: unbounded (each DB is bounded by its own options).
	MemTableBudget int64
	// SpareArenaBytes bounds the memory of flushed memtables kept for reuse
	// by new memtables of the same size (of any DB sharing these
	// resources): reusing one costs neither an allocation nor the page
	// faults of touching fresh memory. Default 128 MiB; negative keeps none.
	SpareArenaBytes int64
}

// Shared is the set of resources that DBs opened with the same Options.Shared
// share: a block cache, a table cache of open SST readers, a prioritised
// pool of flush and compaction workers, and a memtable memory budget. It is
// safe for concurrent use. Close it after every DB using it is closed.
type Shared struct {
	opts       SharedOptions
	BlockCache *cache.Cache
	tables     *tableCache
	pool       *workerPool
	memUsed    atomic.Int64
	arenas     arenaPool

	dirsMu sync.Mutex
	dirs   map[string]bool // directories open for writing with SkipLockFile

	// walBlocks and walBufs lend the WALs their framing block and pending
	// buffer while they have bytes in flight (see walBuffer).
	walBlocks wal.BlockPool
	walBufs   sync.Pool
}

// NewShared creates shared resources; nil options take the defaults.
func NewShared(o *SharedOptions) *Shared {
	var opts SharedOptions
	if o != nil {
		opts = *o
	}
	if opts.BlockCacheBytes == 0 {
		opts.BlockCacheBytes = 64 << 20
	}
	if opts.TableCacheFiles == 0 {
		opts.TableCacheFiles = 1000
	}
	if opts.CompactionWorkers == 0 {
		opts.CompactionWorkers = max(1, runtime.NumCPU()-1)
	}
	if opts.FlushWorkers == 0 {
		opts.FlushWorkers = 1
	}
	if opts.SpareArenaBytes == 0 {
		opts.SpareArenaBytes = 128 << 20
	}
	s := &Shared{opts: opts, BlockCache: cache.New(opts.BlockCacheBytes)}
	s.arenas.max = max(opts.SpareArenaBytes, 0)
	s.tables = newTableCache(opts.TableCacheFiles)
	s.pool = newWorkerPool(opts.FlushWorkers, opts.CompactionWorkers)
	return s
}

// Close stops the background workers once their queued jobs finish.
func (s *Shared) Close() error {
	s.pool.close()
	return nil
}

// lockDir claims dir for a DB opened with SkipLockFile, failing with an
// error matching vfs.ErrLocked while another such DB has it. Closing the
// returned closer releases the claim.
func (s *Shared) lockDir(dir string) (io.Closer, error) {
	s.dirsMu.Lock()
	defer s.dirsMu.Unlock()
	if s.dirs[dir] {
		return nil, fmt.Errorf("lock %s: %w", dir, vfs.ErrLocked)
	}
	if s.dirs == nil {
		s.dirs = make(map[string]bool)
	}
	s.dirs[dir] = true
	return dirClaim{s: s, dir: dir}, nil
}

// dirClaim releases a lockDir claim.
type dirClaim struct {
	s   *Shared
	dir string
}

func (c dirClaim) Close() error {
	c.s.dirsMu.Lock()
	delete(c.s.dirs, c.dir)
	c.s.dirsMu.Unlock()
	return nil
}

// MemTableBytes returns the memory currently held by the memtables of all
// DBs sharing s.
func (s *Shared) MemTableBytes() int64 { return s.memUsed.Load() }

// reserveWithinBudget counts n more memtable bytes if the total stays
// within the budget, and reports whether it did.
func (s *Shared) reserveWithinBudget(n int64) bool {
	for {
		used := s.memUsed.Load()
		if used+n > s.opts.MemTableBudget {
			return false
		}
		if s.memUsed.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// overBudget reports whether memtables exceed the shared budget.
func (s *Shared) overBudget() bool {
	return s.opts.MemTableBudget > 0 && s.memUsed.Load() > s.opts.MemTableBudget
}

// jobPriority orders background work: flushes first, then L0 compactions
// (which unblock flushes), then the rest.
type jobPriority int

const (
	priorityFlush jobPriority = iota
	priorityL0Compaction
	priorityCompaction
	numPriorities
)

// workerPool runs background jobs by priority. Flush workers take only
// flushes; compaction workers take any job, highest priority first.
type workerPool struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queues [numPriorities]list.List
	closed bool
	wg     sync.WaitGroup
}

func newWorkerPool(flushWorkers, compactionWorkers int) *workerPool {
	p := &workerPool{}
	p.cond = sync.NewCond(&p.mu)
	for i := 0; i < flushWorkers; i++ {
		p.wg.Add(1)
		go p.work(priorityFlush)
	}
	for i := 0; i < compactionWorkers; i++ {
		p.wg.Add(1)
		go p.work(priorityCompaction)
	}
	return p
}

// submit queues fn at priority. It reports false when the pool is closed.
func (p *workerPool) submit(prio jobPriority, fn func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.queues[prio].PushBack(fn)
	p.cond.Broadcast()
	return true
}

// work runs jobs whose priority is at most maxPrio.
func (p *workerPool) work(maxPrio jobPriority) {
	defer p.wg.Done()
	p.mu.Lock()
	for {
		var fn func()
		for prio := jobPriority(0); prio <= maxPrio && prio < numPriorities; prio++ {
			if e := p.queues[prio].Front(); e != nil {
				fn = p.queues[prio].Remove(e).(func())
				break
			}
		}
		if fn == nil {
			if p.closed {
				p.mu.Unlock()
				return
			}
			p.cond.Wait()
			continue
		}
		p.mu.Unlock()
		fn()
		p.mu.Lock()
	}
}

func (p *workerPool) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// tableKey names an SST of one DB in the table cache.
type tableKey struct {
	dbID    uint64
	fileNum manifest.FileNum
}

// tableEntry is an open SST reader shared by all users of the file.
type tableEntry struct {
	key    tableKey
	reader *sstable.Reader
	file   vfs.File
	refs   int // users plus one for membership in the cache
	elem   *list.Element
	ready  chan struct{}
	err    error
	inLRU  bool
}

// tableCache keeps up to capacity SST files open, evicting the least
// recently used ones that nobody is reading.
type tableCache struct {
	mu       sync.Mutex
	capacity int
	entries  map[tableKey]*tableEntry
	lru      list.List // of *tableEntry, most recent at front
	hits     atomic.Int64
	misses   atomic.Int64
}

func newTableCache(capacity int) *tableCache {
	return &tableCache{capacity: capacity, entries: make(map[tableKey]*tableEntry)}
}

// tableHandle is a reference to an open SST; Release it when done. It is
// a value (taking one allocates nothing): Release one copy of it only.
type tableHandle struct {
	tc *tableCache
	e  *tableEntry
}

// Reader returns the open reader.
func (h *tableHandle) Reader() *sstable.Reader { return h.e.reader }

// Release drops the reference.
func (h *tableHandle) Release() {
	if h.e == nil {
		return
	}
	h.tc.unref(h.e)
	h.e = nil
}

// peek returns a reference to key's reader when it is open, without opening
// it or waiting for an open under way (ok false then).
func (tc *tableCache) peek(key tableKey) (h tableHandle, ok bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	e, ok := tc.entries[key]
	if !ok {
		return tableHandle{}, false
	}
	select {
	case <-e.ready:
	default:
		return tableHandle{}, false
	}
	if e.err != nil {
		return tableHandle{}, false
	}
	e.refs++
	if e.inLRU {
		tc.lru.MoveToFront(e.elem)
	}
	tc.hits.Add(1)
	return tableHandle{tc: tc, e: e}, true
}

// get returns the reader of key, opening it with open on a miss. Concurrent
// misses on one file open it once.
func (tc *tableCache) get(key tableKey, open func() (*sstable.Reader, vfs.File, error)) (tableHandle, error) {
	tc.mu.Lock()
	e, ok := tc.entries[key]
	if ok {
		e.refs++
		if e.inLRU {
			tc.lru.MoveToFront(e.elem)
		}
		tc.mu.Unlock()
		<-e.ready
		if e.err != nil {
			tc.unref(e)
			return tableHandle{}, e.err
		}
		tc.hits.Add(1)
		return tableHandle{tc: tc, e: e}, nil
	}
	tc.misses.Add(1)
	e = &tableEntry{key: key, refs: 2, ready: make(chan struct{})}
	tc.entries[key] = e
	tc.mu.Unlock()

	e.reader, e.file, e.err = open()
	close(e.ready)

	tc.mu.Lock()
	if e.err != nil {
		// Failed opens are not cached: drop the entry so a later call retries.
		if tc.entries[key] == e {
			delete(tc.entries, key)
		}
		e.refs-- // the cache's reference
		tc.mu.Unlock()
		tc.unref(e)
		return tableHandle{}, e.err
	}
	if tc.entries[key] == e {
		e.elem = tc.lru.PushFront(e)
		e.inLRU = true
	} else {
		e.refs-- // evicted while opening
	}
	victims := tc.evictLocked()
	tc.mu.Unlock()
	for _, v := range victims {
		tc.unref(v)
	}
	return tableHandle{tc: tc, e: e}, nil
}

// evictLocked removes entries beyond capacity from the cache (dropping the
// cache's reference) and returns them for unref outside the lock.
func (tc *tableCache) evictLocked() []*tableEntry {
	var victims []*tableEntry
	for tc.lru.Len() > tc.capacity {
		back := tc.lru.Back()
		v := back.Value.(*tableEntry)
		tc.removeLocked(v)
		victims = append(victims, v)
	}
	return victims
}

func (tc *tableCache) removeLocked(e *tableEntry) {
	if e.inLRU {
		tc.lru.Remove(e.elem)
		e.inLRU = false
	}
	if tc.entries[e.key] == e {
		delete(tc.entries, e.key)
	}
}

func (tc *tableCache) unref(e *tableEntry) {
	tc.mu.Lock()
	e.refs--
	last := e.refs == 0
	tc.mu.Unlock()
	if last && e.err == nil && e.reader != nil {
		_ = e.reader.Close()
		if e.file != nil {
			_ = e.file.Close()
		}
	}
}

// evict drops key from the cache; the file closes once its last reader is
// released.
func (tc *tableCache) evict(key tableKey) {
	tc.mu.Lock()
	e, ok := tc.entries[key]
	if !ok {
		tc.mu.Unlock()
		return
	}
	wasCached := e.inLRU
	tc.removeLocked(e)
	tc.mu.Unlock()
	if wasCached {
		tc.unref(e)
	}
}

// evictDB drops every file of dbID.
func (tc *tableCache) evictDB(dbID uint64) {
	tc.mu.Lock()
	var keys []tableKey
	for k := range tc.entries {
		if k.dbID == dbID {
			keys = append(keys, k)
		}
	}
	tc.mu.Unlock()
	for _, k := range keys {
		tc.evict(k)
	}
}

func (tc *tableCache) String() string {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return fmt.Sprintf("tableCache{open=%d cap=%d}", tc.lru.Len(), tc.capacity)
}

// arenaPool keeps the skiplists of flushed memtables that no reader uses any
// more, by arena size, up to max bytes, for new memtables to reuse.
type arenaPool struct {
	mu    sync.Mutex
	max   int64
	bytes int64
	free  map[uint32][]*memtable.Skiplist
	// preparing counts the arenas of each size being allocated by prepare.
	preparing map[uint32]int
	// scribble (tests) overwrites every arena put in the pool, so a reader
	// still using it sees garbage.
	scribble bool
}

// get returns an empty skiplist with an arena of exactly size bytes from the
// pool, or nil.
func (p *arenaPool) get(size uint32) *memtable.Skiplist {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.free[size]
	if len(l) == 0 {
		return nil
	}
	s := l[len(l)-1]
	p.free[size] = l[:len(l)-1]
	p.bytes -= int64(size)
	return s.Recycle()
}

// prepare allocates an empty skiplist with an arena of size bytes in the
// background and adds it to the pool, unless the pool already holds or is
// preparing one of that size, or has no room for it. A memtable rotation
// then takes an arena that is already there instead of allocating (and
// zeroing, and paying the garbage collector's assist for) up to 64 MiB in
// the commit path.
func (p *arenaPool) prepare(size uint32) {
	p.mu.Lock()
	if len(p.free[size]) > 0 || p.preparing[size] > 0 || p.bytes+int64(size) > p.max {
		p.mu.Unlock()
		return
	}
	if p.preparing == nil {
		p.preparing = make(map[uint32]int)
	}
	p.preparing[size]++
	p.mu.Unlock()
	go func() {
		s := memtable.NewSkiplist(size)
		p.mu.Lock()
		p.preparing[size]--
		p.mu.Unlock()
		p.put(s)
	}()
}

// put offers s, which nothing uses any more, for reuse; it is dropped (left
// to the garbage collector) when the pool is full.
func (p *arenaPool) put(s *memtable.Skiplist) {
	size := s.ArenaSize()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.scribble {
		s.Scribble(0xa5)
	}
	if p.bytes+int64(size) > p.max {
		return
	}
	if p.free == nil {
		p.free = make(map[uint32][]*memtable.Skiplist)
	}
	p.free[size] = append(p.free[size], s)
	p.bytes += int64(size)
}
