package wal

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// readerAtLog returns records of many sizes, chosen with a reference writer
// so that records end exactly at a block end, and leave every room from 1
// to HeaderSize+1 bytes in their block, several times each; others span
// one or more blocks.
func readerAtLog(rng *rand.Rand, n int) [][]byte {
	var recs [][]byte
	ref := NewWriter(io.Discard)
	for i := 0; i < n; i++ {
		var size int
		switch q := rng.IntN(10); {
		case q < 3:
			// End the record with room r left in its block (0 = exactly
			// at the block end).
			r := i % (HeaderSize + 2)
			room := BlockSize - int(ref.Size()%BlockSize)
			if room < HeaderSize {
				room += BlockSize // the record starts in the next block
			}
			size = room - HeaderSize - r
			if size < 0 {
				size = 0
			}
			if rng.IntN(3) == 0 {
				// The same room, after spanning a further block.
				size += BlockSize - HeaderSize
			}
		case q < 5:
			size = rng.IntN(3 * BlockSize)
		case q < 6:
			size = 0
		default:
			size = rng.IntN(300)
		}
		recs = append(recs, makeRecord(i, size))
		if _, err := ref.WriteRecord(recs[i]); err != nil {
			panic(err) // io.Discard does not fail
		}
	}
	return recs
}

// readFrom reads data with NewReaderAt at off until an error and returns
// the records, the LastRecordOffset and ValidOffset after each, and the
// error.
func readFrom(data []byte, off int64) (recs [][]byte, starts, ends []int64, err error) {
	bs := min(off-off%BlockSize, int64(len(data)))
	r := NewReaderAt(bytes.NewReader(data[bs:]), "test.log", off)
	for {
		rec, err := r.Next()
		if err != nil {
			return recs, starts, ends, err
		}
		recs = append(recs, append([]byte(nil), rec...))
		starts = append(starts, r.LastRecordOffset())
		ends = append(ends, r.ValidOffset())
	}
}

// TestReaderAtEveryOffset: from every record boundary (every ValidOffset of
// a reader from the start), NewReaderAt returns the rest of the records with
// the same offsets, whatever room the boundary leaves in its block.
func TestReaderAtEveryOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	recs := readerAtLog(rng, 400)
	data, _ := writeLog(t, recs, 5)

	all, starts, ends, err := readFrom(data, 0)
	if err != io.EOF {
		t.Fatalf("reading from 0: %v, want io.EOF", err)
	}
	checkRecords(t, all, recs)

	rooms := map[int]int{} // room left in the block at a boundary -> count
	bounds := append([]int64{0}, ends...)
	for k, off := range bounds {
		rooms[BlockSize-int(off%BlockSize)]++
		got, gotStarts, gotEnds, err := readFrom(data, off)
		if err != io.EOF {
			t.Fatalf("from boundary %d (offset %d): %v, want io.EOF", k, off, err)
		}
		if len(got) != len(recs)-k {
			t.Fatalf("from boundary %d (offset %d): %d records, want %d", k, off, len(got), len(recs)-k)
		}
		for i := range got {
			if !bytes.Equal(got[i], recs[k+i]) {
				t.Fatalf("from boundary %d (offset %d): record %d differs", k, off, k+i)
			}
			if gotStarts[i] != starts[k+i] || gotEnds[i] != ends[k+i] {
				t.Fatalf("from boundary %d: record %d at [%d, %d), the reader from 0 says [%d, %d)",
					k, k+i, gotStarts[i], gotEnds[i], starts[k+i], ends[k+i])
			}
		}
	}
	// The boundaries covered block ends and every trailer size.
	for room := 1; room <= HeaderSize; room++ {
		if rooms[room] == 0 {
			t.Errorf("no boundary leaves %d bytes in its block", room)
		}
	}
	if rooms[BlockSize] < 3 {
		t.Errorf("only %d boundaries at a block start", rooms[BlockSize])
	}
}

