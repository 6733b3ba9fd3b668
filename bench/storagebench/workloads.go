package storagebench

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// Workload names, as in db_bench where db_bench has them.
const (
	FillSeq       = "fillseq"
	FillRandom    = "fillrandom"
	Overwrite     = "overwrite"
	ReadRandom    = "readrandom"
	ReadRandom50  = "readrandom-50pct-miss"
	MultiGet      = "multiget"
	ReadSeq       = "readseq"
	SeekRandom    = "seekrandom"
	FillBatchSync = "fillbatch-sync"
)

// WorkloadNames lists every workload in the default order.
func WorkloadNames() []string {
	return []string{FillSeq, FillRandom, Overwrite, ReadRandom, ReadRandom50, MultiGet, ReadSeq, SeekRandom, FillBatchSync}
}

// ParseWorkloads splits and checks a comma-separated workload list.
func ParseWorkloads(list string) ([]string, error) {
	var out []string
	for _, w := range strings.Split(list, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		if _, ok := workloads[w]; !ok {
			return nil, fmt.Errorf("unknown workload %q (known: %s)", w, strings.Join(WorkloadNames(), ", "))
		}
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no workloads given")
	}
	return out, nil
}

// IsFill reports whether the workload writes (its table shows the engines'
// write metrics).
func IsFill(w string) bool {
	return w == FillSeq || w == FillRandom || w == Overwrite || w == FillBatchSync
}

// runCtx is what one (engine, workload) run works with.
type runCtx struct {
	cfg  *Config
	dir  string
	e    Engine
	keys *KeyGen
	vals *ValueGen
	// phase and progress feed the hang watchdog.
	setPhase func(string)
	tick     func()
	notes    []string
}

// workload is one benchmark: an untimed setup, the timed run, and untimed
// measurements after it.
type workload struct {
	setup func(c *runCtx) error
	run   func(c *runCtx, r *recorder) error
	after func(c *runCtx, res *Result) error
}

var workloads = map[string]workload{
	FillSeq:       {run: runFillSeq},
	FillRandom:    {run: runFillRandom},
	Overwrite:     {setup: setupSeqFill, run: runOverwrite, after: afterOverwrite},
	ReadRandom:    {setup: setupReadable, run: func(c *runCtx, r *recorder) error { return runReadRandom(c, r, 0) }},
	ReadRandom50:  {setup: setupReadable, run: func(c *runCtx, r *recorder) error { return runReadRandom(c, r, 50) }},
	MultiGet:      {setup: setupReadable, run: runMultiGet},
	ReadSeq:       {setup: setupReadable, run: runReadSeq},
	SeekRandom:    {setup: setupReadable, run: runSeekRandom},
	FillBatchSync: {run: runFillBatchSync},
}

func (c *runCtx) num() uint64 { return uint64(c.cfg.Num) }

func (c *runCtx) reads() int {
	if c.cfg.Reads > 0 {
		return c.cfg.Reads
	}
	return c.cfg.Num
}

func (c *runCtx) kvBytes() int64 { return int64(c.keys.Size() + c.vals.Size()) }

// loadBatchKeys is the batch size of untimed loads.
const loadBatchKeys = 256

// load writes the keys Present(order(j)) for j in [0, num) in unsynced
// batches, untimed.
func (c *runCtx) load(order func(j uint64) uint64) error {
	var b Batch
	for j := range c.num() {
		if b == nil {
			b = c.e.NewBatch()
		}
		if err := b.Set(c.keys.Present(order(j)), c.vals.Next()); err != nil {
			return err
		}
		if (j+1)%loadBatchKeys == 0 || j+1 == c.num() {
			if err := b.Commit(false); err != nil {
				return fmt.Errorf("load: %w", err)
			}
			b = nil
			c.tick()
		}
	}
	return nil
}

// setupSeqFill loads num keys in order (db_bench: fillseq before overwrite).
func setupSeqFill(c *runCtx) error {
	c.setPhase("load (sequential)")
	return c.load(func(j uint64) uint64 { return j })
}

