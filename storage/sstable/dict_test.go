package sstable

import (
	"math/rand"
	"testing"
)

func TestZstdDict(t *testing.T) {
	kvs := randomKVs(rand.New(rand.NewSource(8)), 3000, 1)
	sizes := map[Compression]uint64{}
	for _, c := range []Compression{ZstdCompression, ZstdDictCompression} {
		opts := DefaultWriterOptions()
		opts.Compression = c
		opts.BlockSize = 1024
		data, md := build(t, opts, kvs, nil)
		sizes[c] = md.Properties.DataSize
		r := open(t, data, ReaderOptions{})
		l, err := r.Layout()
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, b := range l.Blocks {
			counts[b.Kind+"/"+b.Compression]++
		}
		t.Logf("%s: data size %d, blocks %v", c, md.Properties.DataSize, counts)
		if c == ZstdDictCompression && (counts["data/zstd-dict"] == 0 || counts["zstd-dict/none"] != 1) {
			t.Fatalf("no dictionary-compressed blocks: %v", counts)
		}
		exercise(t, rand.New(rand.NewSource(1)), r, kvs, nil, nil, 200)
	}
	if sizes[ZstdDictCompression] >= sizes[ZstdCompression] {
		t.Errorf("dictionary did not help: %v", sizes)
	}
	// A file too small for a dictionary falls back to plain zstd.
	opts := DefaultWriterOptions()
	opts.Compression = ZstdDictCompression
	data, md := build(t, opts, kvs[:20], nil)
	if md.Properties.NumDataBlocks != 1 {
		t.Fatal("expected one block")
	}
	exercise(t, rand.New(rand.NewSource(1)), open(t, data, ReaderOptions{}), kvs[:20], nil, nil, 100)
}
