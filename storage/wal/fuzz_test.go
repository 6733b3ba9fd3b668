package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/shale-db/shale/storage/internal/base"
)

// Outcomes of reading a log to its end.
const (
	endEOF     = "eof"
	endTorn    = "torn"
	endCorrupt = "corrupt"
)

// refRead is a deliberately simple, non-streaming reading of the format in
// the package documentation, used as an oracle. Every record it returns is
// made of chunks whose checksums it verified itself.
func refRead(data []byte) (recs [][]byte, end string) {
	var rec []byte
	inRec := false
	for blk := 0; ; blk += BlockSize {
		b := data[blk:min(len(data), blk+BlockSize)]
		final := len(b) < BlockSize
		pos := 0
		for {
			if len(b)-pos < HeaderSize {
				if !final {
					break // padding
				}
				if inRec || !allZero(b[pos:]) {
					return recs, endTorn
				}
				return recs, endEOF
			}
			h := b[pos : pos+HeaderSize]
			sum := binary.LittleEndian.Uint32(h)
			n := int(binary.LittleEndian.Uint16(h[4:]))
			typ := h[6]
			if allZero(h) {
				if inRec {
					return recs, endTorn
				}
				return recs, endEOF
			}
			if typ < 1 || typ > 4 {
				return recs, endCorrupt
			}
			if pos+HeaderSize+n > len(b) {
				if final && pos+HeaderSize+n <= BlockSize {
					return recs, endTorn
				}
				return recs, endCorrupt
			}
			p := b[pos+HeaderSize : pos+HeaderSize+n]
			if chunkChecksum(typ, p) != sum {
				return recs, endCorrupt
			}
			pos += HeaderSize + n
			switch typ {
			case chunkFull:
				if inRec {
					return recs, endCorrupt
				}
				recs = append(recs, append([]byte{}, p...))
			case chunkFirst:
				if inRec {
					return recs, endCorrupt
				}
				inRec, rec = true, append([]byte{}, p...)
			case chunkMiddle, chunkLast:
				if !inRec {
					return recs, endCorrupt
				}
				rec = append(rec, p...)
				if typ == chunkLast {
					recs = append(recs, rec)
					inRec, rec = false, nil
				}
			}
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// fixChecksums rewrites the checksum of every chunk reachable by walking
// each block from its start, so that fuzzing can explore lengths, types and
// sequences without being stopped by checksums.
func fixChecksums(data []byte) {
	for blk := 0; blk < len(data); blk += BlockSize {
		b := data[blk:min(len(data), blk+BlockSize)]
		for pos := 0; len(b)-pos >= HeaderSize; {
			n := int(binary.LittleEndian.Uint16(b[pos+4:]))
			typ := b[pos+6]
			if typ < 1 || typ > 4 || pos+HeaderSize+n > len(b) {
				break
			}
			binary.LittleEndian.PutUint32(b[pos:], chunkChecksum(typ, b[pos+HeaderSize:pos+HeaderSize+n]))
			pos += HeaderSize + n
		}
	}
}

func classify(t *testing.T, err error) string {
	switch {
	case err == io.EOF:
		return endEOF
	case errors.Is(err, ErrTornTail):
		return endTorn
	case errors.Is(err, base.ErrCorruption):
		var ce *base.CorruptionError
		if !errors.As(err, &ce) || ce.File != "fuzz.log" || ce.Offset < 0 {
			t.Fatalf("corruption error without file/offset: %v", err)
		}
		return endCorrupt
	}
	t.Fatalf("unexpected error %v", err)
	return ""
}

func FuzzReader(f *testing.F) {
	seeds := [][][]byte{
		{},
		{{}},
		{[]byte("a"), []byte("bc"), {}},
		{makeRecord(1, BlockSize+5), []byte("x")},
		{makeRecord(1, BlockSize-2*HeaderSize), []byte("abc")},
		{makeRecord(1, BlockSize-HeaderSize-3), []byte("after padding")},
		{makeRecord(1, BlockSize-HeaderSize), []byte("at a block start"), makeRecord(2, 2*BlockSize)},
	}
	for _, recs := range seeds {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		for _, r := range recs {
			w.WriteRecord(r)
		}
		w.Flush()
		f.Add(buf.Bytes(), false)
		if buf.Len() > 10 {
			f.Add(buf.Bytes()[:buf.Len()-3], false)
		}
	}
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, true)
	f.Add(make([]byte, 20), false)

	f.Fuzz(func(t *testing.T, data []byte, fix bool) {
		if fix {
			data = append([]byte(nil), data...)
			fixChecksums(data)
		}
		wantRecs, wantEnd := refRead(data)
		for _, oneByte := range []bool{false, true} {
			var src io.Reader = bytes.NewReader(data)
			if oneByte {
				src = iotest.OneByteReader(src)
			}
			r := NewReader(src, "fuzz.log")
			var got [][]byte
			bounds := []int64{0} // ValidOffset before and after each record
			var err error
			for {
				var rec []byte
				rec, err = r.Next()
				if err != nil {
					break
				}
				got = append(got, append([]byte{}, rec...))
				bounds = append(bounds, r.ValidOffset())
			}
			end := classify(t, err)
			if end != wantEnd {
				t.Fatalf("reader ended with %v, oracle with %s", err, wantEnd)
			}
			if len(got) != len(wantRecs) {
				t.Fatalf("reader returned %d records, oracle %d", len(got), len(wantRecs))
			}
			for i := range got {
				if !bytes.Equal(got[i], wantRecs[i]) {
					t.Fatalf("record %d differs from the oracle's", i)
				}
			}
			if r.ValidOffset() > int64(len(data)) {
				t.Fatalf("ValidOffset %d beyond %d bytes", r.ValidOffset(), len(data))
			}
			follows := r.ValidRecordFollows()

			// A Reader continued at a record boundary returns the rest of
			// the records and ends exactly like the one that read it all.
			for _, k := range sampleIndexes(len(bounds), 6) {
				checkReaderAt(t, data, bounds[k], oneByte, got[k:], err, follows)
			}
		}
	})
}

// sampleIndexes returns up to max indexes spread over [0, n), always
// including the first and the last.
func sampleIndexes(n, max int) []int {
	if n <= max {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	out := make([]int, 0, max)
	for i := 0; i < max; i++ {
		out = append(out, i*(n-1)/(max-1))
	}
	return out
}

// checkReaderAt reads data with NewReaderAt from the record boundary off and
// checks that it yields want and then fails with wantErr (same message),
// and that ValidRecordFollows then answers wantFollows.
func checkReaderAt(t *testing.T, data []byte, off int64, oneByte bool, want [][]byte, wantErr error, wantFollows bool) {
	t.Helper()
	bs := off - off%BlockSize
	var src io.Reader = bytes.NewReader(data[min(bs, int64(len(data))):])
	if oneByte {
		src = iotest.OneByteReader(src)
	}
	r := NewReaderAt(src, "fuzz.log", off)
	if r.ValidOffset() != off {
		t.Fatalf("NewReaderAt(%d): ValidOffset %d before reading", off, r.ValidOffset())
	}
	var n int
	for {
		rec, err := r.Next()
		if err != nil {
			if err != wantErr && (wantErr == nil || err.Error() != wantErr.Error()) {
				t.Fatalf("NewReaderAt(%d): ended with %v, the reader from 0 with %v", off, err, wantErr)
			}
			break
		}
		if n >= len(want) {
			t.Fatalf("NewReaderAt(%d): more than the %d records after the offset", off, len(want))
		}
		if !bytes.Equal(rec, want[n]) {
			t.Fatalf("NewReaderAt(%d): record %d differs", off, n)
		}
		n++
	}
	if n != len(want) {
		t.Fatalf("NewReaderAt(%d): %d records, want %d", off, n, len(want))
	}
	if f := r.ValidRecordFollows(); f != wantFollows {
		t.Fatalf("NewReaderAt(%d): ValidRecordFollows %v, the reader from 0 said %v", off, f, wantFollows)
	}
}