// setupReadable loads every key once in random order, flushes the
// memtable, and waits for compactions to settle, so reads run against an
// LSM tree in its resting shape.
func setupReadable(c *runCtx) error {
	c.setPhase("load (random order)")
	perm := newRand(c.cfg.Seed, 1).Perm(c.cfg.Num)
	if err := c.load(func(j uint64) uint64 { return uint64(perm[j]) }); err != nil {
		return err
	}
	return c.flushAndSettle()
}

func (c *runCtx) flushAndSettle() error {
	c.setPhase("flush")
	if err := c.e.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	c.setPhase("wait for compactions")
	settled, err := c.e.WaitForCompactions(c.cfg.SettleTimeout)
	if err != nil {
		return fmt.Errorf("wait for compactions: %w", err)
	}
	if !settled {
		c.note(fmt.Sprintf("compactions not settled after %s", c.cfg.SettleTimeout))
	}
	return nil
}

func (c *runCtx) note(s string) {
	c.cfg.logf("  note: %s", s)
	c.notes = append(c.notes, s)
}

func runFillSeq(c *runCtx, r *recorder) error {
	r.begin()
	for i := range c.num() {
		if err := c.e.Set(c.keys.Present(i), c.vals.Next()); err != nil {
			return err
		}
		r.done(1, c.kvBytes())
	}
	return nil
}

func runFillRandom(c *runCtx, r *recorder) error {
	rng := newRand(c.cfg.Seed, 2)
	r.begin()
	for range c.num() {
		if err := c.e.Set(c.keys.Present(rng.Uint64N(c.num())), c.vals.Next()); err != nil {
			return err
		}
		r.done(1, c.kvBytes())
	}
	return nil
}

func runOverwrite(c *runCtx, r *recorder) error {
	rng := newRand(c.cfg.Seed, 3)
	r.begin()
	for range c.num() {
		if err := c.e.Set(c.keys.Present(rng.Uint64N(c.num())), c.vals.Next()); err != nil {
			return err
		}
		r.done(1, c.kvBytes())
	}
	return nil
}

// afterOverwrite flushes, waits for compactions to settle, and measures
// the space amplification (SST bytes now over SST bytes after a full
// compaction) and the whole directory over the logical size of the live
// data (every one of the num keys is live after the sequential load).
func afterOverwrite(c *runCtx, res *Result) error {
	if err := c.flushAndSettle(); err != nil {
		return err
	}
	dirBytes, err := dirSize(c.dir)
	if err != nil {
		return err
	}
	logical := int64(c.cfg.Num) * c.kvBytes()
	res.DiskOverLogical = float64(dirBytes) / float64(logical)
	before, err := c.e.SSTBytes()
	if err != nil {
		return err
	}
	c.setPhase("full compaction")
	if err := c.e.CompactAll(); err != nil {
		return fmt.Errorf("full compaction: %w", err)
	}
	after, err := c.e.SSTBytes()
	if err != nil {
		return err
	}
	if after > 0 {
		res.SpaceAmp = float64(before) / float64(after)
	}
	res.SSTBytesBefore, res.SSTBytesAfter, res.DirBytes = before, after, dirBytes
	return nil
}

// runReadRandom looks up reads random keys; missPct percent of them are
// absent keys (between present ones). Every present key must be found and
// every absent key must not be.
func runReadRandom(c *runCtx, r *recorder, missPct int) error {
	rng := newRand(c.cfg.Seed, 4)
	n := c.reads()
	var wrong int
	r.begin()
	for range n {
		i := rng.Uint64N(c.num())
		miss := missPct > 0 && rng.IntN(100) < missPct
		var key []byte
		if miss {
			key = c.keys.Absent(i)
		} else {
			key = c.keys.Present(i)
		}
		v, found, err := c.e.Get(key)
		if err != nil {
			return err
		}
		if found == miss {
			wrong++
		}
		r.done(1, int64(len(key)+len(v)))
	}
	if wrong > 0 {
		return fmt.Errorf("%d of %d lookups returned the wrong presence", wrong, n)
	}
	return nil
}

