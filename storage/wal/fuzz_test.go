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
			var err error
			for {
				var rec []byte
				rec, err = r.Next()
				if err != nil {
					break
				}
				got = append(got, append([]byte{}, rec...))
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
			_ = r.ValidRecordFollows()
		}
	})
}
