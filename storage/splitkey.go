package storage

import (
	"bytes"
	"fmt"
	"slices"
)

// SplitKey returns a user key strictly inside (lower, upper) — upper nil
// is the end of the key space — that divides the data the SSTs hold in
// [lower, upper) into two parts of about equal size, or nil when they hold
// too little to divide (fewer than two data blocks there). It is chosen
// from the SSTs' index blocks, which the open tables keep in memory: no
// data block is read. Data still in memtables is not counted.
func (d *DB) SplitKey(lower, upper []byte) ([]byte, error) {
	type sample struct {
		key  []byte
		size uint64
	}
	var samples []sample
	var total uint64
	err := d.dataBlocksIn(lower, upper, func(sep []byte, size uint64) {
		samples = append(samples, sample{bytes.Clone(sep), size})
		total += size
	})
	if err != nil {
		return nil, fmt.Errorf("split key: %w", err)
	}
	if len(samples) < 2 {
		return nil, nil
	}
	slices.SortFunc(samples, func(a, b sample) int { return bytes.Compare(a.key, b.key) })
	// The separator where the running size first reaches half the total,
	// or the nearest one after it that is strictly inside the bounds.
	var run uint64
	for i, s := range samples {
		run += s.size
		if 2*run < total {
			continue
		}
		for _, c := range samples[i:] {
			if bytes.Compare(c.key, lower) > 0 && (upper == nil || bytes.Compare(c.key, upper) < 0) {
				return c.key, nil
			}
		}
		break
	}
	return nil, nil
}

// SSTBytesIn returns an estimate of the SST bytes that hold keys in
// [lower, upper) (nil bounds are open): the stored size of every data
// block whose last key lies there, the blocks SplitKey divides. Unlike
// SSTBytes it leaves out data outside the bounds that the engine still
// keeps (a range deleted but not yet compacted away). It reads only the
// SSTs' index blocks, which the open tables keep in memory.
func (d *DB) SSTBytesIn(lower, upper []byte) (uint64, error) {
	var n uint64
	if err := d.dataBlocksIn(lower, upper, func(_ []byte, size uint64) { n += size }); err != nil {
		return 0, fmt.Errorf("sst bytes in a range: %w", err)
	}
	return n, nil
}

// dataBlocksIn calls fn for every data block of the live SSTs whose index
// separator lies in [lower, upper), as sstable.Reader.DataBlockBounds does,
// table by table (not in key order across tables).
func (d *DB) dataBlocksIn(lower, upper []byte, fn func(sep []byte, size uint64)) error {
	rs := d.loadReadState()
	if rs == nil {
		return ErrClosed
	}
	defer rs.unref()
	for _, files := range rs.vers.Levels {
		for _, f := range files {
			if !fileOverlaps(f, lower, upper) {
				continue
			}
			h, err := d.openTable(f)
			if err != nil {
				return err
			}
			h.Reader().DataBlockBounds(lower, upper, fn)
			h.Release()
		}
	}
	return nil
}

// SSTBytes returns the total size of the live SST files: what SplitKey
// divides. It reads only the in-memory version (no directory listing, no
// lock), so it is cheap enough to ask of many DBs every second.
func (d *DB) SSTBytes() (uint64, error) {
	rs := d.loadReadState()
	if rs == nil {
		return 0, ErrClosed
	}
	defer rs.unref()
	var n uint64
	for level := range rs.vers.Levels {
		n += rs.vers.LevelSize(level)
	}
	return n, nil
}