// multiGetBatch is the number of keys one MultiGet reads.
const multiGetBatch = 64

// runMultiGet reads random present keys in batches of multiGetBatch with
// the engine's MultiGet (a loop of Gets for engines without one); each key
// is one operation.
func runMultiGet(c *runCtx, r *recorder) error {
	rng := newRand(c.cfg.Seed, 5)
	n := c.reads()
	keys := make([][]byte, 0, multiGetBatch)
	size := c.keys.Size()
	buf := make([]byte, multiGetBatch*size) // KeyGen reuses its buffer
	var wrong int
	r.begin()
	for done := 0; done < n; done += len(keys) {
		keys = keys[:0]
		for j := range min(multiGetBatch, n-done) {
			k := buf[j*size : (j+1)*size : (j+1)*size]
			copy(k, c.keys.Present(rng.Uint64N(c.num())))
			keys = append(keys, k)
		}
		found, bytes, err := c.e.MultiGet(keys)
		if err != nil {
			return err
		}
		wrong += len(keys) - found
		r.done(int64(len(keys)), bytes)
	}
	if wrong > 0 {
		return fmt.Errorf("%d of %d multiget lookups found nothing", wrong, n)
	}
	return nil
}

// runReadSeq scans every key with one iterator; each key is one operation.
func runReadSeq(c *runCtx, r *recorder) error {
	it, err := c.e.NewIter()
	if err != nil {
		return err
	}
	var n int
	r.begin()
	for ok := it.First(); ok; ok = it.Next() {
		n++
		r.done(1, int64(len(it.Key())+len(it.Value())))
	}
	if err := it.Close(); err != nil {
		return err
	}
	if n != c.cfg.Num {
		return fmt.Errorf("scan saw %d keys, want %d", n, c.cfg.Num)
	}
	return nil
}

// seekNexts is the number of Next calls after each seek (db_bench's
// --seek_nexts=10).
const seekNexts = 10

// runSeekRandom seeks one iterator to random present keys, then steps
// seekNexts times; one seek with its steps is one operation.
func runSeekRandom(c *runCtx, r *recorder) error {
	rng := newRand(c.cfg.Seed, 5)
	it, err := c.e.NewIter()
	if err != nil {
		return err
	}
	n := c.reads()
	var wrong int
	r.begin()
	for range n {
		i := rng.Uint64N(c.num())
		want := c.keys.Present(i)
		var bytes int64
		ok := it.SeekGE(want)
		if !ok || string(it.Key()) != string(want) {
			wrong++
		}
		for s := 0; ok && s <= seekNexts; s++ {
			bytes += int64(len(it.Key()) + len(it.Value()))
			if s < seekNexts {
				ok = it.Next()
			}
		}
		r.done(1, bytes)
	}
	if err := it.Close(); err != nil {
		return err
	}
	if wrong > 0 {
		return fmt.Errorf("%d of %d seeks did not land on their key", wrong, n)
	}
	return nil
}

// syncBatchKeys is the number of keys per synced batch.
const syncBatchKeys = 1000

// runFillBatchSync writes num random keys in synced batches of 1,000 keys.
// Throughput counts keys; latency is per batch commit.
func runFillBatchSync(c *runCtx, r *recorder) error {
	rng := newRand(c.cfg.Seed, 6)
	r.begin()
	for done := uint64(0); done < c.num(); {
		b := c.e.NewBatch()
		k := min(syncBatchKeys, c.num()-done)
		for range k {
			if err := b.Set(c.keys.Present(rng.Uint64N(c.num())), c.vals.Next()); err != nil {
				return err
			}
		}
		if err := b.Commit(true); err != nil {
			return err
		}
		done += k
		r.done(int64(k), int64(k)*c.kvBytes())
	}
	return nil
}

// dirSize sums the sizes of the regular files under dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}
