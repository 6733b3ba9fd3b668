package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/sstable"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/vfs/errorfs"
	"github.com/shale-db/shale/storage/wal"
)

// The tests in this file flip single bits of the files of a closed database
// (SSTs, WALs, the MANIFEST), open the damaged copy and read everything
// back. Each read must either return exactly what the undamaged database
// returns, or fail with a corruption error naming the damaged file. A
// silently wrong value or a silently missing key is a failure. The one
// tolerated loss is the damaged last record of the last WAL, which recovery
// cannot tell from a write torn by a crash, and only when the DB was not
// closed cleanly.

// corQuietLogger discards the engine's logs in tests that provoke many errors.
var corQuietLogger = slog.New(slog.DiscardHandler)

// faultTestBaseOpts are the options shared by the corruption and I/O-error
// tests: 64 KiB memtables, a concat merge operator, no WAL archive, no
// pacing and no logs.
func faultTestBaseOpts(fs vfs.FS) *Options {
	return &Options{
		FS:                  fs,
		MemTableSize:        64 << 10,
		L0CompactionTrigger: 8,
		L0SlowdownTrigger:   20,
		L0StopTrigger:       36,
		MergeOperator:       concatMerger{},
		WALArchiveMaxBytes:  -1,
		DisableWritePacing:  true,
		Logger:              corQuietLogger,
	}
}

// corruptOpts are the options of the corruption fixture: tiny memtables and
// blocks, a bloom filter, snappy at L0 and no compression below.
func corruptOpts(fs vfs.FS) *Options {
	o := faultTestBaseOpts(fs)
	o.Levels[0] = LevelOptions{BlockSize: 512, Compression: SnappyCompression}
	o.Levels[1] = LevelOptions{BlockSize: 1024, BlockRestartInterval: 4, Compression: NoCompression}
	return o
}

// corCopyTree copies dir and everything below it from src to dst, syncing
// every file and directory so the copy is fully durable.
func corCopyTree(t testing.TB, src, dst vfs.FS, dir string) {
	t.Helper()
	if err := dst.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names, err := src.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		p := src.Join(dir, n)
		fi, err := src.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.IsDir() {
			corCopyTree(t, src, dst, p)
			continue
		}
		corWriteFile(t, dst, p, corReadFile(t, src, p))
	}
	corSyncDir(t, dst, dir)
}

// corClone returns a durable copy of the tree "db" of fs.
func corClone(t testing.TB, fs vfs.FS) *vfs.MemFS {
	c := vfs.NewMem()
	corCopyTree(t, fs, c, "db")
	return c
}

