package hlc

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// manualWall is a wall clock the test sets.
type manualWall struct{ nanos atomic.Int64 }

func (m *manualWall) now() time.Time { return time.Unix(0, m.nanos.Load()) }

func TestNowFollowsWallAndNeverGoesBack(t *testing.T) {
	var w manualWall
	w.nanos.Store(1000)
	c := New(w.now, 0)
	if got := c.Now(); got != (Timestamp{WallNanos: 1000}) {
		t.Fatalf("first reading %v", got)
	}
	if got := c.Now(); got != (Timestamp{WallNanos: 1000, Logical: 1}) {
		t.Fatalf("same nanosecond: %v", got)
	}
	w.nanos.Store(500) // the wall clock is stepped back
	if got := c.Now(); got != (Timestamp{WallNanos: 1000, Logical: 2}) {
		t.Fatalf("after the wall clock went back: %v", got)
	}
	w.nanos.Store(2000)
	if got := c.Now(); got != (Timestamp{WallNanos: 2000}) {
		t.Fatalf("after the wall clock moved on: %v", got)
	}
}

func TestUpdate(t *testing.T) {
	var w manualWall
	w.nanos.Store(1000)
	c := New(w.now, time.Second)
	// A remote timestamp ahead (within the offset) moves the clock past it.
	got, err := c.Update(Timestamp{WallNanos: 5000, Logical: 7})
	if err != nil || got != (Timestamp{WallNanos: 5000, Logical: 8}) {
		t.Fatalf("update from ahead: %v %v", got, err)
	}
	if now := c.Now(); !got.Less(now) {
		t.Fatalf("Now %v not after the update's %v", now, got)
	}
	// One behind changes nothing but the counter.
	before := c.Last()
	got, err = c.Update(Timestamp{WallNanos: 10})
	if err != nil || !before.Less(got) || got.WallNanos != 5000 {
		t.Fatalf("update from behind: %v %v (before %v)", got, err, before)
	}
	// Too far ahead: refused, the clock unchanged.
	before = c.Last()
	if _, err := c.Update(Timestamp{WallNanos: 1000 + int64(2*time.Second)}); !errors.Is(err, ErrRemoteAhead) {
		t.Fatalf("update from 2s ahead with a 1s maximum: %v", err)
	}
	if c.Last() != before {
		t.Fatalf("a refused update moved the clock: %v -> %v", before, c.Last())
	}
}

func TestLogicalOverflowBorrowsANanosecond(t *testing.T) {
	var w manualWall
	w.nanos.Store(1000)
	c := New(w.now, 0)
	if _, err := c.Update(Timestamp{WallNanos: 1000, Logical: math.MaxUint32}); err != nil {
		t.Fatal(err)
	}
	if got := c.Last(); got != (Timestamp{WallNanos: 1001}) {
		t.Fatalf("after the counter's last value: %v", got)
	}
}

// TestMonotonicUnderRandomSteps: whatever the wall clock and the remote
// timestamps do, every reading is after the one before (model: the last
// reading).
func TestMonotonicUnderRandomSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var w manualWall
	w.nanos.Store(1 << 40)
	c := New(w.now, 0)
	var last Timestamp
	for i := 0; i < 100000; i++ {
		w.nanos.Add(rng.Int64N(2001) - 1000) // steps either way
		var got Timestamp
		if rng.IntN(3) == 0 {
			r := Timestamp{WallNanos: w.nanos.Load() + rng.Int64N(2001) - 1000, Logical: uint32(rng.IntN(4))}
			var err error
			if got, err = c.Update(r); err != nil {
				t.Fatal(err)
			}
			if !r.Less(got) {
				t.Fatalf("step %d: update returned %v, not after the remote %v", i, got, r)
			}
		} else {
			got = c.Now()
		}
		if !last.Less(got) {
			t.Fatalf("step %d: %v is not after %v", i, got, last)
		}
		last = got
	}
}

func TestConcurrentReadingsAreUnique(t *testing.T) {
	c := New(nil, 0)
	const workers, each = 8, 2000
	var (
		mu   sync.Mutex
		seen = map[Timestamp]bool{}
		wg   sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]Timestamp, 0, each)
			for i := 0; i < each; i++ {
				if i%3 == 0 {
					ts, err := c.Update(c.Last())
					if err != nil {
						t.Error(err)
						return
					}
					local = append(local, ts)
				} else {
					local = append(local, c.Now())
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, ts := range local {
				if seen[ts] {
					t.Errorf("timestamp %v returned twice", ts)
				}
				seen[ts] = true
			}
		}()
	}
	wg.Wait()
}

func TestEncoding(t *testing.T) {
	ts := []Timestamp{{}, {WallNanos: 1}, {WallNanos: 1, Logical: 1}, {WallNanos: 1 << 62, Logical: math.MaxUint32}, {WallNanos: math.MaxInt64}}
	for i, a := range ts {
		enc := a.Append(nil)
		if len(enc) != EncodedLen {
			t.Fatalf("%v: %d bytes", a, len(enc))
		}
		got, err := Decode(enc)
		if err != nil || got != a {
			t.Fatalf("round trip of %v: %v %v", a, got, err)
		}
		// The encoding sorts as the timestamps do.
		for _, b := range ts[i+1:] {
			if bytes.Compare(enc, b.Append(nil)) >= 0 {
				t.Fatalf("encoding of %v does not sort before %v's", a, b)
			}
		}
	}
	if _, err := Decode(make([]byte, EncodedLen-1)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("short input: %v", err)
	}
	bad := append([]byte{0x80}, make([]byte, EncodedLen-1)...)
	if _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("negative wall time: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Timestamp{WallNanos: 12345, Logical: 6}.Append(nil))
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, EncodedLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		if ts.WallNanos < 0 {
			t.Fatalf("decoded a negative wall time from %x", b)
		}
		if !bytes.Equal(ts.Append(nil), b[:EncodedLen]) {
			t.Fatalf("re-encoding %v differs from %x", ts, b[:EncodedLen])
		}
	})
}
