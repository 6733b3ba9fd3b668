package iters

import (
	"github.com/shale-db/shale/storage/internal/base"
)

// mergingChild is one input of a MergingIter with its current key cached, so
// that heap comparisons do not go through the interface.
type mergingChild struct {
	iter  base.InternalIterator
	key   base.InternalKey
	index int
}

// MergingIter merges several base.InternalIterators into one stream in
// base.CompareInternal order, using a binary heap of the positioned children.
// It implements base.InternalIterator and may be stepped in both directions;
// reverse iteration yields exactly the reverse of forward iteration.
//
// Entries with identical internal keys in different children are all
// yielded, ordered by child index (lower index first in the forward
// direction), and direction switches preserve that order.
//
// Errors are sticky: once a child reports an error (from a positioning call
// that returned false), every positioning call returns false and Error
// returns that error. The steady-state Next and Prev do not allocate.
type MergingIter struct {
	children []mergingChild
	heap     []*mergingChild
	reverse  bool // heap is a max-heap; the last move was backwards
	err      error
	closed   bool
	seekBuf  []byte // successor of a user key, for direction switches
}

var _ base.InternalIterator = (*MergingIter)(nil)

// NewMergingIter returns an unpositioned iterator merging iters. The
// MergingIter owns the children: Close closes them. Nil children are ignored.
func NewMergingIter(iters ...base.InternalIterator) *MergingIter {
	m := &MergingIter{children: make([]mergingChild, 0, len(iters))}
	for _, it := range iters {
		if it == nil {
			continue
		}
		m.children = append(m.children, mergingChild{iter: it, index: len(m.children)})
	}
	m.heap = make([]*mergingChild, 0, len(m.children))
	return m
}

// less orders heap entries: by internal key, then child index, reversed for
// the max-heap.
func (m *MergingIter) less(a, b *mergingChild) bool {
	c := base.CompareInternal(a.key, b.key)
	if c == 0 {
		c = a.index - b.index
	}
	if m.reverse {
		return c > 0
	}
	return c < 0
}

