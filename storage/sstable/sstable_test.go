package sstable

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/shale-db/shale/storage/internal/base"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCache is a BlockCache that checks values are never modified.
type testCache struct {
	mu   sync.Mutex
	m    map[[3]uint64][]byte
	sums map[[3]uint64]uint32
	hits int
}

func newTestCache() *testCache {
	return &testCache{m: map[[3]uint64][]byte{}, sums: map[[3]uint64]uint32{}}
}

func (c *testCache) Get(id, fileNum, offset uint64) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [3]uint64{id, fileNum, offset}
	v, ok := c.m[k]
	if ok {
		c.hits++
		if crc32.ChecksumIEEE(v) != c.sums[k] {
			panic("cached value modified")
		}
	}
	return v, ok
}

func (c *testCache) Set(id, fileNum, offset uint64, value []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [3]uint64{id, fileNum, offset}
	c.m[k] = value
	c.sums[k] = crc32.ChecksumIEEE(value)
}

// oracle answers iterator queries over a sorted slice with bounds.
type oracle struct {
	kvs []kv
}

func newOracle(kvs []kv, lower, upper []byte) oracle {
	lo := sort.Search(len(kvs), func(i int) bool { return lower == nil || bytes.Compare(kvs[i].key.UserKey, lower) >= 0 })
	hi := sort.Search(len(kvs), func(i int) bool { return upper != nil && bytes.Compare(kvs[i].key.UserKey, upper) >= 0 })
	if hi < lo {
		hi = lo
	}
	return oracle{kvs[lo:hi]}
}

func (o oracle) seekGE(k []byte) int {
	return sort.Search(len(o.kvs), func(i int) bool { return bytes.Compare(o.kvs[i].key.UserKey, k) >= 0 })
}

func (o oracle) seekLT(k []byte) int { return o.seekGE(k) - 1 }

func checkPos(t *testing.T, it base.InternalIterator, ok bool, o oracle, pos int, op string) {
	t.Helper()
	want := pos >= 0 && pos < len(o.kvs)
	if err := it.Error(); err != nil {
		t.Fatalf("%s: error %v", op, err)
	}
	if ok != want {
		if ok {
			t.Fatalf("%s: got %s, want exhausted", op, it.Key())
		}
		t.Fatalf("%s: exhausted, want %s (pos %d)", op, o.kvs[pos].key, pos)
	}
	if !ok {
		return
	}
	if base.CompareInternal(it.Key(), o.kvs[pos].key) != 0 || !bytes.Equal(it.Value(), o.kvs[pos].val) {
		t.Fatalf("%s: got %s=%q, want %s=%q", op, it.Key(), it.Value(), o.kvs[pos].key, o.kvs[pos].val)
	}
}

func randKey(rng *rand.Rand, kvs []kv) []byte {
	if len(kvs) > 0 && rng.Intn(3) > 0 {
		k := kvs[rng.Intn(len(kvs))].key.UserKey
		switch rng.Intn(3) {
		case 0:
			return append(append([]byte{}, k...), 0)
		case 1:
			if len(k) > 0 {
				return k[:len(k)-1]
			}
		}
		return k
	}
	k := make([]byte, rng.Intn(8))
	rng.Read(k)
	return k
}

