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
	rs := d.loadReadState()
	if rs == nil {
		return nil, ErrClosed
	}
	defer rs.unref()
	type sample struct {
		key  []byte
		size uint64
	}
	var samples []sample
	var total uint64
	for _, files := range rs.vers.Levels {
		for _, f := range files {
			if !fileOverlaps(f, lower, upper) {
				continue
			}
			h, err := d.openTable(f)
			if err != nil {
				return nil, fmt.Errorf("split key: %w", err)
			}
			h.Reader().DataBlockBounds(lower, upper, func(sep []byte, size uint64) {
				samples = append(samples, sample{bytes.Clone(sep), size})
				total += size
			})
			h.Release()
		}
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
