package sstable

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// TestLookupMatchesIter checks Lookup against an iterator's SeekGE and
// Next over files of every compression, looked up in turn so that each
// Lookup reuses an iterator (and read buffers) another file's left: every
// walk sees the same entries, and stops where visit says.
func TestLookupMatchesIter(t *testing.T) {
	rng := rand.New(rand.NewSource(31))
	type file struct {
		r   *Reader
		kvs []kv
	}
	var files []file
	for i, c := range allCompressions {
		kvs := randomKVs(rng, 200+100*i, 3)
		opts := DefaultWriterOptions()
		opts.Compression = c
		opts.BlockSize = 256 << (i % 3)
		data, _ := build(t, opts, kvs, nil)
		files = append(files, file{open(t, data, ReaderOptions{}), kvs})
	}
	for step := range 5000 {
		f := files[rng.Intn(len(files))]
		var key []byte
		if rng.Intn(4) == 0 {
			key = fmt.Appendf(nil, "key%06d", rng.Intn(3000)) // often absent
		} else {
			key = f.kvs[rng.Intn(len(f.kvs))].key.UserKey
		}
		limit := 1 + rng.Intn(4)
		var got []string
		err := f.r.Lookup(key, false, func(k base.InternalKey, v []byte) bool {
			got = append(got, fmt.Sprintf("%s=%q", k, v))
			return len(got) < limit
		})
		if err != nil {
			t.Fatalf("step %d: Lookup(%q): %v", step, key, err)
		}
		var want []string
		it, _ := f.r.NewIter(nil, nil)
		for ok := it.SeekGE(key); ok && len(want) < limit; ok = it.Next() {
			want = append(want, fmt.Sprintf("%s=%q", it.Key(), it.Value()))
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("step %d: Lookup(%q) saw\n%v\nthe iterator\n%v", step, key, got, want)
		}
	}
}

// TestLookupErrors checks that Lookup reports a corrupt block and a
// cache-only read that needs the file, and that the iterator it reused
// serves the next Lookup correctly.
func TestLookupErrors(t *testing.T) {
	rng := rand.New(rand.NewSource(32))
	kvs := randomKVs(rng, 300, 1)
	opts := DefaultWriterOptions()
	opts.BlockSize = 256
	data, _ := build(t, opts, kvs, nil)
	good := open(t, data, ReaderOptions{})
	bad := bytes.Clone(data)
	bad[10] ^= 0xff // inside the first data block
	corrupt := open(t, bad, ReaderOptions{})
	first := kvs[0]

	visited := 0
	err := corrupt.Lookup(first.key.UserKey, false, func(base.InternalKey, []byte) bool { visited++; return true })
	if !errors.Is(err, base.ErrCorruption) || visited != 0 {
		t.Fatalf("Lookup of a corrupt block: %v after %d entries, want a corruption error first", err, visited)
	}
	err = good.Lookup(first.key.UserKey, true, func(base.InternalKey, []byte) bool { visited++; return true })
	if !errors.Is(err, ErrIncomplete) || visited != 0 {
		t.Fatalf("cache-only Lookup without a cache: %v after %d entries, want ErrIncomplete", err, visited)
	}
	var got []byte
	err = good.Lookup(first.key.UserKey, false, func(k base.InternalKey, v []byte) bool {
		got = fmt.Appendf(nil, "%s=%q", k, v)
		return false
	})
	if want := fmt.Appendf(nil, "%s=%q", first.key, first.val); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Lookup after the errors: %s, %v; want %s", got, err, want)
	}
}