// exercise runs full scans and a random walk of positioning operations.
func exercise(t *testing.T, rng *rand.Rand, r *Reader, kvs []kv, lower, upper []byte, steps int) {
	it, err := r.NewIter(lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	o := newOracle(kvs, lower, upper)
	// Full forward and reverse scans.
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		checkPos(t, it, true, o, n, "scan")
		n++
	}
	checkPos(t, it, false, o, len(o.kvs), "scan end")
	n = len(o.kvs) - 1
	for ok := it.Last(); ok; ok = it.Prev() {
		checkPos(t, it, true, o, n, "rscan")
		n--
	}
	checkPos(t, it, false, o, -1, "rscan end")
	// Random walk.
	pos := -1
	valid := false
	for s := 0; s < steps; s++ {
		var ok bool
		var op string
		switch c := rng.Intn(10); {
		case c == 0:
			ok, pos, op = it.First(), 0, "First"
		case c == 1:
			ok, pos, op = it.Last(), len(o.kvs)-1, "Last"
		case c == 2:
			k := randKey(rng, kvs)
			op = fmt.Sprintf("SeekGE(%s)", base.FormatKey(k))
			ok = it.SeekGE(k)
			if lower != nil && bytes.Compare(k, lower) < 0 {
				k = lower
			}
			pos = o.seekGE(k)
		case c == 3:
			k := randKey(rng, kvs)
			op = fmt.Sprintf("SeekLT(%s)", base.FormatKey(k))
			ok = it.SeekLT(k)
			if upper != nil && bytes.Compare(k, upper) > 0 {
				k = upper
			}
			pos = o.seekLT(k)
		case c < 7:
			if !valid {
				continue
			}
			ok, pos, op = it.Next(), pos+1, "Next"
		default:
			if !valid {
				continue
			}
			ok, pos, op = it.Prev(), pos-1, "Prev"
		}
		checkPos(t, it, ok, o, pos, op)
		valid = ok
	}
}

var allCompressions = []Compression{NoCompression, SnappyCompression, ZstdCompression, ZstdDictCompression}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(42))
	blockSizes := []int{64, 256, 1024, 4096, 65536}
	restarts := []int{1, 2, 5, 16, 32}
	for _, c := range allCompressions {
		for _, bs := range blockSizes {
			ri := restarts[rng.Intn(len(restarts))]
			t.Run(fmt.Sprintf("%s/bs=%d/ri=%d", c, bs, ri), func(t *testing.T) {
				kvs := randomKVs(rng, 50+rng.Intn(800), 1+rng.Intn(4))
				opts := DefaultWriterOptions()
				opts.Compression, opts.BlockSize, opts.BlockRestartInterval = c, bs, ri
				data, md := build(t, opts, kvs, nil)
				if md.Properties.NumEntries != uint64(len(kvs)) {
					t.Fatalf("NumEntries %d want %d", md.Properties.NumEntries, len(kvs))
				}
				if base.CompareInternal(md.SmallestPoint, kvs[0].key) != 0 ||
					base.CompareInternal(md.LargestPoint, kvs[len(kvs)-1].key) != 0 {
					t.Fatalf("bounds %s %s", md.SmallestPoint, md.LargestPoint)
				}
				var cache *testCache
				ropts := ReaderOptions{FileNum: 7, CacheID: 1}
				if rng.Intn(2) == 0 {
					cache = newTestCache()
					ropts.Cache = cache
				}
				r := open(t, data, ropts)
				if got := r.Properties().CompressionName; got != c.String() {
					t.Fatalf("compression %q", got)
				}
				for i := 0; i < 8; i++ {
					var lower, upper []byte
					if i > 0 && rng.Intn(2) == 0 {
						lower = randKey(rng, kvs)
					}
					if i > 0 && rng.Intn(2) == 0 {
						upper = randKey(rng, kvs)
					}
					exercise(t, rng, r, kvs, lower, upper, 400)
				}
				if cache != nil && cache.hits == 0 {
					t.Fatal("cache never hit")
				}
				for _, e := range kvs {
					if !r.MayContain(e.key.UserKey) {
						t.Fatalf("bloom false negative for %s", e.key)
					}
				}
				checkLayout(t, r, data)
			})
		}
	}
}

func checkLayout(t *testing.T, r *Reader, data []byte) {
	t.Helper()
	l, err := r.Layout()
	if err != nil {
		t.Fatal(err)
	}
	// Blocks tile the file exactly, followed by the footer.
	var off uint64
	for _, b := range l.Blocks {
		if b.Offset != off {
			t.Fatalf("block %s at %d, expected %d", b.Kind, b.Offset, off)
		}
		off += b.Length + BlockTrailerLen
	}
	if off != l.FooterOffset || off+FooterLen != uint64(len(data)) {
		t.Fatalf("layout ends at %d, footer at %d, size %d", off, l.FooterOffset, len(data))
	}
}

