package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/manifest"
	"github.com/shale-db/shale/storage/vfs"
	"github.com/shale-db/shale/storage/wal"
)

// fuzzRecord is one decoded batch record.
type fuzzRecord struct {
	kind       Kind
	key, value []byte
}

// fuzzBatchRecords returns the records of b, and the reader's error.
func fuzzBatchRecords(b *Batch) ([]fuzzRecord, error) {
	var out []fuzzRecord
	r := b.Reader()
	for {
		kind, k, v, ok := r.Next()
		if !ok {
			return out, r.Err()
		}
		out = append(out, fuzzRecord{kind, bytes.Clone(k), bytes.Clone(v)})
	}
}

// fuzzBatchSeeds returns encodings of batches of every record kind.
func fuzzBatchSeeds() [][]byte {
	var seeds [][]byte
	add := func(seq SeqNum, f func(b *Batch)) {
		b := NewBatch()
		f(b)
		b.setSeqNum(seq)
		seeds = append(seeds, bytes.Clone(b.Repr()))
	}
	add(0, func(b *Batch) {})
	add(1, func(b *Batch) { b.Set([]byte("a"), []byte("1")) })
	add(7, func(b *Batch) {
		b.Set([]byte("k1"), []byte("v1"))
		b.Delete([]byte("k2"))
		b.Merge([]byte("k3"), []byte("m"))
		b.DeleteRange([]byte("a"), []byte("c"))
		b.LogData([]byte("blob"))
		b.Set(nil, nil)
	})
	add(1<<40, func(b *Batch) { b.LogData(nil) })
	add(base.MaxSeqNum-1, func(b *Batch) { b.Set(bytes.Repeat([]byte("k"), 200), bytes.Repeat([]byte("v"), 300)) })
	add(3, func(b *Batch) { b.DeleteRange([]byte("z"), []byte("a")) }) // inverted: b.err, still encodable
	return seeds
}

// FuzzBatchDecode feeds arbitrary bytes to the batch decoder (what recovery
// applies to every WAL record). It must not panic; a batch it accepts must
// read back consistently, survive re-encoding record by record, and be
// independent of the caller's buffer.
func FuzzBatchDecode(f *testing.F) {
	for _, s := range fuzzBatchSeeds() {
		f.Add(s)
		if len(s) > batchHeaderLen+2 {
			f.Add(s[:len(s)-2])
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, batchHeaderLen))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		var b Batch
		err := b.SetRepr(data)
		if !bytes.Equal(data, orig) {
			t.Fatal("SetRepr modified its input")
		}
		if err != nil {
			if len(data) >= batchHeaderLen {
				// The raw reader must stop with an error or on a count
				// mismatch, without panicking.
				raw := &Batch{data: bytes.Clone(data)}
				recs, rerr := fuzzBatchRecords(raw)
				if rerr == nil && uint32(countSeq(recs)) == binary.LittleEndian.Uint32(data[8:]) {
					t.Fatalf("SetRepr rejected a batch the reader accepts: %v", err)
				}
			}
			return
		}
		if len(data) < batchHeaderLen {
			t.Fatalf("accepted a %d-byte batch", len(data))
		}
		recs, rerr := fuzzBatchRecords(&b)
		if rerr != nil {
			t.Fatalf("accepted batch fails to read: %v", rerr)
		}
		if got, want := b.Count(), binary.LittleEndian.Uint32(data[8:]); got != want || got != uint32(countSeq(recs)) {
			t.Fatalf("Count %d, header %d, records consuming sequence numbers %d", got, want, countSeq(recs))
		}
		if b.SeqNum() != SeqNum(binary.LittleEndian.Uint64(data)) {
			t.Fatalf("SeqNum %d, header %d", b.SeqNum(), binary.LittleEndian.Uint64(data))
		}
		if b.Empty() != (len(recs) == 0) {
			t.Fatalf("Empty() = %v with %d records", b.Empty(), len(recs))
		}
		// The batch owns its bytes.
		for i := range data {
			data[i] ^= 0xff
		}
		again, _ := fuzzBatchRecords(&b)
		copy(data, orig)
		if fmt.Sprint(again) != fmt.Sprint(recs) {
			t.Fatal("the batch aliases the buffer given to SetRepr")
		}

		// Rebuild with the public methods: the same records, and the
		// canonical encoding decodes to them again.
		nb := NewBatch()
		hasRangeDel := false
		for _, r := range recs {
			switch r.kind {
			case KindSet:
				nb.Set(r.key, r.value)
			case KindDelete:
				nb.Delete(r.key)
			case KindMerge:
				nb.Merge(r.key, r.value)
			case KindRangeDelete:
				hasRangeDel = true
				nb.DeleteRange(r.key, r.value)
			case KindLogData:
				nb.LogData(r.key)
			default:
				t.Fatalf("decoded unknown kind %d", r.kind)
			}
		}
		nb.setSeqNum(b.SeqNum())
		if b.hasRangeDel != hasRangeDel || b.memBytes != nb.memBytes || b.Count() != nb.Count() {
			t.Fatalf("decoded batch state (rangedel %v, mem %d, count %d) differs from the rebuilt one (%v, %d, %d)",
				b.hasRangeDel, b.memBytes, b.Count(), hasRangeDel, nb.memBytes, nb.Count())
		}
		var rt Batch
		if err := rt.SetRepr(nb.Repr()); err != nil {
			t.Fatalf("re-encoded batch rejected: %v", err)
		}
		rrecs, _ := fuzzBatchRecords(&rt)
		if fmt.Sprint(rrecs) != fmt.Sprint(recs) || rt.SeqNum() != b.SeqNum() {
			t.Fatal("re-encoded batch decodes differently")
		}
		if len(nb.Repr()) > len(data) {
			t.Fatalf("canonical encoding (%d bytes) longer than the input (%d)", len(nb.Repr()), len(data))
		}
	})
}