// TestReaderAtContinuesAppendedLog: a reader that hit the end of a log that
// is still being written is replaced by NewReaderAt at its ValidOffset once
// more has been appended, and returns exactly the new records. The log is
// seen both at the Writer's flushes (which end it at record boundaries,
// possibly without the trailer of a block) and cut at arbitrary bytes
// (which end it inside a record: ErrTornTail, after which the next reader
// returns that record whole).
func TestReaderAtContinuesAppendedLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	recs := readerAtLog(rng, 600)

	t.Run("flushes", func(t *testing.T) {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		var off int64
		next := 0 // index of the next record the tailer expects
		for i := 0; i < len(recs); {
			// Append a few records, then let the tailer catch up.
			for n := 1 + rng.IntN(5); n > 0 && i < len(recs); n-- {
				if _, err := w.WriteRecord(recs[i]); err != nil {
					t.Fatal(err)
				}
				i++
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			got, _, ends, err := readFrom(buf.Bytes(), off)
			if err != io.EOF {
				t.Fatalf("continuing at %d after %d records: %v, want io.EOF", off, next, err)
			}
			checkRecords(t, got, recs[next:i])
			next = i
			if len(ends) > 0 {
				off = ends[len(ends)-1]
			}
		}
		if off != int64(buf.Len()) {
			t.Fatalf("final ValidOffset %d, log %d bytes", off, buf.Len())
		}
	})

	t.Run("cuts", func(t *testing.T) {
		data, _ := writeLog(t, recs, 0)
		var off int64
		next, torn := 0, 0
		for cut := 0; ; {
			got, _, ends, err := readFrom(data[:cut], off)
			switch {
			case err == io.EOF:
			case errors.Is(err, ErrTornTail):
				torn++
			default:
				t.Fatalf("reading [%d, %d): %v", off, cut, err)
			}
			if next+len(got) > len(recs) {
				t.Fatalf("reading [%d, %d): %d records, only %d left", off, cut, len(got), len(recs)-next)
			}
			checkRecords(t, got, recs[next:next+len(got)])
			next += len(got)
			if len(ends) > 0 {
				off = ends[len(ends)-1]
			}
			if cut == len(data) {
				break
			}
			cut = min(len(data), cut+1+rng.IntN(BlockSize/2))
		}
		if next != len(recs) {
			t.Fatalf("tailer saw %d records, want %d", next, len(recs))
		}
		if torn == 0 {
			t.Fatal("no cut fell inside a record")
		}
	})
}

// TestReaderAtBadOffset: an offset past the end of the log within its
// block, or a negative one, makes Next fail with an error matching
// io.ErrUnexpectedEOF (and ValidRecordFollows report false) rather than
// misbehave. A block-aligned offset past the end reads as an empty log.
func TestReaderAtBadOffset(t *testing.T) {
	recs := [][]byte{[]byte("a"), makeRecord(1, BlockSize+100), []byte("b")}
	data, _ := writeLog(t, recs, 0)
	for _, off := range []int64{int64(len(data)) + 1, int64(len(data)) + BlockSize, 2*BlockSize + 3, -1} {
		var src io.Reader = bytes.NewReader(nil)
		if bs := off - off%BlockSize; off >= 0 && bs < int64(len(data)) {
			src = bytes.NewReader(data[bs:])
		}
		r := NewReaderAt(src, "test.log", off)
		rec, err := r.Next()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("offset %d (log %d bytes): Next = %q, %v; want io.ErrUnexpectedEOF", off, len(data), rec, err)
		}
		if _, err2 := r.Next(); err2 != err {
			t.Fatalf("offset %d: error not sticky: %v then %v", off, err, err2)
		}
		if r.ValidRecordFollows() {
			t.Fatalf("offset %d: ValidRecordFollows after a bad start offset", off)
		}
	}
	// The end of the log itself is a boundary: nothing more, io.EOF. So is,
	// indistinguishably, a block start past it.
	for _, off := range []int64{int64(len(data)), 5 * BlockSize} {
		bs := min(off-off%BlockSize, int64(len(data)))
		r := NewReaderAt(bytes.NewReader(data[bs:]), "test.log", off)
		if rec, err := r.Next(); err != io.EOF {
			t.Fatalf("offset %d (log %d bytes): Next = %q, %v; want io.EOF", off, len(data), rec, err)
		}
		if r.ValidOffset() != off || r.LastRecordOffset() != -1 {
			t.Fatalf("offset %d: ValidOffset %d, LastRecordOffset %d", off, r.ValidOffset(), r.LastRecordOffset())
		}
	}
}
