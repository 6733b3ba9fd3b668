package sstable

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

// verifyFile opens data and reads everything, checking that whatever is
// returned matches the original and that any failure is a corruption error
// naming the file. It reports whether an error was seen.
func verifyFile(t *testing.T, data []byte, kvs []kv, rds []RangeDel, what string) bool {
	t.Helper()
	const name = "000042.sst"
	checkErr := func(err error) {
		t.Helper()
		if !errors.Is(err, base.ErrCorruption) || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s: error is not a corruption naming the file: %v", what, err)
		}
		var ce *base.CorruptionError
		if !errors.As(err, &ce) || ce.File != name {
			t.Fatalf("%s: not a *CorruptionError: %v", what, err)
		}
	}
	r, err := NewReader(bytes.NewReader(data), int64(len(data)), ReaderOptions{FileName: name})
	if err != nil {
		checkErr(err)
		return true
	}
	sawErr := false
	it, _ := r.NewIter(nil, nil)
	i := 0
	for ok := it.First(); ok; ok = it.Next() {
		if i >= len(kvs) || base.CompareInternal(it.Key(), kvs[i].key) != 0 || !bytes.Equal(it.Value(), kvs[i].val) {
			t.Fatalf("%s: forward entry %d wrong: %s", what, i, it.Key())
		}
		i++
	}
	if err := it.Error(); err != nil {
		checkErr(err)
		sawErr = true
	} else if i != len(kvs) {
		t.Fatalf("%s: forward scan returned %d of %d entries without error", what, i, len(kvs))
	}
	it2, _ := r.NewIter(nil, nil)
	i = len(kvs) - 1
	for ok := it2.Last(); ok; ok = it2.Prev() {
		if i < 0 || base.CompareInternal(it2.Key(), kvs[i].key) != 0 || !bytes.Equal(it2.Value(), kvs[i].val) {
			t.Fatalf("%s: reverse entry %d wrong: %s", what, i, it2.Key())
		}
		i--
	}
	if err := it2.Error(); err != nil {
		checkErr(err)
		sawErr = true
	} else if i != -1 {
		t.Fatalf("%s: reverse scan stopped early without error", what)
	}
	got, err := r.RangeDels()
	if err != nil {
		checkErr(err)
		sawErr = true
	} else if fmt.Sprint(got) != fmt.Sprint(rds) {
		t.Fatalf("%s: range dels differ: %v", what, got)
	}
	if _, err := r.Layout(); err != nil {
		checkErr(err)
		sawErr = true
	}
	for _, e := range kvs {
		if !r.MayContain(e.key.UserKey) {
			t.Fatalf("%s: filter lost key %s", what, e.key)
		}
	}
	_ = it.Close()
	_ = it2.Close()
	return sawErr
}

func TestCorruptionEveryBit(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	kvs := randomKVs(rng, 30, 2)
	for i := range kvs {
		if len(kvs[i].val) > 100 {
			kvs[i].val = kvs[i].val[:100]
		}
	}
	rds := []RangeDel{{[]byte("a"), []byte("f"), 100}, {[]byte("c"), []byte("d"), 50}}
	for _, c := range allCompressions {
		t.Run(c.String(), func(t *testing.T) {
			opts := DefaultWriterOptions()
			opts.Compression = c
			opts.BlockSize = 256
			opts.BlockRestartInterval = 4
			opts.UserProperties = map[string]string{"k": "v"}
			data, _ := build(t, opts, kvs, rds)
			if verifyFile(t, data, kvs, rds, "original") {
				t.Fatal("error on intact file")
			}
			bits := len(data) * 8
			step := 1
			if testing.Short() || bits > 40000 {
				step = 7
			}
			buf := make([]byte, len(data))
			for b := 0; b < bits; b += step {
				copy(buf, data)
				buf[b/8] ^= 1 << (b % 8)
				if !verifyFile(t, buf, kvs, rds, fmt.Sprintf("bit %d", b)) {
					t.Fatalf("flipping bit %d (byte %d of %d) went undetected", b, b/8, len(data))
				}
			}
			// Truncations and garbage extensions.
			for n := 0; n < len(data); n += 1 + n/8 {
				verifyFile(t, data[:n], kvs, rds, fmt.Sprintf("truncated to %d", n))
			}
			verifyFile(t, append(append([]byte{}, data...), 0, 0, 0), kvs, rds, "extended")
		})
	}
}

func TestCorruptionRandomGarbage(t *testing.T) {
	rng := rand.New(rand.NewSource(12))
	for i := 0; i < 2000; i++ {
		b := make([]byte, rng.Intn(300))
		rng.Read(b)
		if len(b) >= FooterLen && rng.Intn(2) == 0 {
			copy(b[len(b)-8:], []byte{0xf0, 'S', 'H', 'A', 'L', 's', 's', 't'})
		}
		r, err := NewReader(bytes.NewReader(b), int64(len(b)), ReaderOptions{FileName: "g"})
		if err == nil {
			t.Fatal("garbage accepted")
		}
		_ = r
		if !errors.Is(err, base.ErrCorruption) {
			t.Fatalf("garbage gave non-corruption error %v", err)
		}
	}
}
