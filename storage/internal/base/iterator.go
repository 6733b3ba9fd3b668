package base

import (
	"errors"
	"fmt"
)

// InternalIterator walks internal keys in CompareInternal order. It is the
// contract shared by memtables, SST readers, and the merging and level
// iterators built on them.
//
// Positioning methods return whether the iterator is now on an entry. After
// one returns false, Error tells an exhausted iterator (nil) from a failed
// one. Key and Value are valid only while positioned and only until the next
// positioning call; callers that keep them must copy.
//
// Next after a positioning call that returned false is undefined, as is Prev;
// reposition with First, Last, SeekGE or SeekLT first. An iterator is not
// safe for concurrent use.
type InternalIterator interface {
	// SeekGE positions at the first entry whose user key is >= key (that is,
	// the newest version of the first such user key).
	SeekGE(key []byte) bool
	// SeekLT positions at the last entry whose user key is < key (the oldest
	// version of the last such user key).
	SeekLT(key []byte) bool
	// First positions at the first entry.
	First() bool
	// Last positions at the last entry.
	Last() bool
	// Next moves to the following entry.
	Next() bool
	// Prev moves to the preceding entry.
	Prev() bool
	// Key returns the current internal key.
	Key() InternalKey
	// Value returns the current value.
	Value() []byte
	// Error returns the first error the iterator met, if any.
	Error() error
	// Close releases the iterator's resources and returns its error, if any.
	Close() error
}

// ErrCorruption is matched (errors.Is) by every *CorruptionError.
var ErrCorruption = errors.New("corruption")

// CorruptionError reports damaged data: a checksum mismatch, a malformed
// block or record, an impossible value. It names the file and the offset (or
// -1 when the offset is not known) so operators can find it.
type CorruptionError struct {
	File   string // file path or name, e.g. "000012.sst"
	Offset int64  // byte offset of the damaged unit, or -1
	Msg    string // what is wrong
}

// Error formats the error with the file and offset.
func (e *CorruptionError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("corruption in %s at offset %d: %s", e.File, e.Offset, e.Msg)
	}
	return fmt.Sprintf("corruption in %s: %s", e.File, e.Msg)
}

// Is makes errors.Is(err, ErrCorruption) true.
func (e *CorruptionError) Is(target error) bool { return target == ErrCorruption }

// Corruptf returns a *CorruptionError for file at offset.
func Corruptf(file string, offset int64, format string, args ...any) error {
	return &CorruptionError{File: file, Offset: offset, Msg: fmt.Sprintf(format, args...)}
}
