// Package hlc is a hybrid logical clock: timestamps that follow the wall
// clock closely, never go backwards on a node however its wall clock is
// stepped, and order causally related events across nodes (a node that
// receives a timestamp moves its clock past it).
//
// Shale stamps every applied Raft entry with one (see
// docs/backup-and-watch.md): point-in-time restore and change feeds order
// writes by it.
package hlc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Timestamp is a reading of a hybrid logical clock: the wall time in Unix
// nanoseconds and a logical counter that orders readings within the same
// nanosecond. The zero Timestamp is before every reading.
type Timestamp struct {
	WallNanos int64
	Logical   uint32
}

// Less reports whether t is before u.
func (t Timestamp) Less(u Timestamp) bool {
	return t.WallNanos < u.WallNanos || (t.WallNanos == u.WallNanos && t.Logical < u.Logical)
}

// Next returns the earliest timestamp after t: the same wall time with the
// logical counter advanced, or the next nanosecond when it is spent.
func (t Timestamp) Next() Timestamp { return next(t, t.WallNanos) }

// IsZero reports whether t is the zero Timestamp.
func (t Timestamp) IsZero() bool { return t == Timestamp{} }

// Time returns t's wall time.
func (t Timestamp) Time() time.Time { return time.Unix(0, t.WallNanos).UTC() }

// String formats t as its UTC wall time and logical counter.
func (t Timestamp) String() string {
	return fmt.Sprintf("%s,%d", t.Time().Format(time.RFC3339Nano), t.Logical)
}

// EncodedLen is the length of an encoded Timestamp.
const EncodedLen = 12

// Append appends t's fixed-length big-endian encoding (EncodedLen bytes,
// ordered as the timestamps are) to b.
func (t Timestamp) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(t.WallNanos))
	return binary.BigEndian.AppendUint32(b, t.Logical)
}

// ErrCorrupt is returned by Decode for input that is not an encoded
// Timestamp.
var ErrCorrupt = errors.New("hlc: corrupt timestamp")

// Decode reads a Timestamp encoded by Append from the start of b.
func Decode(b []byte) (Timestamp, error) {
	if len(b) < EncodedLen {
		return Timestamp{}, fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, len(b), EncodedLen)
	}
	wall := binary.BigEndian.Uint64(b)
	if wall > math.MaxInt64 {
		return Timestamp{}, fmt.Errorf("%w: wall time %d out of range", ErrCorrupt, wall)
	}
	return Timestamp{WallNanos: int64(wall), Logical: binary.BigEndian.Uint32(b[8:])}, nil
}

// ErrRemoteAhead is returned by Update for a timestamp further ahead of
// the local wall clock than the clock's maximum offset.
var ErrRemoteAhead = errors.New("hlc: remote timestamp too far ahead of the local clock")

// Clock is a hybrid logical clock. Its methods are safe for concurrent use.
type Clock struct {
	wall      func() time.Time
	maxOffset time.Duration

	mu   sync.Mutex
	last Timestamp
}

// New returns a clock reading wall (time.Now when nil). Update refuses
// timestamps more than maxOffset ahead of wall (0: no limit), so that one
// node's runaway clock cannot drag every other node's timestamps with it.
func New(wall func() time.Time, maxOffset time.Duration) *Clock {
	if wall == nil {
		wall = time.Now
	}
	return &Clock{wall: wall, maxOffset: maxOffset}
}

// Now returns a timestamp after every timestamp this clock returned or
// was updated with before: the wall time if it moved on, else the last
// one with its logical counter advanced.
func (c *Clock) Now() Timestamp {
	ts, _ := c.NowWall()
	return ts
}

// NowWall is Now, and the wall time in Unix nanoseconds the reading was
// taken at: the reading's wall time, or less while the clock runs ahead
// of the wall clock.
func (c *Clock) NowWall() (Timestamp, int64) {
	wall := c.wall().UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = next(c.last, wall)
	return c.last, wall
}

// Update moves the clock past remote (a timestamp received from another
// node) and returns a timestamp after both. A remote timestamp more than
// the maximum offset ahead of the local wall clock is refused with
// ErrRemoteAhead and changes nothing.
func (c *Clock) Update(remote Timestamp) (Timestamp, error) {
	wall := c.wall().UnixNano()
	if c.maxOffset > 0 && remote.WallNanos-wall > int64(c.maxOffset) {
		return Timestamp{}, fmt.Errorf("%w: %v is %v ahead of %v (maximum %v)", ErrRemoteAhead,
			remote, time.Duration(remote.WallNanos-wall), time.Unix(0, wall).UTC().Format(time.RFC3339Nano), c.maxOffset)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last.Less(remote) {
		c.last = remote
	}
	c.last = next(c.last, wall)
	return c.last, nil
}

// Last returns the latest timestamp the clock returned or was updated to,
// without advancing it.
func (c *Clock) Last() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// next is the smallest timestamp after last at wall time wall.
func next(last Timestamp, wall int64) Timestamp {
	if wall > last.WallNanos {
		return Timestamp{WallNanos: wall}
	}
	if last.Logical == math.MaxUint32 {
		// The counter is spent: borrow the next nanosecond.
		return Timestamp{WallNanos: last.WallNanos + 1}
	}
	return Timestamp{WallNanos: last.WallNanos, Logical: last.Logical + 1}
}
