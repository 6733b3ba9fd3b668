package sstable

import (
	"bytes"
	"fmt"
	"math/rand"
	"sort"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// memFile is a WritableFile backed by memory.
type memFile struct {
	bytes.Buffer
	synced, closed bool
}

func (f *memFile) Sync() error  { f.synced = true; return nil }
func (f *memFile) Close() error { f.closed = true; return nil }

type kv struct {
	key base.InternalKey
	val []byte
}

// build writes kvs (sorted) and rangeDels and returns the file bytes.
func build(t testing.TB, opts WriterOptions, kvs []kv, rds []RangeDel) ([]byte, WriterMetadata) {
	t.Helper()
	f := &memFile{}
	w := NewWriter(f, opts)
	for _, e := range kvs {
		if err := w.Add(e.key, e.val); err != nil {
			t.Fatalf("Add(%s): %v", e.key, err)
		}
	}
	for _, rd := range rds {
		if err := w.AddRangeDel(rd.Start, rd.End, rd.Seq); err != nil {
			t.Fatal(err)
		}
	}
	md, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if !f.synced || !f.closed {
		t.Fatal("file not synced and closed")
	}
	if md.Size != uint64(f.Len()) {
		t.Fatalf("metadata size %d, file size %d", md.Size, f.Len())
	}
	return f.Bytes(), md
}

func open(t testing.TB, data []byte, opts ReaderOptions) *Reader {
	t.Helper()
	if opts.FileName == "" {
		opts.FileName = "test.sst"
	}
	r, err := NewReader(bytes.NewReader(data), int64(len(data)), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// randomKVs returns sorted entries: nKeys user keys with 1..maxVersions
// versions each.
func randomKVs(rng *rand.Rand, nKeys, maxVersions int) []kv {
	seen := map[string]bool{}
	var out []kv
	seq := base.SeqNum(1)
	for len(seen) < nKeys {
		var k []byte
		switch rng.Intn(3) {
		case 0:
			k = []byte(fmt.Sprintf("key%06d", rng.Intn(nKeys*10)))
		case 1:
			k = []byte(fmt.Sprintf("key%06d/%s", rng.Intn(nKeys*10), bytes.Repeat([]byte{'x'}, rng.Intn(20))))
		default:
			k = make([]byte, rng.Intn(12))
			rng.Read(k)
		}
		if seen[string(k)] {
			continue
		}
		seen[string(k)] = true
		nv := 1 + rng.Intn(maxVersions)
		for v := 0; v < nv; v++ {
			kind := []base.Kind{base.KindSet, base.KindSet, base.KindDelete, base.KindMerge}[rng.Intn(4)]
			var val []byte
			if kind != base.KindDelete {
				val = make([]byte, rng.Intn(64))
				for i := range val {
					val[i] = byte('a' + rng.Intn(4)) // compressible
				}
				if rng.Intn(20) == 0 {
					val = make([]byte, 3000)
					rng.Read(val)
				}
			}
			out = append(out, kv{base.MakeInternalKey(k, seq, kind), val})
			seq++
		}
	}
	sort.Slice(out, func(i, j int) bool { return base.CompareInternal(out[i].key, out[j].key) < 0 })
	return out
}
