package bloom

import (
	"fmt"
	"math"
	"testing"
)

func TestHashStable(t *testing.T) {
	// The hash is part of the on-disk format: these values must never change.
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"", 0xe220a8397b1dcdaf},
		{"a", 0xb7646891e62cfaa1},
		{"hello world", 0x27054a928d6ac34e},
		{"0123456789abcdef0", 0xb69a744b667cb507},
	} {
		if got := Hash([]byte(c.in)); got != c.want {
			t.Errorf("Hash(%q) = %#x, want %#x", c.in, got, c.want)
		}
	}
}

func TestNoFalseNegatives(t *testing.T) {
	for _, n := range []int{0, 1, 10, 1000, 50000} {
		for _, bpk := range []int{1, 5, 10, 20} {
			var b Builder
			for i := 0; i < n; i++ {
				b.AddKey([]byte(fmt.Sprintf("key-%d", i)))
			}
			f := Filter(b.Finish(nil, bpk))
			if err := f.Validate(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				if !f.MayContain([]byte(fmt.Sprintf("key-%d", i))) {
					t.Fatalf("n=%d bpk=%d: false negative for %d", n, bpk, i)
				}
			}
		}
	}
}

func TestFalsePositiveRate(t *testing.T) {
	for _, n := range []int{1000, 10000, 100000} {
		var b Builder
		for i := 0; i < n; i++ {
			b.AddKey([]byte(fmt.Sprintf("user/%08d", i)))
		}
		f := Filter(b.Finish(nil, 10))
		fp := 0
		const probes = 100000
		for i := 0; i < probes; i++ {
			if f.MayContain([]byte(fmt.Sprintf("other/%08d", i))) {
				fp++
			}
		}
		rate := float64(fp) / probes
		k := float64(NumProbes(10))
		theory := math.Pow(1-math.Exp(-k/10), k)
		t.Logf("n=%d: fp rate %.4f (theory %.4f)", n, rate, theory)
		if rate > 0.02 {
			t.Fatalf("false-positive rate %.4f too high", rate)
		}
	}
}

func TestInvalidFilter(t *testing.T) {
	for _, f := range []Filter{nil, {1}, make(Filter, 9), append(make(Filter, 8), 31)} {
		if f.Validate() == nil {
			t.Fatalf("%v validated", f)
		}
		if !f.MayContain([]byte("x")) {
			t.Fatal("invalid filter must answer true")
		}
	}
}

func BenchmarkMayContain(b *testing.B) {
	var bl Builder
	for i := 0; i < 100000; i++ {
		bl.AddKey([]byte(fmt.Sprintf("user/%08d", i)))
	}
	f := Filter(bl.Finish(nil, 10))
	key := []byte("user/00012345")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.MayContain(key)
	}
}
