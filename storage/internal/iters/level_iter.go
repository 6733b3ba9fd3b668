package iters

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/shale-db/shale/storage/internal/base"
)

// FileBounds is the key extent of one file of a level: every point key of
// the file lies in [Smallest, Largest] in base.CompareInternal order. Largest
// may be an exclusive range-deletion sentinel
// (base.InternalKey.IsExclusiveSentinel), in which case the file holds no
// point key whose user key equals Largest.UserKey.
type FileBounds struct {
	Smallest, Largest base.InternalKey
}

// mayContainGE reports whether a file whose extent ends at largest may hold
// a point key with user key >= key.
func mayContainGE(largest base.InternalKey, key []byte) bool {
	c := bytes.Compare(largest.UserKey, key)
	return c > 0 || (c == 0 && !largest.IsExclusiveSentinel())
}

// LevelIter concatenates the iterators of the files of one sorted,
// non-overlapping level. It implements base.InternalIterator and may be
// stepped in both directions.
//
// Guarantees:
//   - Files are opened lazily, one at a time: moving to another file closes
//     the previous file's iterator first. Seeks binary-search the file list.
//   - Only entries whose user key lies in [lower, upper) are yielded (a nil
//     bound is unbounded); files wholly outside the bounds are never opened.
//     SeekGE below lower behaves as SeekGE(lower), SeekLT above upper as
//     SeekLT(upper).
//   - Files without point keys in the sought range (for instance files that
//     hold only range tombstones) are skipped transparently.
//   - Errors (from open, a file iterator, or closing a file iterator) are
//     sticky: every later positioning call returns false and Error returns
//     the first one. Files given out of order are reported as an error
//     rather than iterated.
type LevelIter struct {
	files        []FileBounds
	open         func(i int, lower, upper []byte) (base.InternalIterator, error)
	lower, upper []byte
	lo, hi       int // files[lo:hi] overlap [lower, upper)

	cur        base.InternalIterator
	curIdx     int
	checkLower bool // the current file may hold keys < lower
	checkUpper bool // the current file may hold keys >= upper
	valid      bool
	err        error
	closed     bool
}

var _ base.InternalIterator = (*LevelIter)(nil)

// NewLevelIter returns an unpositioned iterator over files, which must be
// sorted and non-overlapping. open(i, lower, upper) returns the iterator of
// files[i]; it receives the level's bounds so that it may prune. The
// LevelIter owns and closes the iterators open returns. The files slice and
// the bounds are retained, not copied.
func NewLevelIter(
	files []FileBounds,
	open func(i int, lower, upper []byte) (base.InternalIterator, error),
	lower, upper []byte,
) *LevelIter {
	l := &LevelIter{files: files, open: open, lower: lower, upper: upper, curIdx: -1}
	if open == nil {
		l.err = errors.New("iters: level iterator without an open function")
		return l
	}
	for i, f := range files {
		if base.CompareInternal(f.Smallest, f.Largest) > 0 {
			l.err = fmt.Errorf("iters: level file %d has smallest %s > largest %s", i, f.Smallest, f.Largest)
			return l
		}
		if i > 0 && base.CompareInternal(files[i-1].Largest, f.Smallest) >= 0 {
			l.err = fmt.Errorf("iters: level files %d and %d overlap or are out of order: %s >= %s",
				i-1, i, files[i-1].Largest, f.Smallest)
			return l
		}
	}
	l.lo, l.hi = 0, len(files)
	if lower != nil {
		l.lo = l.searchLargestGE(lower, 0, len(files))
	}
	if upper != nil {
		l.hi = l.searchSmallestGE(upper, l.lo, len(files))
	}
	return l
}

// searchLargestGE returns the first index in [i, j) whose file may hold a
// user key >= key, or j.
func (l *LevelIter) searchLargestGE(key []byte, i, j int) int {
	for i < j {
		h := int(uint(i+j) >> 1)
		if mayContainGE(l.files[h].Largest, key) {
			j = h
		} else {
			i = h + 1
		}
	}
	return i
}

// searchSmallestGE returns the first index in [i, j) whose file's smallest
// user key is >= key, or j.
func (l *LevelIter) searchSmallestGE(key []byte, i, j int) int {
	for i < j {
		h := int(uint(i+j) >> 1)
		if bytes.Compare(l.files[h].Smallest.UserKey, key) >= 0 {
			j = h
		} else {
			i = h + 1
		}
	}
	return i
}

// loadFile makes files[i] the current file, opening it unless it is already
// open.
func (l *LevelIter) loadFile(i int) bool {
	if l.cur != nil && l.curIdx == i {
		return true
	}
	if l.cur != nil {
		err := l.cur.Close()
		l.cur, l.curIdx = nil, -1
		if err != nil {
			return l.fail(err)
		}
	}
	it, err := l.open(i, l.lower, l.upper)
	if err != nil {
		if it != nil {
			_ = it.Close()
		}
		return l.fail(fmt.Errorf("iters: opening level file %d: %w", i, err))
	}
	if it == nil {
		return l.fail(fmt.Errorf("iters: opening level file %d returned no iterator", i))
	}
	f := &l.files[i]
	l.cur, l.curIdx = it, i
	l.checkLower = l.lower != nil && bytes.Compare(f.Smallest.UserKey, l.lower) < 0
	l.checkUpper = l.upper != nil && mayContainGE(f.Largest, l.upper)
	return true
}

