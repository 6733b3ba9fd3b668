package sstable

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

func benchKVs(n int) []kv {
	rng := rand.New(rand.NewSource(1))
	kvs := make([]kv, n)
	for i := range kvs {
		v := make([]byte, 100)
		for j := range v {
			v[j] = byte('a' + rng.Intn(8))
		}
		kvs[i] = kv{base.MakeInternalKey([]byte(fmt.Sprintf("user/%010d", i)), base.SeqNum(i+1), base.KindSet), v}
	}
	return kvs
}

func BenchmarkWriterAdd(b *testing.B) {
	kvs := benchKVs(100000)
	for _, c := range allCompressions {
		b.Run(c.String(), func(b *testing.B) {
			opts := DefaultWriterOptions()
			opts.Compression = c
			b.SetBytes(int64(len(kvs[0].key.UserKey) + 8 + len(kvs[0].val)))
			b.ReportAllocs()
			var w *Writer
			for i := 0; i < b.N; i++ {
				j := i % len(kvs)
				if j == 0 {
					if w != nil {
						if _, err := w.Finish(); err != nil {
							b.Fatal(err)
						}
					}
					w = NewWriter(&memFile{}, opts)
				}
				if err := w.Add(kvs[j].key, kvs[j].val); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := w.Finish(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func benchReader(b *testing.B, c Compression, cache bool) (*Reader, []kv) {
	kvs := benchKVs(100000)
	opts := DefaultWriterOptions()
	opts.Compression = c
	data, _ := build(b, opts, kvs, nil)
	ro := ReaderOptions{FileName: "bench.sst"}
	if cache {
		ro.Cache = newTestCache()
	}
	r, err := NewReader(bytes.NewReader(data), int64(len(data)), ro)
	if err != nil {
		b.Fatal(err)
	}
	return r, kvs
}

func BenchmarkIterNext(b *testing.B) {
	for _, c := range []Compression{NoCompression, SnappyCompression, ZstdCompression} {
		for _, cache := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/cache=%t", c, cache), func(b *testing.B) {
				r, _ := benchReader(b, c, cache)
				it, _ := r.NewIter(nil, nil)
				b.ReportAllocs()
				b.ResetTimer()
				ok := false
				for i := 0; i < b.N; i++ {
					if !ok {
						ok = it.First()
					} else {
						ok = it.Next()
					}
				}
			})
		}
	}
}

func BenchmarkIterPrev(b *testing.B) {
	r, _ := benchReader(b, SnappyCompression, true)
	it, _ := r.NewIter(nil, nil)
	b.ReportAllocs()
	b.ResetTimer()
	ok := false
	for i := 0; i < b.N; i++ {
		if !ok {
			ok = it.Last()
		} else {
			ok = it.Prev()
		}
	}
}

func BenchmarkSeekGE(b *testing.B) {
	for _, cache := range []bool{false, true} {
		b.Run(fmt.Sprintf("cache=%t", cache), func(b *testing.B) {
			r, kvs := benchReader(b, SnappyCompression, cache)
			it, _ := r.NewIter(nil, nil)
			rng := rand.New(rand.NewSource(2))
			keys := make([][]byte, 1024)
			for i := range keys {
				keys[i] = kvs[rng.Intn(len(kvs))].key.UserKey
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if !it.SeekGE(keys[i&1023]) {
					b.Fatal("not found")
				}
			}
		})
	}
}

func TestIterZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	kvs := benchKVs(20000)
	for _, c := range []Compression{NoCompression, SnappyCompression, ZstdCompression} {
		opts := DefaultWriterOptions()
		opts.Compression = c
		data, _ := build(t, opts, kvs, nil)
		r := open(t, data, ReaderOptions{})
		it, _ := r.NewIter(nil, nil)
		// Warm up buffers with a full pass each way.
		for ok := it.First(); ok; ok = it.Next() {
		}
		for ok := it.Last(); ok; ok = it.Prev() {
		}
		it.First()
		if n := testing.AllocsPerRun(5000, func() {
			if !it.Next() {
				it.First()
			}
		}); n != 0 {
			t.Errorf("%s: %v allocs per Next", c, n)
		}
		it.Last()
		if n := testing.AllocsPerRun(5000, func() {
			if !it.Prev() {
				it.Last()
			}
		}); n != 0 {
			t.Errorf("%s: %v allocs per Prev", c, n)
		}
		if n := testing.AllocsPerRun(1000, func() {
			it.SeekGE(kvs[12345].key.UserKey)
			it.SeekLT(kvs[345].key.UserKey)
		}); n != 0 {
			t.Errorf("%s: %v allocs per seek", c, n)
		}
	}
}
