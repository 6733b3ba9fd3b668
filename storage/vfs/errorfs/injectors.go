package errorfs

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// InjectorFunc adapts a function to the Injector interface. The function
// must be safe for concurrent use.
type InjectorFunc func(op Op, path string) error

// MaybeError calls f.
func (f InjectorFunc) MaybeError(op Op, path string) error { return f(op, path) }

// Predicate selects operations, for Filter, Random and Latency.
type Predicate func(op Op, path string) bool

// Ops matches the listed operations.
func Ops(ops ...Op) Predicate {
	var set [numOps]bool
	for _, o := range ops {
		if o >= 0 && o < numOps {
			set[o] = true
		}
	}
	return func(op Op, _ string) bool { return op >= 0 && op < numOps && set[op] }
}

// WriteOps matches the operations for which Op.IsWrite is true.
func WriteOps() Predicate {
	return func(op Op, _ string) bool { return op.IsWrite() }
}

// PathSuffix matches operations whose path ends in any of the suffixes, e.g.
// PathSuffix(".log") or PathSuffix(".sst", "MANIFEST").
func PathSuffix(suffixes ...string) Predicate {
	return func(_ Op, path string) bool {
		for _, s := range suffixes {
			if strings.HasSuffix(path, s) {
				return true
			}
		}
		return false
	}
}

// And matches operations that every predicate matches (all, if none given).
func And(preds ...Predicate) Predicate {
	return func(op Op, path string) bool {
		for _, p := range preds {
			if !p(op, path) {
				return false
			}
		}
		return true
	}
}

// Filter returns an injector that passes only the operations pred matches on
// to inj; the rest succeed without inj seeing (or counting) them.
func Filter(pred Predicate, inj Injector) Injector {
	return InjectorFunc(func(op Op, path string) error {
		if !pred(op, path) {
			return nil
		}
		return inj.MaybeError(op, path)
	})
}

// Chain consults the injectors in order and returns the first error; the
// injectors after it are not consulted for that operation.
func Chain(injs ...Injector) Injector {
	return InjectorFunc(func(op Op, path string) error {
		for _, inj := range injs {
			if err := inj.MaybeError(op, path); err != nil {
				return err
			}
		}
		return nil
	})
}

// Index fails operations by their zero-based position among the operations
// it sees; see OnIndex and FromIndex. Counting is atomic, so under
// concurrency exactly the chosen positions fail, though which goroutine's
// operation lands on them depends on scheduling.
type Index struct {
	n     int64
	from  bool
	err   error
	count atomic.Int64
}

// OnIndex returns an injector that fails exactly the n-th operation it sees
// (counting from 0) with err, and no other. Combine with Filter to count only
// matching operations, and with a Counter dry run to choose n.
func OnIndex(n int64, err error) *Index {
	return &Index{n: n, err: err}
}

// FromIndex returns an injector that fails the n-th operation it sees
// (counting from 0) and every one after it, like a disk that died.
func FromIndex(n int64, err error) *Index {
	return &Index{n: n, from: true, err: err}
}

// MaybeError counts the operation and fails it if its index is chosen.
func (i *Index) MaybeError(Op, string) error {
	idx := i.count.Add(1) - 1
	if idx == i.n || (i.from && idx > i.n) {
		return i.err
	}
	return nil
}

// Count returns how many operations the injector has seen.
func (i *Index) Count() int64 { return i.count.Load() }

// Fired reports whether the injector has failed at least one operation.
func (i *Index) Fired() bool { return i.count.Load() > i.n }

// Random returns an injector that fails each operation matched by filter
// (every operation, if filter is nil) with probability p, using a generator
// seeded with seed. It is safe for concurrent use; with a single goroutine
// the same seed fails the same operations.
func Random(seed int64, p float64, err error, filter Predicate) Injector {
	rng := rand.New(rand.NewPCG(uint64(seed), 0xe770f5))
	var mu sync.Mutex
	return InjectorFunc(func(op Op, path string) error {
		if filter != nil && !filter(op, path) {
			return nil
		}
		mu.Lock()
		hit := rng.Float64() < p
		mu.Unlock()
		if hit {
			return err
		}
		return nil
	})
}

// Latency returns an injector that sleeps for d before each operation
// matched by filter (every operation, if filter is nil) and never fails.
func Latency(filter Predicate, d time.Duration) Injector {
	return InjectorFunc(func(op Op, path string) error {
		if filter == nil || filter(op, path) {
			time.Sleep(d)
		}
		return nil
	})
}

// Toggle wraps an injector so tests can switch it on and off mid-run. While
// disabled, operations succeed and the wrapped injector is not consulted (so
// it does not count them). A new Toggle is disabled.
type Toggle struct {
	inj Injector
	on  atomic.Bool
}

// NewToggle returns a disabled Toggle around inj.
func NewToggle(inj Injector) *Toggle { return &Toggle{inj: inj} }

// Enable starts passing operations to the wrapped injector.
func (t *Toggle) Enable() { t.on.Store(true) }

// Disable stops passing operations to the wrapped injector.
func (t *Toggle) Disable() { t.on.Store(false) }

// Enabled reports whether the toggle is on.
func (t *Toggle) Enabled() bool { return t.on.Load() }

// MaybeError consults the wrapped injector if the toggle is on.
func (t *Toggle) MaybeError(op Op, path string) error {
	if !t.on.Load() {
		return nil
	}
	return t.inj.MaybeError(op, path)
}

// Counter is an injector that never fails and counts the operations it sees,
// in total and per Op; use it in a dry run to learn how many operations a
// workload makes before choosing OnIndex positions. The zero value is ready
// to use.
type Counter struct {
	total atomic.Int64
	byOp  [numOps]atomic.Int64
}

// MaybeError counts the operation and returns nil.
func (c *Counter) MaybeError(op Op, _ string) error {
	c.total.Add(1)
	if op >= 0 && op < numOps {
		c.byOp[op].Add(1)
	}
	return nil
}

// Count returns the number of operations seen.
func (c *Counter) Count() int64 { return c.total.Load() }

// CountOf returns the number of operations of kind op seen.
func (c *Counter) CountOf(op Op) int64 {
	if op < 0 || op >= numOps {
		return 0
	}
	return c.byOp[op].Load()
}