// countSeq returns how many records consume a sequence number.
func countSeq(recs []fuzzRecord) int {
	n := 0
	for _, r := range recs {
		if r.kind != KindLogData {
			n++
		}
	}
	return n
}

// fuzzWALOf frames batch encodings as a WAL file.
func fuzzWALOf(batches ...[]byte) []byte {
	var buf bytes.Buffer
	w := wal.NewWriter(&buf)
	for _, b := range batches {
		if _, err := w.WriteRecord(b); err != nil {
			panic(err)
		}
	}
	if err := w.Flush(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// fuzzFixChunkChecksums rewrites the checksum of every chunk reachable by
// walking each WAL block from its start (CRC-32C of the type byte and the
// payload, masked as the wal package documents).
func fuzzFixChunkChecksums(data []byte) {
	for blk := 0; blk < len(data); blk += wal.BlockSize {
		b := data[blk:min(len(data), blk+wal.BlockSize)]
		for pos := 0; len(b)-pos >= wal.HeaderSize; {
			n := int(binary.LittleEndian.Uint16(b[pos+4:]))
			typ := b[pos+6]
			end := pos + wal.HeaderSize + n
			if typ < 1 || typ > 4 || end > len(b) {
				break
			}
			c := crc32.Update(crc32.Checksum([]byte{typ}, crc32c), crc32c, b[pos+wal.HeaderSize:end])
			binary.LittleEndian.PutUint32(b[pos:], (c>>15|c<<17)+0xa282ead8)
			pos = end
		}
	}
}

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// fuzzEmptyDB returns an empty database as a crash leaves it (so its WAL
// was not closed cleanly and may have any contents), and the name of its
// live WAL.
func fuzzEmptyDB(f *testing.F) (*vfs.MemFS, string) {
	live := vfs.NewCrashableMem()
	d, err := Open("db", ioeOpts(live))
	if err != nil {
		f.Fatal(err)
	}
	mem := live.CrashClone()
	if err := d.Close(); err != nil {
		f.Fatal(err)
	}
	names, err := mem.List("db")
	if err != nil {
		f.Fatal(err)
	}
	var logs []string
	for _, n := range names {
		if ft, _, ok := manifest.ParseFilename(n); ok && ft == manifest.FileTypeLog {
			logs = append(logs, n)
		}
	}
	if len(logs) != 1 {
		f.Fatalf("empty database has WALs %v", logs)
	}
	return mem, logs[0]
}

// fuzzExpect returns the database state after the WAL's records, when it can
// be predicted: every record is a valid batch, sequence numbers are
// positive, increasing and far from overflow, and ranges are well formed.
func fuzzExpect(data []byte) (oracle, bool) {
	r := wal.NewReader(bytes.NewReader(data), "fuzz")
	o := oracle{}
	next := SeqNum(1)
	for {
		rec, err := r.Next()
		if err == io.EOF && !r.ValidRecordFollows() {
			return o, true
		}
		if err != nil {
			return nil, false
		}
		var b Batch
		if b.SetRepr(rec) != nil || b.SeqNum() < next || b.SeqNum() > 1<<50 {
			return nil, false
		}
		recs, _ := fuzzBatchRecords(&b)
		for _, rc := range recs {
			if rc.kind == KindRangeDelete && bytes.Compare(rc.key, rc.value) >= 0 {
				return nil, false
			}
		}
		next = b.SeqNum() + SeqNum(max(b.Count(), 1))
		o.apply(&b)
	}
}

// FuzzDBRecoverWAL puts arbitrary bytes in the WAL of an empty database and
// opens it. Open must not panic: it returns an error or a database whose
// contents can be read and survive a second reopen unchanged. A WAL of valid
// batches recovers exactly their writes.
func FuzzDBRecoverWAL(f *testing.F) {
	template, logName := fuzzEmptyDB(f)
	seeds := fuzzBatchSeeds()
	f.Add(fuzzWALOf(seeds[1]), true)
	f.Add(fuzzWALOf(seeds[1], seeds[2]), true)
	f.Add(fuzzWALOf(seeds...), true)
	f.Add(fuzzWALOf(seeds[2], bytes.Repeat([]byte{0}, 1000)), true)
	f.Add(fuzzWALOf(bytes.Repeat([]byte("x"), 33000)), true)
	f.Add([]byte{}, true)
	f.Add([]byte("garbage that is no WAL at all"), false)
	f.Add(fuzzWALOf(seeds[5], seeds[1]), true) // an inverted range deletion
	big := NewBatch()
	for i := 0; i < 40; i++ {
		big.Set([]byte(fmt.Sprintf("key%03d", i)), bytes.Repeat([]byte{byte(i)}, 500))
	}
	big.setSeqNum(10)
	f.Add(fuzzWALOf(big.Repr()), true)
	f.Fuzz(func(t *testing.T, data []byte, fix bool) {
		if fix {
			// Valid chunks around fuzzed payloads: explores what recovery
			// does with the batches rather than the WAL framing.
			data = bytes.Clone(data)
			fuzzFixChunkChecksums(data)
		}
		recoverWALOne(t, template, logName, data)
	})
}

// recoverWALOne is one FuzzDBRecoverWAL case: data as the live WAL of a
// copy of template.
func recoverWALOne(t *testing.T, template *vfs.MemFS, logName string, data []byte) {
	fs := corClone(t, template)
	corWriteFile(t, fs, fs.Join("db", logName), data)
	want, predictable := fuzzExpect(data)
	d, err := Open("db", ioeOpts(fs))
	if err != nil {
		if predictable {
			t.Fatalf("open failed on a valid WAL: %v", err)
		}
		return
	}
	got, err := ioeDump(d)
	_ = d.Close()
	if err != nil {
		t.Fatalf("read after a successful recovery: %v", err)
	}
	if predictable && !maps.Equal(got, map[string]string(want)) {
		t.Fatalf("recovered %s", ioeDiff(got, want))
	}
	// Recovery flushed what it replayed: a second open reads the same.
	d, err = Open("db", ioeOpts(fs))
	if err != nil {
		t.Fatalf("second open after a successful recovery: %v", err)
	}
	again, err := ioeDump(d)
	_ = d.Close()
	if err != nil {
		t.Fatalf("read after second open: %v", err)
	}
	if !maps.Equal(again, got) {
		t.Fatalf("second open reads differently: %s", ioeDiff(again, got))
	}
}
