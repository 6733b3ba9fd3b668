package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// makeRecord returns a deterministic payload of length n tagged with i.
func makeRecord(i, n int) []byte {
	p := make([]byte, n)
	for j := range p {
		p[j] = byte(i*31 + j*7 + j>>8)
	}
	return p
}

// writeLog writes recs and returns the log bytes and the record offsets.
func writeLog(t testing.TB, recs [][]byte, flushEvery int) ([]byte, []int64) {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	offs := make([]int64, len(recs))
	for i, r := range recs {
		off, err := w.WriteRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		offs[i] = off
		if flushEvery > 0 && i%flushEvery == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if int64(buf.Len()) != w.Size() {
				t.Fatalf("after flush: buffer %d bytes, Size %d", buf.Len(), w.Size())
			}
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) != w.Size() {
		t.Fatalf("buffer %d bytes, Size %d", buf.Len(), w.Size())
	}
	return buf.Bytes(), offs
}

// readAll reads every record until an error and returns copies.
func readAll(data []byte) ([][]byte, []int64, *Reader, error) {
	r := NewReader(bytes.NewReader(data), "test.log")
	var recs [][]byte
	var offs []int64
	for {
		rec, err := r.Next()
		if err != nil {
			return recs, offs, r, err
		}
		recs = append(recs, append([]byte(nil), rec...))
		offs = append(offs, r.LastRecordOffset())
	}
}

func checkRecords(t *testing.T, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d: got %d bytes, want %d bytes (contents differ)", i, len(got[i]), len(want[i]))
		}
	}
}

func TestRoundTripSizes(t *testing.T) {
	sizes := []int{0, 1, 2, HeaderSize - 1, HeaderSize, maxPayload - 1, maxPayload, maxPayload + 1,
		BlockSize - 1, BlockSize, BlockSize + 1, 2*maxPayload - HeaderSize, 2 * maxPayload, 3*BlockSize + 17, 1 << 20, 0}
	for _, flushEvery := range []int{0, 1, 3} {
		var recs [][]byte
		// Each size, also after offsets that leave 0..HeaderSize+1 bytes in a block.
		for _, s := range sizes {
			recs = append(recs, makeRecord(len(recs), s))
		}
		for lead := 0; lead < 20; lead++ {
			recs = append(recs, makeRecord(len(recs), maxPayload-HeaderSize-lead))
			recs = append(recs, makeRecord(len(recs), lead))
			recs = append(recs, makeRecord(len(recs), 0))
		}
		data, offs := writeLog(t, recs, flushEvery)
		got, gotOffs, r, err := readAll(data)
		if err != io.EOF {
			t.Fatalf("flushEvery=%d: want io.EOF, got %v", flushEvery, err)
		}
		checkRecords(t, got, recs)
		for i := range offs {
			if offs[i] != gotOffs[i] {
				t.Fatalf("record %d: writer offset %d, reader offset %d", i, offs[i], gotOffs[i])
			}
		}
		if r.ValidOffset() != int64(len(data)) {
			// The log may end with padding only if the last record filled
			// its block; our last record is small, so no padding.
			t.Fatalf("ValidOffset %d, log size %d", r.ValidOffset(), len(data))
		}
		if r.ValidRecordFollows() {
			t.Fatal("ValidRecordFollows after clean EOF")
		}
	}
}

func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var recs [][]byte
	for i := 0; i < 2000; i++ {
		var n int
		switch rng.IntN(10) {
		case 0:
			n = rng.IntN(3 * BlockSize)
		case 1:
			n = 0
		default:
			n = rng.IntN(100)
		}
		recs = append(recs, makeRecord(i, n))
	}
	data, _ := writeLog(t, recs, 7)
	got, _, _, err := readAll(data)
	if err != io.EOF {
		t.Fatalf("want io.EOF, got %v", err)
	}
	checkRecords(t, got, recs)
}