func TestEmptyAndSingle(t *testing.T) {
	data, md := build(t, DefaultWriterOptions(), nil, nil)
	if md.HasPointKeys || md.HasRangeDels {
		t.Fatal("empty file has keys")
	}
	r := open(t, data, ReaderOptions{})
	it, _ := r.NewIter(nil, nil)
	if it.First() || it.Last() || it.SeekGE([]byte("a")) || it.SeekLT([]byte("z")) || it.Error() != nil {
		t.Fatal("empty file iterates")
	}
	if r.MayContain([]byte("a")) {
		t.Fatal("empty filter claims key")
	}
	_ = it.Close()

	kvs := []kv{{base.MakeInternalKey([]byte(""), 5, base.KindSet), []byte("v")}}
	data, _ = build(t, DefaultWriterOptions(), kvs, nil)
	r = open(t, data, ReaderOptions{})
	rng := rand.New(rand.NewSource(1))
	exercise(t, rng, r, kvs, nil, nil, 100)
	exercise(t, rng, r, kvs, []byte(""), []byte("a"), 100)
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter(&memFile{}, DefaultWriterOptions())
	if err := w.Add(base.MakeInternalKey([]byte("b"), 5, base.KindSet), nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []base.InternalKey{
		base.MakeInternalKey([]byte("a"), 9, base.KindSet),
		base.MakeInternalKey([]byte("b"), 5, base.KindSet),
		base.MakeInternalKey([]byte("b"), 6, base.KindSet),
		base.MakeInternalKey([]byte("c"), 6, base.KindRangeDelete),
		base.MakeInternalKey([]byte("c"), 6, base.KindLogData),
	} {
		if err := w.Add(k, nil); err == nil {
			t.Fatalf("Add(%s) succeeded", k)
		}
	}
	if err := w.Add(base.MakeInternalKey([]byte("b"), 4, base.KindDelete), nil); err != nil {
		t.Fatal(err)
	}
	if err := w.AddRangeDel([]byte("b"), []byte("b"), 3); err == nil {
		t.Fatal("empty range accepted")
	}
	if err := w.AddRangeDel([]byte("c"), []byte("b"), 3); err == nil {
		t.Fatal("inverted range accepted")
	}
	if _, err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(); err == nil {
		t.Fatal("second Finish succeeded")
	}
	if err := w.Add(base.MakeInternalKey([]byte("z"), 1, base.KindSet), nil); err == nil {
		t.Fatal("Add after Finish succeeded")
	}
	opts := DefaultWriterOptions()
	opts.UserProperties = map[string]string{"shale.x": "y"}
	w = NewWriter(&memFile{}, opts)
	if _, err := w.Finish(); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("reserved property accepted: %v", err)
	}
}

type failFile struct {
	memFile
	failAt int
}

var errInjected = errors.New("injected")

func (f *failFile) Write(p []byte) (int, error) {
	if f.Len()+len(p) > f.failAt {
		return 0, errInjected
	}
	return f.memFile.Write(p)
}

func TestWriterIOError(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	kvs := randomKVs(rng, 3000, 2)
	f := &failFile{failAt: 100000}
	w := NewWriter(f, DefaultWriterOptions())
	var err error
	for _, e := range kvs {
		if err = w.Add(e.key, e.val); err != nil {
			break
		}
	}
	_, ferr := w.Finish()
	if !errors.Is(ferr, errInjected) || (err != nil && !errors.Is(err, errInjected)) {
		t.Fatalf("errors %v / %v", err, ferr)
	}
	if !f.closed {
		t.Fatal("file not closed after failure")
	}
}

