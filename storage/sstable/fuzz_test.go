package sstable

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

func FuzzBlockDecode(f *testing.F) {
	rng := rand.New(rand.NewSource(1))
	for _, ri := range []int{1, 3, 16} {
		var bw blockWriter
		bw.restartInterval = ri
		for _, e := range randomKVs(rng, 20, 2) {
			bw.add(e.key.AppendEncoded(nil), e.val)
		}
		f.Add(append([]byte{}, bw.finish()...))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var b blockIter
		if err := b.init(data); err != nil {
			return
		}
		const maxSteps = 1 << 16
		var keys [][]byte
		n := 0
		for ok := b.first(); ok && n < maxSteps; ok = b.nextEntry() {
			if n < 8 {
				keys = append(keys, append([]byte{}, b.key...))
			}
			n++
		}
		n = 0
		for ok := b.last(); ok && n < maxSteps; ok = b.prevEntry() {
			n++
		}
		keys = append(keys, []byte("k"), nil, bytes.Repeat([]byte{0xff}, 9))
		for _, k := range keys {
			ik, ok := base.DecodeInternalKey(k)
			if !ok {
				ik = base.MakeSearchKey(k)
			}
			if b.seekGE(ik) {
				b.prevEntry()
				b.nextEntry()
			}
			if b.seekLT(ik) {
				b.nextEntry()
				b.prevEntry()
				b.prevEntry()
			}
		}
		if props, err := decodeProperties(data); err == nil {
			_ = props.String()
		}
	})
}

func fuzzSeedFiles(f *testing.F) {
	rng := rand.New(rand.NewSource(2))
	for _, c := range allCompressions {
		opts := DefaultWriterOptions()
		opts.Compression = c
		opts.BlockSize = 128
		opts.PrefixExtractor = prefix5
		kvs := randomKVs(rng, 10, 2)
		for i := range kvs {
			if len(kvs[i].val) > 40 {
				kvs[i].val = kvs[i].val[:40]
			}
		}
		data, _ := build(f, opts, kvs, []RangeDel{{[]byte("a"), []byte("b"), 3}})
		f.Add(data)
	}
}

func FuzzReader(f *testing.F) {
	fuzzSeedFiles(f)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, skip := range []bool{false, true} {
			r, err := NewReader(bytes.NewReader(data), int64(len(data)), ReaderOptions{
				FileName: "fuzz.sst", skipChecksums: skip, Cache: newTestCache(), maxBlockLen: 1 << 20,
			})
			if err != nil {
				continue
			}
			const maxSteps = 1 << 14
			it, _ := r.NewIter(nil, nil)
			n := 0
			for ok := it.First(); ok && n < maxSteps; ok = it.Next() {
				n++
			}
			n = 0
			for ok := it.Last(); ok && n < maxSteps; ok = it.Prev() {
				n++
			}
			for _, k := range [][]byte{nil, []byte("a"), []byte("key"), {0xff, 0xff}} {
				if it.SeekGE(k) {
					it.Prev()
				}
				if it.SeekLT(k) {
					it.Next()
				}
				r.MayContain(k)
				r.MayContainPrefix(k)
				r.ApproximateOffset(k)
			}
			_ = it.Close()
			it2, _ := r.NewIter([]byte("b"), []byte("m"))
			for ok := it2.Last(); ok && n < maxSteps; ok = it2.Prev() {
				n++
			}
			_ = it2.Close()
			_, _ = r.RangeDels()
			_, _ = r.Layout()
			_ = r.Properties().String()
			_ = r.Close()
		}
	})
}
