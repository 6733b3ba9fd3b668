package storage

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

// TestMergeOperandsNeverCountedTwiceDuringFlush is the regression test for a
// read state that briefly held both a flushed memtable and the L0 file it
// became: a reader then folded every merge operand of that memtable twice.
// Readers check that the operands of a key are exactly 0,1,...,n in order.
func TestMergeOperandsNeverCountedTwiceDuringFlush(t *testing.T) {
	d, err := Open("db", &Options{FS: vfs.NewMem(), MemTableSize: 64 << 10, MergeOperator: concatMerger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const keys = 4
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	wg.Add(1)
	go func() { // writer: operand i of every key, in order
		defer wg.Done()
		defer stop.Store(true)
		for i := 0; i < 3000; i++ {
			b := NewBatch()
			for k := 0; k < keys; k++ {
				b.Merge([]byte(fmt.Sprintf("k%d", k)), []byte(fmt.Sprint(i)))
			}
			// Padding so memtables fill and flush often.
			b.Set([]byte(fmt.Sprintf("pad%06d", i)), make([]byte, 200))
			if err := d.Apply(b, NoSync); err != nil {
				errc <- err
				return
			}
		}
	}()
	wg.Add(1)
	go func() { // explicit flushes on top of the automatic ones
		defer wg.Done()
		for !stop.Load() {
			if err := d.Flush(); err != nil {
				errc <- err
				return
			}
		}
	}()
	check := func(v []byte) error {
		for i, op := range strings.Split(string(v), ",") {
			if op != fmt.Sprint(i) {
				return fmt.Errorf("operand %d is %q in %q", i, op, v)
			}
		}
		return nil
	}
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for k := 0; k < keys; k++ {
					v, err := d.Get([]byte(fmt.Sprintf("k%d", k)))
					if err == ErrNotFound {
						continue
					}
					if err == nil {
						err = check(v)
					}
					if err != nil {
						errc <- err
						return
					}
				}
				it, err := d.NewIter(&IterOptions{UpperBound: []byte("l")})
				if err != nil {
					errc <- err
					return
				}
				for ok := it.First(); ok; ok = it.Next() {
					if err := check(it.Value()); err != nil {
						errc <- fmt.Errorf("iterator: %w", err)
						break
					}
				}
				_ = it.Close()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}