func (l *LevelIter) fail(err error) bool {
	if l.err == nil {
		l.err = err
	}
	l.valid = false
	return false
}

// firstInFile positions the current file at its first entry within bounds.
func (l *LevelIter) firstInFile() bool {
	if l.checkLower {
		return l.cur.SeekGE(l.lower)
	}
	return l.cur.First()
}

// lastInFile positions the current file at its last entry within bounds.
func (l *LevelIter) lastInFile() bool {
	if l.checkUpper {
		return l.cur.SeekLT(l.upper)
	}
	return l.cur.Last()
}

// settleForward turns the outcome ok of a forward move within the current
// file into a position, moving on to later files while the current one is
// exhausted.
func (l *LevelIter) settleForward(ok bool) bool {
	for {
		if ok {
			if l.checkUpper && bytes.Compare(l.cur.Key().UserKey, l.upper) >= 0 {
				l.valid = false
				return false
			}
			l.valid = true
			return true
		}
		if err := l.cur.Error(); err != nil {
			return l.fail(err)
		}
		next := l.curIdx + 1
		if next >= l.hi {
			l.valid = false
			return false
		}
		if !l.loadFile(next) {
			return false
		}
		ok = l.firstInFile()
	}
}

// settleReverse mirrors settleForward.
func (l *LevelIter) settleReverse(ok bool) bool {
	for {
		if ok {
			if l.checkLower && bytes.Compare(l.cur.Key().UserKey, l.lower) < 0 {
				l.valid = false
				return false
			}
			l.valid = true
			return true
		}
		if err := l.cur.Error(); err != nil {
			return l.fail(err)
		}
		prev := l.curIdx - 1
		if prev < l.lo {
			l.valid = false
			return false
		}
		if !l.loadFile(prev) {
			return false
		}
		ok = l.lastInFile()
	}
}

func (l *LevelIter) usable() bool {
	l.valid = false
	return l.err == nil && !l.closed
}

// SeekGE positions at the first entry within bounds whose user key is >=
// key.
func (l *LevelIter) SeekGE(key []byte) bool {
	if !l.usable() {
		return false
	}
	if l.lower != nil && bytes.Compare(key, l.lower) < 0 {
		key = l.lower
	}
	if l.upper != nil && bytes.Compare(key, l.upper) >= 0 {
		return false
	}
	i := l.searchLargestGE(key, l.lo, l.hi)
	if i >= l.hi || !l.loadFile(i) {
		return false
	}
	return l.settleForward(l.cur.SeekGE(key))
}

// SeekLT positions at the last entry within bounds whose user key is < key.
func (l *LevelIter) SeekLT(key []byte) bool {
	if !l.usable() {
		return false
	}
	if l.upper != nil && bytes.Compare(key, l.upper) > 0 {
		key = l.upper
	}
	if l.lower != nil && bytes.Compare(key, l.lower) <= 0 {
		return false
	}
	i := l.searchSmallestGE(key, l.lo, l.hi) - 1
	if i < l.lo || !l.loadFile(i) {
		return false
	}
	return l.settleReverse(l.cur.SeekLT(key))
}

// First positions at the first entry within bounds.
func (l *LevelIter) First() bool {
	if !l.usable() {
		return false
	}
	if l.lo >= l.hi || !l.loadFile(l.lo) {
		return false
	}
	return l.settleForward(l.firstInFile())
}

// Last positions at the last entry within bounds.
func (l *LevelIter) Last() bool {
	if !l.usable() {
		return false
	}
	if l.lo >= l.hi || !l.loadFile(l.hi-1) {
		return false
	}
	return l.settleReverse(l.lastInFile())
}

// Next moves to the following entry. On an exhausted or unpositioned
// iterator it returns false.
func (l *LevelIter) Next() bool {
	if !l.valid {
		return false
	}
	return l.settleForward(l.cur.Next())
}

// Prev moves to the preceding entry. On an exhausted or unpositioned
// iterator it returns false.
func (l *LevelIter) Prev() bool {
	if !l.valid {
		return false
	}
	return l.settleReverse(l.cur.Prev())
}

// Key returns the current internal key, or the zero key when not
// positioned. It is valid until the next positioning call.
func (l *LevelIter) Key() base.InternalKey {
	if !l.valid {
		return base.InternalKey{}
	}
	return l.cur.Key()
}

// Value returns the current value, or nil when not positioned. It is valid
// until the next positioning call.
func (l *LevelIter) Value() []byte {
	if !l.valid {
		return nil
	}
	return l.cur.Value()
}

// Error returns the first error the iterator met.
func (l *LevelIter) Error() error { return l.err }

// Close closes the open file iterator, if any, and returns the iterator's
// first error. Closing twice is a no-op returning the same error.
func (l *LevelIter) Close() error {
	if !l.closed {
		l.closed = true
		l.valid = false
		if l.cur != nil {
			if err := l.cur.Close(); err != nil && l.err == nil {
				l.err = err
			}
			l.cur, l.curIdx = nil, -1
		}
	}
	return l.err
}