// TestWriterAtResumes writes a log through a fresh NewWriterAt after every
// few records and checks the bytes equal one Writer's, including where the
// resume point leaves less than a header's room in the block.
func TestWriterAtResumes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Choose record sizes with a reference writer, so that the record
	// before every other resume point leaves k < HeaderSize bytes in its
	// block, for each k in turn.
	var recs [][]byte
	ref := NewWriter(io.Discard)
	for i := 0; i < 600; i++ {
		n := rng.IntN(200)
		if rng.IntN(8) == 0 {
			n = rng.IntN(2 * BlockSize)
		}
		if (i+1)%3 == 0 && (i/3)%2 == 0 {
			k := (i / 6) % HeaderSize
			room := BlockSize - int(ref.Size()%BlockSize)
			if room-k-HeaderSize >= 0 {
				n = room - k - HeaderSize
			}
		}
		recs = append(recs, makeRecord(i, n))
		if _, err := ref.WriteRecord(recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	want, wantOffs := writeLog(t, recs, 0)

	var buf bytes.Buffer
	var w *Writer
	tight := map[int]bool{} // room left in the block at resumes, when under a header
	for i, r := range recs {
		if i%3 == 0 {
			if w != nil {
				if err := w.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if rest := BlockSize - buf.Len()%BlockSize; rest < HeaderSize {
				tight[rest] = true
			}
			w = NewWriterAt(&buf, int64(buf.Len()))
			if w.Size() != int64(buf.Len()) {
				t.Fatalf("resumed Size %d, log %d bytes", w.Size(), buf.Len())
			}
		}
		off, err := w.WriteRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		if off != wantOffs[i] {
			t.Fatalf("record %d at %d, want %d", i, off, wantOffs[i])
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(tight) < HeaderSize-1 {
		t.Fatalf("resumes left only %v bytes under a header's room; want every value 1..%d", tight, HeaderSize-1)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("resumed log differs from a single writer's (%d vs %d bytes)", buf.Len(), len(want))
	}
	got, _, _, err := readAll(buf.Bytes())
	if err != io.EOF {
		t.Fatalf("want io.EOF, got %v", err)
	}
	checkRecords(t, got, recs)
}

func TestOffsetsAndPadding(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	// Leave exactly 3 bytes in the first block: the next record starts at the
	// next block and the trailer is zero.
	off, _ := w.WriteRecord(make([]byte, BlockSize-HeaderSize-3))
	if off != 0 {
		t.Fatalf("offset %d", off)
	}
	off, _ = w.WriteRecord([]byte("x"))
	if off != BlockSize {
		t.Fatalf("second record at %d, want %d", off, BlockSize)
	}
	// Leave exactly HeaderSize bytes: an empty First chunk goes there.
	w2 := NewWriter(&bytes.Buffer{})
	w2.WriteRecord(make([]byte, BlockSize-2*HeaderSize))
	off, _ = w2.WriteRecord([]byte("abc"))
	if off != BlockSize-HeaderSize {
		t.Fatalf("record at %d, want %d", off, BlockSize-HeaderSize)
	}
	if w2.Size() != BlockSize+HeaderSize+3 {
		t.Fatalf("size %d", w2.Size())
	}
}

func TestZeroedTail(t *testing.T) {
	recs := [][]byte{[]byte("a"), []byte("bb"), makeRecord(3, 40000)}
	data, _ := writeLog(t, recs, 0)
	// Preallocated, zeroed space after the data is a clean end.
	for _, extra := range []int{1, HeaderSize - 1, HeaderSize, 100, 3 * BlockSize} {
		padded := append(append([]byte(nil), data...), make([]byte, extra)...)
		got, _, r, err := readAll(padded)
		if err != io.EOF {
			t.Fatalf("extra=%d: want io.EOF, got %v", extra, err)
		}
		checkRecords(t, got, recs)
		if r.ValidRecordFollows() {
			t.Fatalf("extra=%d: valid record reported in zeros", extra)
		}
	}
	// The third record starts at offset 17 and fills the first block; zeros
	// where its next chunk should be make a torn tail.
	torn := append(append([]byte(nil), data[:BlockSize]...), make([]byte, 2*BlockSize)...)
	_, _, _, err := readAll(torn)
	if !errors.Is(err, ErrTornTail) {
		t.Fatalf("want torn tail, got %v", err)
	}
	// Zeros inside a chunk's payload fail its checksum, and nothing valid
	// follows.
	garbage := append(append([]byte(nil), data[:100]...), make([]byte, 2*BlockSize)...)
	_, _, r, err := readAll(garbage)
	if !errors.Is(err, base.ErrCorruption) || r.ValidRecordFollows() {
		t.Fatalf("want corruption with nothing following, got %v", err)
	}
	// Zeros hiding later records: io.EOF, but ValidRecordFollows reveals them.
	mid := append([]byte(nil), data...)
	clear(mid[17 : 17+HeaderSize]) // header of the third record
	mid = append(mid, data...)
	got, _, r, err := readAll(mid)
	if err != io.EOF || len(got) != 2 {
		t.Fatalf("got %d records, err %v", len(got), err)
	}
	if !r.ValidRecordFollows() {
		t.Fatal("records after zeroed header not detected")
	}
}

// flipBits flips each bit listed in bits (one at a time) in a copy of the
// log of recs: the reader must return a prefix of the records followed by a
// corruption error or a torn tail, or all records intact (flips in block
// padding go unnoticed), but never a wrong payload.
func flipBits(t *testing.T, recs [][]byte, data []byte, bits []int) (corrupt, torn, intact int) {
	t.Helper()
	d := append([]byte(nil), data...)
	for _, i := range bits {
		d[i/8] ^= 1 << (i % 8)
		got, _, r, err := readAll(d)
		d[i/8] ^= 1 << (i % 8)
		for j := range got {
			if j >= len(recs) || !bytes.Equal(got[j], recs[j]) {
				t.Fatalf("bit %d: record %d is wrong", i, j)
			}
		}
		switch {
		case err == io.EOF && len(got) == len(recs):
			intact++
		case errors.Is(err, base.ErrCorruption):
			var ce *base.CorruptionError
			if !errors.As(err, &ce) || ce.File != "test.log" || ce.Offset < 0 || ce.Offset > int64(i/8) {
				t.Fatalf("bit %d: bad corruption error %v", i, err)
			}
			corrupt++
			_ = r.ValidRecordFollows() // must not panic
		case errors.Is(err, ErrTornTail):
			torn++
		default:
			t.Fatalf("bit %d: unexpected result %d records, err %v", i, len(got), err)
		}
	}
	return corrupt, torn, intact
}

// TestBitFlipsSmall flips every bit of a small single-block log.
func TestBitFlipsSmall(t *testing.T) {
	recs := [][]byte{[]byte("hello"), {}, makeRecord(1, 200), []byte("x"), makeRecord(2, 90)}
	data, _ := writeLog(t, recs, 0)
	bits := make([]int, len(data)*8)
	for i := range bits {
		bits[i] = i
	}
	corrupt, torn, intact := flipBits(t, recs, data, bits)
	if intact != 0 || corrupt == 0 {
		t.Fatalf("corrupt=%d torn=%d intact=%d", corrupt, torn, intact)
	}
}

// paddedLog returns records whose log spans three blocks, with a record
// crossing two block boundaries and a block ending in a 3-byte zero trailer.
func paddedLog() [][]byte {
	recs := [][]byte{[]byte("hello"), {}, makeRecord(1, 200), makeRecord(2, BlockSize+100), []byte("tail")}
	w := NewWriter(io.Discard)
	for _, r := range recs {
		w.WriteRecord(r)
	}
	left := BlockSize - int(w.Size()%BlockSize)
	recs = append(recs, makeRecord(3, left-HeaderSize-3), makeRecord(4, 20), makeRecord(5, 3))
	return recs
}

// TestBitFlipsMultiBlock flips every bit near each chunk header and block
// boundary of a multi-block log (with a padded block trailer and fragmented
// records), and a sample of the other bits.
func TestBitFlipsMultiBlock(t *testing.T) {
	recs := paddedLog()
	data, _ := writeLog(t, recs, 0)
	// Find chunk header positions by walking the log.
	interesting := map[int]bool{}
	mark := func(pos int) {
		for p := max(0, pos-16); p < min(len(data), pos+HeaderSize+16); p++ {
			interesting[p] = true
		}
	}
	for blk := 0; blk < len(data); blk += BlockSize {
		mark(blk)
		pos := blk
		for pos+HeaderSize <= min(blk+BlockSize, len(data)) {
			mark(pos)
			pos += HeaderSize + int(binary.LittleEndian.Uint16(data[pos+4:pos+6]))
		}
		mark(pos)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var bits []int
	for i := 0; i < len(data)*8; i++ {
		if interesting[i/8] || rng.IntN(200) == 0 {
			bits = append(bits, i)
		}
	}
	corrupt, torn, intact := flipBits(t, recs, data, bits)
	if corrupt == 0 || intact == 0 {
		t.Fatalf("corrupt=%d torn=%d intact=%d", corrupt, torn, intact)
	}
	t.Logf("%d bits: corrupt=%d torn=%d intact=%d", len(bits), corrupt, torn, intact)
}

// TestTruncation truncates logs at every offset (or every offset near block
// boundaries).
func TestTruncation(t *testing.T) {
	recs := [][]byte{[]byte("a"), {}, makeRecord(1, 300), makeRecord(2, BlockSize-400), []byte("zz"),
		makeRecord(3, 1000), makeRecord(4, 5)}
	data, _ := writeLog(t, recs, 0)
	cuts := make([]int, len(data)+1)
	for i := range cuts {
		cuts[i] = i
	}
	checkTruncations(t, recs, cuts)

	// The three-block log with a padded trailer, cut near block boundaries.
	recs = paddedLog()
	data, _ = writeLog(t, recs, 0)
	cuts = cuts[:0]
	for blk := 0; blk <= len(data)+BlockSize; blk += BlockSize {
		for c := max(0, blk-40); c <= min(len(data), blk+40); c++ {
			cuts = append(cuts, c)
		}
	}
	checkTruncations(t, recs, cuts)
}

// checkTruncations truncates the log of recs at each cut: the reader must
// return exactly the records that fit entirely before the cut, then io.EOF
// (cut at a record boundary) or ErrTornTail.
func checkTruncations(t *testing.T, recs [][]byte, cuts []int) {
	t.Helper()
	data, offs := writeLog(t, recs, 0)
	// ends[i] is the offset just past record i's last chunk.
	ends := make([]int64, len(recs))
	rd := NewReader(bytes.NewReader(data), "x")
	for i := range recs {
		if _, err := rd.Next(); err != nil {
			t.Fatal(err)
		}
		ends[i] = rd.ValidOffset()
	}
	for _, cut := range cuts {
		got, _, r, err := readAll(data[:cut])
		for j := range got {
			if !bytes.Equal(got[j], recs[j]) {
				t.Fatalf("cut %d: record %d wrong", cut, j)
			}
		}
		// Exactly the records whose last chunk ends at or before cut.
		want := 0
		for want < len(recs) && ends[want] <= int64(cut) {
			want++
		}
		if len(got) != want {
			t.Fatalf("cut %d: got %d records, want %d (err %v)", cut, len(got), want, err)
		}
		switch {
		case err == io.EOF:
			// Only at a record boundary (or inside the padding after one).
			if want < len(recs) && int64(cut) > offs[want] {
				t.Fatalf("cut %d: io.EOF inside record %d", cut, want)
			}
		case errors.Is(err, ErrTornTail):
			if want == len(recs) || int64(cut) <= offs[want] {
				t.Fatalf("cut %d: torn tail reported at a record boundary", cut)
			}
		default:
			t.Fatalf("cut %d: unexpected error %v", cut, err)
		}
		if r.ValidRecordFollows() {
			t.Fatalf("cut %d: ValidRecordFollows on a truncated log", cut)
		}
	}
}

func TestCorruptionKinds(t *testing.T) {
	data, offs := writeLog(t, [][]byte{[]byte("one"), makeRecord(1, BlockSize), []byte("three"), []byte("four")}, 0)
	cases := []struct {
		name    string
		mutate  func(d []byte)
		follows bool
	}{
		{"bad type", func(d []byte) { d[6] = 9 }, true},
		{"bad checksum", func(d []byte) { d[0] ^= 0xff }, true},
		{"length past block", func(d []byte) { binary.LittleEndian.PutUint16(d[4:6], 0xffff) }, true},
		{"middle without first", func(d []byte) {
			// Re-type the "one" chunk as Middle with a fresh checksum.
			d[6] = chunkMiddle
			binary.LittleEndian.PutUint32(d[0:4], chunkChecksum(chunkMiddle, d[HeaderSize:HeaderSize+3]))
		}, true},
		{"last chunk damaged", func(d []byte) { d[len(d)-1] ^= 1 }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := append([]byte(nil), data...)
			c.mutate(d)
			_, _, r, err := readAll(d)
			if !errors.Is(err, base.ErrCorruption) {
				t.Fatalf("want corruption, got %v", err)
			}
			if got := r.ValidRecordFollows(); got != c.follows {
				t.Fatalf("ValidRecordFollows = %v, want %v", got, c.follows)
			}
			if _, err2 := r.Next(); err2 != err {
				t.Fatalf("error not sticky: %v vs %v", err2, err)
			}
		})
	}
	_ = offs
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("disk full")
	}
	f.n--
	return len(p), nil
}

func TestWriterStickyError(t *testing.T) {
	w := NewWriter(&failWriter{n: 2})
	if _, err := w.WriteRecord(make([]byte, 2*BlockSize)); err != nil {
		t.Fatal("first block should succeed, error on the second:", err)
	}
	_ = w
	w = NewWriter(&failWriter{n: 0})
	w.WriteRecord([]byte("x"))
	if err := w.Flush(); err == nil {
		t.Fatal("want error")
	}
	if _, err := w.WriteRecord([]byte("y")); err == nil {
		t.Fatal("error not sticky")
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("io failure") }

func TestReaderIOError(t *testing.T) {
	r := NewReader(errReader{}, "x.log")
	_, err := r.Next()
	if err == nil || errors.Is(err, base.ErrCorruption) || errors.Is(err, ErrTornTail) || err == io.EOF {
		t.Fatalf("want plain I/O error, got %v", err)
	}
	if r.ValidRecordFollows() {
		t.Fatal("ValidRecordFollows after I/O error")
	}
}

func TestWriterAllocs(t *testing.T) {
	w := NewWriter(io.Discard)
	small := make([]byte, 100)
	big := make([]byte, 100000)
	allocs := testing.AllocsPerRun(200, func() {
		w.WriteRecord(small)
		w.WriteRecord(big)
		w.Flush()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
	}
}

// TestWriterBlockPool: a pooled Writer holds no block between a Flush and
// its next record, writes the same bytes as an unpooled one, and borrows
// without allocating once the pool has a block.
func TestWriterBlockPool(t *testing.T) {
	var pool BlockPool
	var pooled, plain bytes.Buffer
	pw, w := NewWriter(&pooled), NewWriter(&plain)
	pw.SetBlockPool(&pool)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 300; i++ {
		r := makeRecord(i, rng.IntN(3*BlockSize/2))
		for _, x := range []*Writer{pw, w} {
			if _, err := x.WriteRecord(r); err != nil {
				t.Fatal(err)
			}
		}
		if pw.block == nil {
			t.Fatal("no block while a record is unflushed")
		}
		if i%4 == 3 {
			if err := errors.Join(pw.Flush(), w.Flush()); err != nil {
				t.Fatal(err)
			}
			if pw.block != nil {
				t.Fatal("a pooled Writer kept its block after Flush")
			}
			// A pool's block comes back dirty: fill it with garbage.
			b := pool.get()
			for j := range b {
				b[j] = 0xee
			}
			pool.p.Put(b)
		}
	}
	if err := errors.Join(pw.Flush(), w.Flush()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pooled.Bytes(), plain.Bytes()) {
		t.Fatal("the pooled Writer wrote different bytes")
	}
	if err := pw.Flush(); err != nil || pw.Size() != int64(pooled.Len()) {
		t.Fatalf("idle Flush: %v, size %d of %d", err, pw.Size(), pooled.Len())
	}
	aw := NewWriter(io.Discard)
	aw.SetBlockPool(&pool)
	small := make([]byte, 100)
	allocs := testing.AllocsPerRun(200, func() {
		aw.WriteRecord(small)
		aw.Flush()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per record", allocs)
	}
}

func BenchmarkWriteRecord(b *testing.B) {
	for _, size := range []int{64, 4096, 1 << 20} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			w := NewWriter(io.Discard)
			p := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				w.WriteRecord(p)
			}
		})
	}
}