func TestRangeDels(t *testing.T) {
	rds := []RangeDel{
		{[]byte("m"), []byte("q"), 10},
		{[]byte("a"), []byte("c"), 5},
		{[]byte("a"), []byte("z"), 7},
		{[]byte("k"), []byte("zz"), 1},
	}
	kvs := []kv{
		{base.MakeInternalKey([]byte("b"), 3, base.KindSet), []byte("1")},
		{base.MakeInternalKey([]byte("n"), 20, base.KindSet), []byte("2")},
	}
	data, md := build(t, DefaultWriterOptions(), kvs, rds)
	if !md.HasRangeDels || md.SmallestRangeDel.String() != "a#7,RANGEDEL" ||
		!md.LargestRangeDel.IsExclusiveSentinel() || string(md.LargestRangeDel.UserKey) != "zz" {
		t.Fatalf("metadata %+v", md)
	}
	if md.SmallestSeq != 1 || md.LargestSeq != 20 {
		t.Fatalf("seqs %d %d", md.SmallestSeq, md.LargestSeq)
	}
	r := open(t, data, ReaderOptions{})
	got, err := r.RangeDels()
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, rd := range got {
		s = append(s, fmt.Sprintf("[%s,%s)#%d", rd.Start, rd.End, rd.Seq))
	}
	if want := "[a,z)#7 [a,c)#5 [k,zz)#1 [m,q)#10"; strings.Join(s, " ") != want {
		t.Fatalf("got %s want %s", strings.Join(s, " "), want)
	}
	if r.Properties().NumRangeDeletions != 4 {
		t.Fatal("NumRangeDeletions")
	}
	// Only range deletions.
	data, md = build(t, DefaultWriterOptions(), nil, rds[:1])
	if md.HasPointKeys || !md.HasRangeDels {
		t.Fatal("metadata")
	}
	r = open(t, data, ReaderOptions{})
	if got, err := r.RangeDels(); err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	it, _ := r.NewIter(nil, nil)
	if it.First() || it.Last() {
		t.Fatal("point keys in tombstone-only file")
	}
	_ = it.Close()
}

func TestPropertiesRoundTrip(t *testing.T) {
	opts := DefaultWriterOptions()
	opts.UserProperties = map[string]string{"app.owner": "shard-7", "app.empty": ""}
	opts.CreationTime = -12345
	opts.PrefixExtractor = func(k []byte) []byte { return k[:min(3, len(k))] }
	opts.PrefixExtractorName = "fixed3"
	kvs := randomKVs(rand.New(rand.NewSource(5)), 100, 2)
	data, md := build(t, opts, kvs, nil)
	r := open(t, data, ReaderOptions{})
	p := r.Properties()
	want := md.Properties
	if fmt.Sprint(*p) != fmt.Sprint(want) {
		t.Fatalf("properties differ:\n%+v\n%+v", *p, want)
	}
	if p.CreationTime != -12345 || p.UserProperties["app.owner"] != "shard-7" || p.PrefixExtractorName != "fixed3" ||
		p.ComparatorName != ComparatorName || p.FormatVersion != FormatVersion || p.NumDataBlocks == 0 {
		t.Fatalf("%+v", p)
	}
	if !strings.Contains(p.String(), "user property app.owner: shard-7") {
		t.Fatal(p.String())
	}
}

func TestApproximateOffset(t *testing.T) {
	var kvs []kv
	for i := 0; i < 10000; i++ {
		kvs = append(kvs, kv{base.MakeInternalKey([]byte(fmt.Sprintf("k%05d", i)), 1, base.KindSet), bytes.Repeat([]byte("v"), 100)})
	}
	opts := DefaultWriterOptions()
	opts.Compression = NoCompression
	data, md := build(t, opts, kvs, nil)
	r := open(t, data, ReaderOptions{})
	prev := uint64(0)
	for _, k := range []string{"a", "k01000", "k05000", "k09000", "z"} {
		off := r.ApproximateOffset([]byte(k))
		if off < prev {
			t.Fatalf("offset decreased at %s", k)
		}
		prev = off
	}
	if r.ApproximateOffset([]byte("a")) != 0 || r.ApproximateOffset([]byte("z")) != md.Properties.DataSize {
		t.Fatal("extremes")
	}
	mid := r.ApproximateOffset([]byte("k05000"))
	if d := float64(mid) / float64(md.Properties.DataSize); d < 0.45 || d > 0.55 {
		t.Fatalf("midpoint ratio %f", d)
	}
}

// countingReaderAt counts reads.
type countingReaderAt struct {
	r     *bytes.Reader
	mu    sync.Mutex
	reads int
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.r.ReadAt(p, off)
}

