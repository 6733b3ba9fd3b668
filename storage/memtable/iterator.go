package memtable

import (
	"bytes"
	"sync/atomic"

	"github.com/shale-db/shale/storage/internal/base"
)

// Iterator walks a Skiplist in base.CompareInternal order within the user-key
// bounds given to NewIter. It implements base.InternalIterator and never
// returns an error. It is not safe for concurrent use, but any number of
// iterators may run concurrently with each other and with one writer.
//
// Key().UserKey and Value() alias the skiplist's arena: they are never
// modified and stay valid for as long as the Skiplist is reachable (not only
// until the next positioning call, as the interface guarantees), so a caller
// that holds a reference to the memtable may keep them without copying. They
// must not be modified.
type Iterator struct {
	list         *Skiplist
	nd           uint32 // current node; 0 when not positioned
	lower, upper []byte
	ahead        uint64 // what seeks loaded ahead (see Skiplist.seek)
}

var _ base.InternalIterator = (*Iterator)(nil)

// settleFwd makes nd the current position if it is an entry below the upper
// bound (forward movement never crosses the lower bound) and reports whether
// the iterator is positioned.
func (it *Iterator) settleFwd(nd uint32) bool {
	s := it.list
	if nd == s.tail || nd == s.head || nd == 0 ||
		(it.upper != nil && bytes.Compare(s.userKey(nd, s.node(nd)), it.upper) >= 0) {
		it.nd = 0
		return false
	}
	it.nd = nd
	return true
}

// settleBack is settleFwd for backward movement: it checks the lower bound.
func (it *Iterator) settleBack(nd uint32) bool {
	s := it.list
	if nd == s.head || nd == s.tail || nd == 0 ||
		(it.lower != nil && bytes.Compare(s.userKey(nd, s.node(nd)), it.lower) < 0) {
		it.nd = 0
		return false
	}
	it.nd = nd
	return true
}

// SeekGE positions at the newest version of the first user key >= key (and
// >= the lower bound).
func (it *Iterator) SeekGE(key []byte) bool {
	if it.lower != nil && bytes.Compare(key, it.lower) < 0 {
		key = it.lower
	}
	return it.settleFwd(it.list.seekGE(base.MakeSearchKey(key), &it.ahead))
}

// SeekGEInternal positions at the first entry whose internal key is >= key
// (clamped to the lower bound), e.g. the newest version of key.UserKey
// visible at key's sequence number when key's kind is base.KindMax.
func (it *Iterator) SeekGEInternal(key base.InternalKey) bool {
	if it.lower != nil && bytes.Compare(key.UserKey, it.lower) < 0 {
		key = base.MakeSearchKey(it.lower)
	}
	return it.settleFwd(it.list.seekGE(key, &it.ahead))
}

// SeekLT positions at the oldest version of the last user key < key (and <
// the upper bound).
func (it *Iterator) SeekLT(key []byte) bool {
	if it.upper != nil && bytes.Compare(key, it.upper) > 0 {
		key = it.upper
	}
	return it.settleBack(it.list.seekLT(base.MakeSearchKey(key), &it.ahead))
}

// First positions at the first entry within the bounds.
func (it *Iterator) First() bool {
	if it.lower != nil {
		return it.SeekGE(it.lower)
	}
	s := it.list
	return it.settleFwd(s.next(s.head, 0))
}

// Last positions at the last entry within the bounds.
func (it *Iterator) Last() bool {
	if it.upper != nil {
		return it.SeekLT(it.upper)
	}
	s := it.list
	return it.settleBack(atomic.LoadUint32(&s.node(s.tail).prev))
}

// Next moves to the following entry. It returns false, leaving the iterator
// unpositioned, at the end or when the iterator is not positioned.
func (it *Iterator) Next() bool {
	if it.nd == 0 {
		return false
	}
	return it.settleFwd(it.list.next(it.nd, 0))
}

// Prev moves to the preceding entry in O(1) using the level-0 back link. It
// returns false, leaving the iterator unpositioned, at the start or when the
// iterator is not positioned.
func (it *Iterator) Prev() bool {
	if it.nd == 0 {
		return false
	}
	return it.settleBack(atomic.LoadUint32(&it.list.node(it.nd).prev))
}

// Key returns the current internal key, or the zero InternalKey when not
// positioned. UserKey aliases the arena; see the Iterator documentation.
func (it *Iterator) Key() base.InternalKey {
	if it.nd == 0 {
		return base.InternalKey{}
	}
	n := it.list.node(it.nd)
	return base.InternalKey{UserKey: it.list.userKey(it.nd, n), Trailer: base.Trailer(n.trailer)}
}

// Value returns the current value, or nil when not positioned. It aliases
// the arena; see the Iterator documentation.
func (it *Iterator) Value() []byte {
	if it.nd == 0 {
		return nil
	}
	n := it.list.node(it.nd)
	return it.list.value(n)
}

// Error always returns nil: skiplist iteration cannot fail.
func (it *Iterator) Error() error { return nil }

// Close unpositions the iterator and returns nil. The iterator may be
// repositioned afterwards.
func (it *Iterator) Close() error {
	it.nd = 0
	return nil
}

// SetBounds replaces the iterator's user-key bounds [lower, upper) (nil =
// unbounded) and unpositions it. The bounds are retained, not copied.
func (it *Iterator) SetBounds(lower, upper []byte) {
	it.lower, it.upper = lower, upper
	it.nd = 0
}