func corReadFile(t testing.TB, fs vfs.FS, path string) []byte {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func corWriteFile(t testing.TB, fs vfs.FS, path string, data []byte) {
	t.Helper()
	f, err := fs.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func corSyncDir(t testing.TB, fs vfs.FS, dir string) {
	t.Helper()
	d, err := fs.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
}

// corFlipBit flips bit (counted from the start of the file) of path in fs.
func corFlipBit(t testing.TB, fs vfs.FS, path string, bit int64) {
	data := corReadFile(t, fs, path)
	data[bit/8] ^= 1 << (bit % 8)
	corWriteFile(t, fs, path, data)
}

// corState is what reading a whole database returns.
type corState struct {
	kv   map[string]string
	keys []string // sorted
}

func corStateOf(o oracle) corState {
	s := corState{kv: map[string]string(o.clone())}
	for k := range s.kv {
		s.keys = append(s.keys, k)
	}
	sort.Strings(s.keys)
	return s
}

// corReadResult is everything one read pass over a database returned.
type corReadResult struct {
	gets    map[string]corGetResult
	fwd     [][2]string
	rev     [][2]string
	fwdErr  error
	revErr  error
	iterErr error // from NewIter
}

type corGetResult struct {
	val   string
	found bool
	err   error
}

// corReadAll gets every key of keys and scans the database both ways.
func corReadAll(d *DB, keys []string) *corReadResult {
	r := &corReadResult{gets: make(map[string]corGetResult, len(keys))}
	for _, k := range keys {
		v, err := d.Get([]byte(k))
		switch {
		case err == nil:
			r.gets[k] = corGetResult{val: string(v), found: true}
		case errors.Is(err, ErrNotFound):
			r.gets[k] = corGetResult{}
		default:
			r.gets[k] = corGetResult{err: err}
		}
	}
	scan := func(forward bool) (out [][2]string, err error) {
		it, err := d.NewIter(nil)
		if err != nil {
			r.iterErr = err
			return nil, nil
		}
		ok := it.First()
		if !forward {
			ok = it.Last()
		}
		for ok {
			out = append(out, [2]string{string(it.Key()), string(it.Value())})
			if forward {
				ok = it.Next()
			} else {
				ok = it.Prev()
			}
		}
		err = it.Error()
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		return out, err
	}
	r.fwd, r.fwdErr = scan(true)
	r.rev, r.revErr = scan(false)
	return r
}

// errs returns every error the read pass saw.
func (r *corReadResult) errs() []error {
	var out []error
	for _, g := range r.gets {
		if g.err != nil {
			out = append(out, g.err)
		}
	}
	for _, e := range []error{r.fwdErr, r.revErr, r.iterErr} {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}

// mismatch describes the first result that contradicts want, ignoring
// operations that failed ("" if none). A failed scan must have returned a
// correct prefix of the scan before failing.
func (r *corReadResult) mismatch(want corState) string {
	keys := make([]string, 0, len(r.gets))
	for k := range r.gets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g := r.gets[k]
		if g.err != nil {
			continue
		}
		wv, wok := want.kv[k]
		if g.found != wok || g.val != wv {
			return fmt.Sprintf("Get(%s) = %q found=%v, want %q found=%v", k, g.val, g.found, wv, wok)
		}
	}
	if r.iterErr != nil {
		return ""
	}
	check := func(name string, got [][2]string, err error, order []string) string {
		for i, kv := range got {
			if i >= len(order) || kv[0] != order[i] || kv[1] != want.kv[order[i]] {
				return fmt.Sprintf("%s scan entry %d is %q=%q, want %q", name, i, kv[0], kv[1], order[min(i, len(order)-1)])
			}
		}
		if err == nil && len(got) != len(order) {
			return fmt.Sprintf("%s scan returned %d keys without error, want %d", name, len(got), len(order))
		}
		return ""
	}
	if m := check("forward", r.fwd, r.fwdErr, want.keys); m != "" {
		return m
	}
	rev := slices.Clone(want.keys)
	slices.Reverse(rev)
	return check("reverse", r.rev, r.revErr, rev)
}

// corruptFixture is a closed database to damage, with what reading it
// returns.
type corruptFixture struct {
	fs   *vfs.MemFS // the closed database; never modified
	keys []string   // keys to Get: every key ever written plus absent ones
	want corState   // what a clean open reads
	// tailCut is what an open reads when the last record of the last WAL is
	// lost, the one loss recovery tolerates (a torn or garbled tail) unless
	// the DB was closed cleanly; lastWAL is "" when nothing is tolerated.
	tailCut    corState
	lastWAL    string
	lastRecOff int64 // offset of the last record's first chunk in lastWAL
}

// buildCorruptFixture writes a database with two SST levels (an L0 file with
// a range tombstone over a compacted bottom level), a MANIFEST of several
// edits, and unflushed data in the WAL.
//
// With twoWALs, the flushes of the last memtables fail, so the full
// memtable's WAL stays live next to the current one and recovery has a
// non-last and a last log to replay; the DB is closed in the
// background-error state. Otherwise the unflushed data fits one WAL and the
// DB is closed cleanly.
func buildCorruptFixture(t testing.TB, twoWALs bool) *corruptFixture {
	t.Helper()
	mem := vfs.NewMem()
	sstCreate := errorfs.And(errorfs.Ops(errorfs.OpCreate), errorfs.PathSuffix(".sst"))
	tog := errorfs.NewToggle(errorfs.Chain(
		errorfs.Latency(sstCreate, 20*time.Millisecond),
		errorfs.Filter(sstCreate, errorfs.FromIndex(0, errorfs.ErrEIO)),
	))
	d, err := Open("db", corruptOpts(errorfs.Wrap(mem, tog)))
	if err != nil {
		t.Fatal(err)
	}
	model := oracle{}
	apply := func(b *Batch, o WriteOptions) error {
		err := d.Apply(b, o)
		if err == nil {
			model.apply(b)
		}
		return err
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%04d", i)) }
	val := func(i, ver int) []byte {
		v := []byte(fmt.Sprintf("v%d.%d:", ver, i))
		for j := 0; j < 10+(i*7+ver*13)%90; j++ {
			v = append(v, 'a'+byte((i+j*ver)%26))
		}
		return v
	}
	one := func(f func(b *Batch)) *Batch { b := NewBatch(); f(b); return b }

	// An SST, overwritten, deleted and merged, compacted to the bottom.
	for i := 0; i < 300; i++ {
		must(apply(one(func(b *Batch) { b.Set(key(i), val(i, 1)) }), NoSync))
	}
	must(d.Flush())
	for i := 0; i < 300; i += 3 {
		must(apply(one(func(b *Batch) { b.Set(key(i), val(i, 2)) }), NoSync))
	}
	for i := 1; i < 300; i += 7 {
		must(apply(one(func(b *Batch) { b.Delete(key(i)) }), NoSync))
	}
	for i := 2; i < 300; i += 11 {
		must(apply(one(func(b *Batch) { b.Merge(key(i), []byte("m1")) }), NoSync))
	}
	must(d.Flush())
	must(d.CompactRange(nil, nil))
	// An L0 file on top, with a range tombstone and merges over the
	// compacted values.
	must(apply(one(func(b *Batch) { b.DeleteRange(key(100), key(120)) }), NoSync))
	for i := 0; i < 340; i += 5 {
		must(apply(one(func(b *Batch) { b.Merge(key(i), []byte("m2")) }), NoSync))
	}
	for i := 300; i < 340; i++ {
		must(apply(one(func(b *Batch) { b.Set(key(i), val(i, 3)) }), NoSync))
	}
	must(d.Flush())

	// Unflushed data. From here on flushes fail (after a delay), so the
	// memtable that fills up keeps its WAL, and a second WAL starts.
	if twoWALs {
		tog.Enable()
	}
	rotated := 0
	for n := 0; rotated < 40 && (twoWALs || n < 60); n++ {
		i := n % 340
		b := NewBatch()
		switch n % 4 {
		case 0:
			b.Set(key(i), val(i, 4+n))
			b.Merge(key((i+1)%340), []byte(fmt.Sprintf("w%d", n)))
		case 1:
			b.Delete(key(i))
			b.LogData([]byte("log data"))
		case 2:
			b.Set(key(i), val(i, 4+n))
		case 3:
			b.Set(key(340+n%20), val(i, 4+n))
		}
		if n == 20 {
			// A record longer than a WAL block: First, Middle and Last chunks.
			b.Set(key(399), bytes.Repeat([]byte("big-value."), 4000))
		}
		if err := apply(b, Sync); err != nil {
			if !twoWALs {
				t.Fatal(err)
			}
			break // the failed flush has set the background error
		}
		if rotated > 0 || d.Metrics().MemTables > 1 {
			rotated++
		}
		if n > 100000 {
			t.Fatal("the memtable never filled up")
		}
	}
	if twoWALs {
		deadline := time.Now().Add(10 * time.Second)
		for d.Metrics().BackgroundError == nil {
			if time.Now().After(deadline) {
				t.Fatal("the failing flush never set the background error")
			}
			time.Sleep(time.Millisecond)
		}
		if err := apply(one(func(b *Batch) { b.Set(key(0), []byte("refused")) }), Sync); err == nil {
			t.Fatal("write accepted after the background error")
		}
		_ = d.Close()
	} else {
		if d.Metrics().MemTables != 1 {
			t.Fatal("the memtable filled up; write less")
		}
		must(d.Close())
	}

	fx := &corruptFixture{fs: mem}
	for i := 0; i < 410; i++ {
		fx.keys = append(fx.keys, string(key(i)))
	}
	fx.keys = append(fx.keys, "", "a", "k", "k0100\x00", "zzz")

	// What a clean open reads must be exactly what was acknowledged.
	fx.want = fx.read(t, corClone(t, mem))
	if want := corStateOf(model); !slices.Equal(corPairs(want), corPairs(fx.want)) {
		t.Fatalf("clean reopen reads %d keys, differing from the %d acknowledged", len(fx.want.keys), len(want.keys))
	}

	// The WALs: the fixture is only useful with two of them.
	var logs []string
	for _, n := range fx.files(t, manifest.FileTypeLog) {
		logs = append(logs, n)
	}
	if want := map[bool]int{true: 2, false: 1}[twoWALs]; len(logs) != want {
		t.Fatalf("want %d live WALs, have %v", want, logs)
	}
	last := logs[len(logs)-1]
	data := corReadFile(t, mem, mem.Join("db", last))
	r := wal.NewReader(bytes.NewReader(data), last)
	nrec := 0
	for {
		if _, err := r.Next(); err != nil {
			if err != io.EOF {
				t.Fatalf("reading %s: %v", last, err)
			}
			break
		}
		nrec++
		fx.lastRecOff = r.LastRecordOffset()
	}
	if nrec < 2 {
		t.Fatalf("the last WAL holds %d records; want several", nrec)
	}
	if !twoWALs {
		return fx // closed cleanly: no tail is ever tolerated
	}
	fx.lastWAL = last
	cut := corClone(t, mem)
	corWriteFile(t, cut, cut.Join("db", fx.lastWAL), data[:fx.lastRecOff])
	fx.tailCut = fx.read(t, cut)
	return fx
}

func corPairs(s corState) [][2]string {
	var out [][2]string
	for _, k := range s.keys {
		out = append(out, [2]string{k, s.kv[k]})
	}
	return out
}

// read opens the database in fs and returns its contents, failing on any
// error.
func (fx *corruptFixture) read(t testing.TB, fs vfs.FS) corState {
	t.Helper()
	d, err := Open("db", corruptOpts(fs))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r := corReadAll(d, fx.keys)
	if errs := r.errs(); len(errs) > 0 {
		t.Fatal(errs[0])
	}
	s := corState{kv: map[string]string{}}
	for _, kv := range r.fwd {
		s.kv[kv[0]] = kv[1]
		s.keys = append(s.keys, kv[0])
	}
	if m := r.mismatch(s); m != "" {
		t.Fatalf("clean database reads inconsistently: %s", m)
	}
	return s
}

// files returns the names of the fixture's files of type ft, sorted.
func (fx *corruptFixture) files(t testing.TB, ft manifest.FileType) []string {
	names, err := fx.fs.List("db")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if typ, _, ok := manifest.ParseFilename(n); ok && typ == ft {
			out = append(out, n)
		}
	}
	return out
}

// corOutcome is what a trial saw.
type corOutcome int

const (
	corSame      corOutcome = iota // results equal to the undamaged database
	corDetected                    // a corruption error naming the file
	corTolerated                   // the last record of the last WAL was dropped
)

// trial damages one bit of file in a copy of the fixture, opens it and
// reads everything, and classifies the outcome. problem is non-empty when
// the outcome is not acceptable.
func (fx *corruptFixture) trial(t testing.TB, file string, bit int64) (_ corOutcome, problem string) {
	t.Helper()
	fs := corClone(t, fx.fs)
	corFlipBit(t, fs, fs.Join("db", file), bit)
	checkErr := func(err error) string {
		if !strings.Contains(err.Error(), file) {
			return fmt.Sprintf("error does not name the damaged file: %v", err)
		}
		if !errors.Is(err, base.ErrCorruption) {
			return fmt.Sprintf("error is not a corruption error: %v", err)
		}
		return ""
	}
	d, err := Open("db", corruptOpts(fs))
	if err != nil {
		return corDetected, checkErr(err)
	}
	r := corReadAll(d, fx.keys)
	_ = d.Close()
	errs := r.errs()
	for _, err := range errs {
		if p := checkErr(err); p != "" {
			return corDetected, p
		}
	}
	m := r.mismatch(fx.want)
	switch {
	case m == "" && len(errs) > 0:
		return corDetected, ""
	case m == "":
		return corSame, ""
	case file == fx.lastWAL && bit/8 >= fx.lastRecOff && r.mismatch(fx.tailCut) == "":
		return corTolerated, ""
	}
	return corDetected, "wrong data without an error: " + m
}

// corTarget is one bit to damage.
type corTarget struct {
	file string
	bit  int64
	what string
}

// corPickBits returns n distinct random bits within bytes [off, end).
func corPickBits(rng *rand.Rand, file, what string, off, end int64, n int) []corTarget {
	var out []corTarget
	if end <= off {
		return nil
	}
	total := (end - off) * 8
	seen := map[int64]bool{}
	for len(out) < n && int64(len(out)) < total {
		b := off*8 + rng.Int64N(total)
		if !seen[b] {
			seen[b] = true
			out = append(out, corTarget{file, b, what})
		}
	}
	return out
}

// sstTargets spreads bits over every block (contents and trailer) of every
// SST and over their footers.
func (fx *corruptFixture) sstTargets(t testing.TB, rng *rand.Rand, perFile int) []corTarget {
	var out []corTarget
	ssts := fx.files(t, manifest.FileTypeTable)
	if len(ssts) < 2 {
		t.Fatalf("want at least 2 SSTs, have %v", ssts)
	}
	kinds := map[string]bool{}
	for _, name := range ssts {
		data := corReadFile(t, fx.fs, fx.fs.Join("db", name))
		r, err := sstable.NewReader(bytes.NewReader(data), int64(len(data)), sstable.ReaderOptions{FileName: name})
		if err != nil {
			t.Fatal(err)
		}
		l, err := r.Layout()
		if err != nil {
			t.Fatal(err)
		}
		var dataBlocks []sstable.BlockInfo
		for _, b := range l.Blocks {
			kinds[b.Kind] = true
			if b.Kind == "data" {
				dataBlocks = append(dataBlocks, b)
				continue
			}
			end := int64(b.Offset + b.Length)
			out = append(out, corPickBits(rng, name, b.Kind, int64(b.Offset), end, perFile/10)...)
			out = append(out, corPickBits(rng, name, b.Kind+" trailer", end, end+5, 2)...)
		}
		// Data blocks: the first, the last and random ones in between.
		for i := 0; i < perFile/3; i++ {
			b := dataBlocks[rng.IntN(len(dataBlocks))]
			switch i {
			case 0:
				b = dataBlocks[0]
			case 1:
				b = dataBlocks[len(dataBlocks)-1]
			}
			end := int64(b.Offset + b.Length)
			if i%4 == 3 {
				out = append(out, corPickBits(rng, name, "data trailer", end, end+5, 1)...)
			} else {
				out = append(out, corPickBits(rng, name, "data", int64(b.Offset), end, 1)...)
			}
		}
		out = append(out, corPickBits(rng, name, "footer", int64(l.FooterOffset), int64(len(data)), perFile/8)...)
	}
	for _, k := range []string{"data", "filter", "range-del", "index", "properties", "metaindex"} {
		if !kinds[k] {
			t.Fatalf("no SST of the fixture has a %s block", k)
		}
	}
	return out
}

// corChunk locates one chunk of a log file (WAL or MANIFEST).
type corChunk struct {
	off, n int64 // header offset, payload length
	typ    byte
}

// corChunks parses the chunk headers of an intact log file.
func corChunks(data []byte) []corChunk {
	var out []corChunk
	for blk := 0; blk < len(data); blk += wal.BlockSize {
		end := min(len(data), blk+wal.BlockSize)
		for pos := blk; end-pos >= wal.HeaderSize; {
			h := data[pos : pos+wal.HeaderSize]
			n := int(binary.LittleEndian.Uint16(h[4:]))
			if h[6] == 0 {
				break
			}
			out = append(out, corChunk{int64(pos), int64(n), h[6]})
			pos += wal.HeaderSize + n
		}
	}
	return out
}

// corLogTargets picks bits of a log file: every bit of the length field of
// some chunks (a grown length can reach past the end of the file and look
// like a torn write), random header bits, payload bits, and everything of
// the last chunk.
func corLogTargets(rng *rand.Rand, name string, data []byte, n int) []corTarget {
	chunks := corChunks(data)
	var out []corTarget
	lengthChunks := map[int]bool{0: true, len(chunks) - 1: true, len(chunks) / 2: true}
	for i, c := range chunks {
		if c.typ != 1 {
			lengthChunks[i] = true // every fragment of a fragmented record
		}
	}
	for i := range lengthChunks {
		c := chunks[i]
		out = append(out, corPickBits(rng, name, fmt.Sprintf("length of chunk %d type %d", i, c.typ), c.off+4, c.off+6, 16)...)
	}
	last := chunks[len(chunks)-1]
	out = append(out, corPickBits(rng, name, "last chunk checksum/type", last.off, last.off+4, 8)...)
	out = append(out, corPickBits(rng, name, "last chunk type", last.off+6, last.off+7, 8)...)
	out = append(out, corPickBits(rng, name, "last chunk payload", last.off+7, last.off+7+last.n, 8)...)
	for len(out) < n {
		c := chunks[rng.IntN(len(chunks))]
		if rng.IntN(3) == 0 {
			out = append(out, corPickBits(rng, name, "chunk header", c.off, c.off+wal.HeaderSize, 1)...)
		} else {
			out = append(out, corPickBits(rng, name, "chunk payload", c.off+wal.HeaderSize, c.off+wal.HeaderSize+c.n, 1)...)
		}
	}
	return out
}

func TestCorruptionBitFlips(t *testing.T) {
	t.Run("two-wals-bg-error", func(t *testing.T) { corruptionBitFlips(t, true, 100) })
	t.Run("clean-close", func(t *testing.T) { corruptionBitFlips(t, false, 40) })
}

// corruptionBitFlips damages sstBits bits of each SST and a few hundred
// bits of the WALs and the MANIFEST of a fixture, one at a time.
func corruptionBitFlips(t *testing.T, twoWALs bool, sstBits int) {
	fx := buildCorruptFixture(t, twoWALs)
	rng := rand.New(rand.NewPCG(7, 11))
	scale := 1
	if testing.Short() {
		scale = 3
	}
	groups := map[string][]corTarget{}
	groups["sst"] = fx.sstTargets(t, rng, sstBits/scale)
	for _, name := range fx.files(t, manifest.FileTypeLog) {
		data := corReadFile(t, fx.fs, fx.fs.Join("db", name))
		groups["wal"] = append(groups["wal"], corLogTargets(rng, name, data, 160/scale)...)
	}
	for _, name := range fx.files(t, manifest.FileTypeManifest) {
		data := corReadFile(t, fx.fs, fx.fs.Join("db", name))
		if len(corChunks(data)) < 4 {
			t.Fatalf("%s has %d records; want several edits", name, len(corChunks(data)))
		}
		groups["manifest"] = append(groups["manifest"], corLogTargets(rng, name, data, 300/scale)...)
	}
	for _, g := range []string{"sst", "wal", "manifest"} {
		t.Run(g, func(t *testing.T) {
			var counts [3]int
			failures := 0
			for _, tg := range groups[g] {
				outcome, problem := fx.trial(t, tg.file, tg.bit)
				counts[outcome]++
				if problem != "" {
					failures++
					if failures <= 10 {
						t.Errorf("%s bit %d (byte %d, %s): %s", tg.file, tg.bit, tg.bit/8, tg.what, problem)
					}
				}
			}
			if failures > 10 {
				t.Errorf("... %d failures in all", failures)
			}
			t.Logf("%d flips: %d detected, %d harmless, %d tolerated torn WAL tails",
				len(groups[g]), counts[corDetected], counts[corSame], counts[corTolerated])
			if counts[corDetected] == 0 {
				t.Errorf("no flip was detected")
			}
			if !twoWALs && counts[corTolerated] > 0 {
				// The last WAL was closed cleanly: no torn tail to excuse.
				t.Errorf("a record of a cleanly closed WAL was dropped without an error")
			}
		})
	}
}