func TestBoundsAvoidBlockReads(t *testing.T) {
	var kvs []kv
	for i := 0; i < 1000; i++ {
		kvs = append(kvs, kv{base.MakeInternalKey([]byte(fmt.Sprintf("k%04d", i)), 1, base.KindSet), bytes.Repeat([]byte("v"), 200)})
	}
	opts := DefaultWriterOptions()
	opts.Compression = NoCompression
	data, md := build(t, opts, kvs, nil)
	cr := &countingReaderAt{r: bytes.NewReader(data)}
	r, err := NewReader(cr, int64(len(data)), ReaderOptions{FileName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if md.Properties.NumDataBlocks < 20 {
		t.Fatal("too few blocks")
	}
	base0 := cr.reads
	it, _ := r.NewIter([]byte("k0500"), []byte("k0510"))
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	for ok := it.Last(); ok; ok = it.Prev() {
		n++
	}
	if n != 20 || it.Error() != nil {
		t.Fatalf("n=%d err=%v", n, it.Error())
	}
	if reads := cr.reads - base0; reads > 4 {
		t.Fatalf("%d block reads for a 10-key range", reads)
	}
	// A range past all keys reads nothing.
	base0 = cr.reads
	it2, _ := r.NewIter([]byte("z"), nil)
	if it2.First() || it2.Last() || cr.reads != base0 {
		t.Fatalf("reads for out-of-range iteration: %d", cr.reads-base0)
	}
	// The index cannot rule out block 0 for keys below "a": one read.
	it3, _ := r.NewIter(nil, []byte("a"))
	if it3.First() || it3.Last() || cr.reads > base0+1 {
		t.Fatalf("reads for out-of-range iteration: %d", cr.reads-base0)
	}
}

func TestConcurrentReaders(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	kvs := randomKVs(rng, 2000, 3)
	opts := DefaultWriterOptions()
	opts.Compression = ZstdCompression
	opts.BlockSize = 512
	data, _ := build(t, opts, kvs, nil)
	r := open(t, data, ReaderOptions{Cache: newTestCache(), FileNum: 1})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			exercise(t, rng, r, kvs, nil, nil, 2000)
			_, _ = r.RangeDels()
		}(int64(g))
	}
	wg.Wait()
}

func TestSeparator(t *testing.T) {
	ik := func(s string, seq base.SeqNum) base.InternalKey {
		return base.MakeInternalKey([]byte(s), seq, base.KindSet)
	}
	cases := []struct{ a, b base.InternalKey }{
		{ik("abc", 1), ik("abd", 1)},
		{ik("abc1xyz", 1), ik("abd", 1)},
		{ik("ab", 1), ik("abc", 1)},
		{ik("ab", 5), ik("ab", 4)},
		{ik("a\xff\xff\xffzz", 1), ik("b", 1)},
		{ik("helloworld", 1), ik("hellz", 1)},
		{ik("", 1), ik("\x00", 1)},
		{ik("a\xff", 1), ik("b", 1)},
	}
	for _, c := range cases {
		enc := separator(nil, c.a, c.b)
		s, ok := base.DecodeInternalKey(enc)
		if !ok || base.CompareInternal(c.a, s) > 0 || base.CompareInternal(s, c.b) >= 0 {
			t.Fatalf("separator(%s, %s) = %s", c.a, c.b, s)
		}
	}
	if s, _ := base.DecodeInternalKey(separator(nil, ik("helloworld", 1), ik("hellz", 1))); string(s.UserKey) != "hellp" {
		t.Fatalf("not shortened: %s", s)
	}
}

func TestWriterAbort(t *testing.T) {
	f := &memFile{}
	opts := DefaultWriterOptions()
	opts.Compression = ZstdCompression
	w := NewWriter(f, opts)
	if err := w.Add(base.MakeInternalKey([]byte("a"), 1, base.KindSet), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil || !f.closed {
		t.Fatal("abort did not close")
	}
	if _, err := w.Finish(); err == nil {
		t.Fatal("Finish after Abort succeeded")
	}
}