func (m *MergingIter) down(i int) {
	h := m.heap
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && m.less(h[r], h[l]) {
			j = r
		}
		if !m.less(h[j], h[i]) {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

func (m *MergingIter) heapify() {
	for i := len(m.heap)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
}

func (m *MergingIter) pop() {
	n := len(m.heap) - 1
	m.heap[0] = m.heap[n]
	m.heap[n] = nil
	m.heap = m.heap[:n]
	if n > 0 {
		m.down(0)
	}
}

// fail records err and invalidates the iterator.
func (m *MergingIter) fail(err error) bool {
	if m.err == nil {
		m.err = err
	}
	clear(m.heap)
	m.heap = m.heap[:0]
	return false
}

// settle records the outcome of a positioning call on c: a valid child is
// added to the heap being rebuilt, a failed one fails the iterator.
func (m *MergingIter) settle(c *mergingChild, ok bool) bool {
	if ok {
		c.key = c.iter.Key()
		m.heap = append(m.heap, c)
		return true
	}
	if err := c.iter.Error(); err != nil {
		m.fail(err)
		return false
	}
	return true
}

type positionOp uint8

const (
	opFirst positionOp = iota
	opLast
	opSeekGE
	opSeekLT
)

// positionAll applies op to every child and rebuilds the heap.
func (m *MergingIter) positionAll(op positionOp, key []byte) bool {
	if m.err != nil || m.closed {
		return false
	}
	clear(m.heap)
	m.heap = m.heap[:0]
	m.reverse = op == opLast || op == opSeekLT
	for i := range m.children {
		c := &m.children[i]
		var ok bool
		switch op {
		case opFirst:
			ok = c.iter.First()
		case opLast:
			ok = c.iter.Last()
		case opSeekGE:
			ok = c.iter.SeekGE(key)
		case opSeekLT:
			ok = c.iter.SeekLT(key)
		}
		if !m.settle(c, ok) {
			return false
		}
	}
	m.heapify()
	return len(m.heap) > 0
}

// SeekGE positions at the first entry whose user key is >= key.
func (m *MergingIter) SeekGE(key []byte) bool { return m.positionAll(opSeekGE, key) }

// SeekLT positions at the last entry whose user key is < key.
func (m *MergingIter) SeekLT(key []byte) bool { return m.positionAll(opSeekLT, key) }

// First positions at the smallest entry of all children.
func (m *MergingIter) First() bool { return m.positionAll(opFirst, nil) }

// Last positions at the largest entry of all children.
func (m *MergingIter) Last() bool { return m.positionAll(opLast, nil) }

// Next moves to the following entry. On an exhausted or unpositioned
// iterator it returns false.
func (m *MergingIter) Next() bool {
	if m.err != nil || len(m.heap) == 0 {
		return false
	}
	if m.reverse {
		return m.switchToForward()
	}
	c := m.heap[0]
	if c.iter.Next() {
		c.key = c.iter.Key()
		m.down(0)
		return true
	}
	if err := c.iter.Error(); err != nil {
		return m.fail(err)
	}
	m.pop()
	return len(m.heap) > 0
}

// Prev moves to the preceding entry. On an exhausted or unpositioned
// iterator it returns false.
func (m *MergingIter) Prev() bool {
	if m.err != nil || len(m.heap) == 0 {
		return false
	}
	if !m.reverse {
		return m.switchToReverse()
	}
	c := m.heap[0]
	if c.iter.Prev() {
		c.key = c.iter.Key()
		m.down(0)
		return true
	}
	if err := c.iter.Error(); err != nil {
		return m.fail(err)
	}
	m.pop()
	return len(m.heap) > 0
}

// switchToForward turns a max-heap positioned at the current entry into a
// min-heap positioned at the following entry. Every other child is sought
// to the current user key and advanced past the entries that precede or
// equal the current position in (internal key, child index) order; the
// current child simply steps forward.
func (m *MergingIter) switchToForward() bool {
	cur := m.heap[0]
	curKey := cur.key
	clear(m.heap)
	m.heap = m.heap[:0]
	m.reverse = false
	for i := range m.children {
		c := &m.children[i]
		if c == cur {
			continue
		}
		ok := c.iter.SeekGE(curKey.UserKey)
		for ok {
			cmp := base.CompareInternal(c.iter.Key(), curKey)
			if cmp > 0 || (cmp == 0 && c.index > cur.index) {
				break
			}
			ok = c.iter.Next()
		}
		if !m.settle(c, ok) {
			return false
		}
	}
	if !m.settle(cur, cur.iter.Next()) {
		return false
	}
	m.heapify()
	return len(m.heap) > 0
}

// switchToReverse mirrors switchToForward: every other child is positioned
// at its last entry before the current position. Since SeekLT takes a user
// key, children seek to just past the current user key (its immediate
// successor, key+"\x00") and retreat over the entries that follow the
// current position.
func (m *MergingIter) switchToReverse() bool {
	cur := m.heap[0]
	curKey := cur.key
	m.seekBuf = append(append(m.seekBuf[:0], curKey.UserKey...), 0)
	clear(m.heap)
	m.heap = m.heap[:0]
	m.reverse = true
	for i := range m.children {
		c := &m.children[i]
		if c == cur {
			continue
		}
		ok := c.iter.SeekLT(m.seekBuf)
		for ok {
			cmp := base.CompareInternal(c.iter.Key(), curKey)
			if cmp < 0 || (cmp == 0 && c.index < cur.index) {
				break
			}
			ok = c.iter.Prev()
		}
		if !m.settle(c, ok) {
			return false
		}
	}
	if !m.settle(cur, cur.iter.Prev()) {
		return false
	}
	m.heapify()
	return len(m.heap) > 0
}

// Key returns the current internal key, or the zero key when not positioned.
// It is valid until the next positioning call.
func (m *MergingIter) Key() base.InternalKey {
	if len(m.heap) == 0 {
		return base.InternalKey{}
	}
	return m.heap[0].key
}

// Value returns the current value, or nil when not positioned. It is valid
// until the next positioning call.
func (m *MergingIter) Value() []byte {
	if len(m.heap) == 0 {
		return nil
	}
	return m.heap[0].iter.Value()
}

// Error returns the first error met by the iterator or one of its children.
func (m *MergingIter) Error() error { return m.err }

// Close closes every child and returns the iterator's error or, failing
// that, the first error a child's Close returned. Closing twice is a no-op
// that returns the same error.
func (m *MergingIter) Close() error {
	if !m.closed {
		m.closed = true
		for i := range m.children {
			if err := m.children[i].iter.Close(); err != nil && m.err == nil {
				m.err = err
			}
		}
		clear(m.heap)
		m.heap = m.heap[:0]
	}
	return m.err
}
