package storage

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestSplitKey checks that SplitKey halves the SSTs' data by stored size, within
// bounds, and declines when there is nothing to split.
func TestSplitKey(t *testing.T) {
	d := apiMustOpen(t, "db", apiSmallOptions(vfs.NewMem()))
	defer apiMustClose(t, d)
	if k, err := d.SplitKey(nil, nil); err != nil || k != nil {
		t.Fatalf("empty DB: %q, %v", k, err)
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%05d", i)) }
	// Incompressible values: sizes on disk follow the values' sizes.
	rng := rand.New(rand.NewPCG(1, 2))
	randVal := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	val := randVal(100)
	const n = 4000
	for i := range n {
		// Keys 0..999 get values four times as large: by size the middle
		// is not the middle by count.
		v := randVal(100)
		if i < 1000 {
			v = randVal(400)
		}
		b := NewBatch()
		b.Set(key(i), v)
		if err := d.Apply(b, NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	apiWaitIdle(t, d)
	// SSTBytes is the SST bytes Metrics reports.
	var want uint64
	for _, l := range d.Metrics().Levels {
		want += l.Bytes
	}
	if got, err := d.SSTBytes(); err != nil || got != want || got == 0 {
		t.Fatalf("SSTBytes = %d, %v; Metrics says %d", got, err, want)
	}
	// SSTBytesIn counts the data blocks a range holds: all of them over the
	// whole key space (most of SSTBytes, which adds the index and filter
	// blocks), about 1000×400 bytes below key 1000 and 3000×100 above (plus
	// the keys and the entries' overhead), and
	// the two parts add up to the whole.
	all, err := d.SSTBytesIn(nil, nil)
	if err != nil || all > want || all < want*8/10 {
		t.Fatalf("SSTBytesIn(nil, nil) = %d, %v; SSTBytes %d", all, err, want)
	}
	below, err1 := d.SSTBytesIn(nil, key(1000))
	above, err2 := d.SSTBytesIn(key(1000), nil)
	if err1 != nil || err2 != nil || below+above != all {
		t.Fatalf("SSTBytesIn below key 1000 %d (%v) and above %d (%v); together %d, want %d", below, err1, above, err2, below+above, all)
	}
	if below < 380_000 || below > 450_000 || above < 280_000 || above > 370_000 {
		t.Fatalf("SSTBytesIn below key 1000 %d, want about 400,000; above %d, want about 300,000", below, above)
	}
	// Total ≈ 1000×400 + 3000×100 = 700,000 bytes; half (350,000) is at
	// about key 875 (by count it would be key 2000).
	k, err := d.SplitKey(nil, nil)
	if err != nil || k == nil {
		t.Fatalf("SplitKey: %q, %v", k, err)
	}
	if string(k) < string(key(800)) || string(k) > string(key(960)) {
		t.Fatalf("SplitKey = %q, want about %q", k, key(875))
	}
	// Within bounds the answer is strictly inside them, near their middle.
	lo, hi := key(2000), key(3000)
	k, err = d.SplitKey(lo, hi)
	if err != nil || k == nil || string(k) <= string(lo) || string(k) >= string(hi) {
		t.Fatalf("SplitKey(%q, %q) = %q, %v", lo, hi, k, err)
	}
	if string(k) < string(key(2400)) || string(k) > string(key(2600)) {
		t.Fatalf("SplitKey(%q, %q) = %q, want about %q", lo, hi, k, key(2500))
	}
	// A range within one data block has nothing to split.
	if k, err := d.SplitKey(key(10), key(11)); err != nil || k != nil {
		t.Fatalf("SplitKey over one key: %q, %v", k, err)
	}
	// Data only in the memtable is not counted.
	d2 := apiMustOpen(t, "db2", apiSmallOptions(vfs.NewMem()))
	defer apiMustClose(t, d2)
	b := NewBatch()
	b.Set([]byte("a"), val)
	b.Set([]byte("b"), val)
	if err := d2.Apply(b, NoSync); err != nil {
		t.Fatal(err)
	}
	if k, err := d2.SplitKey(nil, nil); err != nil || k != nil {
		t.Fatalf("memtable only: %q, %v", k, err)
	}
}
