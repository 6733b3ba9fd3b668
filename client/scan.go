package client

import (
	"bytes"
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// ScanOption configures Scan.
type ScanOption func(*scanOptions)

type scanOptions struct {
	prefix      []byte
	hasPrefix   bool
	reverse     bool
	keysOnly    bool
	limit       int
	pageSize    int
	consistency Consistency
}

// WithPrefix scans the keys starting with p, in place of a range: Scan's
// start and end must then be nil. It is the range [p, p') where p' is the
// first key after every key with prefix p (the end of the key space when p
// is all 0xff bytes or empty).
func WithPrefix(p []byte) ScanOption {
	return func(o *scanOptions) { o.prefix, o.hasPrefix = p, true }
}

// WithReverse scans from the end of the range backwards.
func WithReverse() ScanOption { return func(o *scanOptions) { o.reverse = true } }

// WithLimit stops the scan after n keys (n <= 0: no limit, the default).
func WithLimit(n int) ScanOption { return func(o *scanOptions) { o.limit = n } }

// WithKeysOnly returns keys and their revisions without values.
func WithKeysOnly() ScanOption { return func(o *scanOptions) { o.keysOnly = true } }

// WithPageSize caps the keys fetched per request, and so the iterator's
// memory, at n (n <= 0: the server's page size, the default). The server
// may cap pages further.
func WithPageSize(n int) ScanOption { return func(o *scanOptions) { o.pageSize = n } }

// WithScanConsistency sets the consistency of each page read (default
// Linearizable).
func WithScanConsistency(c Consistency) ScanOption {
	return func(o *scanOptions) { o.consistency = c }
}

// prefixEnd returns the first key after every key with prefix p, nil when
// there is none (p empty or all 0xff).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Scan returns an iterator over the keys in [start, end) in key order (with
// WithReverse, in reverse order). A nil or empty start is the beginning of
// the key space, a nil or empty end its end; a start at or after a
// non-empty end is ErrInvalidArgument (from Err, before any request), as
// the server would answer. With WithPrefix, start and end must be nil.
//
// The iterator walks the shards the range overlaps in order, fetching one
// page at a time (at most WithPageSize keys, and at most the server's page
// size) when the previous one is used up, so its memory is bounded by the
// page size. It follows the server's continuation tokens, routing each page
// by its resume key, and it survives leader changes and shard splits in the
// middle of the scan: each page is retried like any other request. Each
// page is read at its own point in time: a scan is not a snapshot of the
// range, but it returns every key present throughout the scan exactly once,
// in order.
//
// Each page request gets the client's default timeout when ctx has no
// deadline. Errors end the iteration and are reported by Err.
func (c *Client) Scan(ctx context.Context, start, end []byte, opts ...ScanOption) *Iterator {
	var o scanOptions
	for _, opt := range opts {
		opt(&o)
	}
	it := &Iterator{c: c, ctx: ctx, o: o}
	if o.hasPrefix {
		if start != nil || end != nil {
			it.err = wrapOp("scan", invalidArgf("WithPrefix needs nil start and end"))
			return it
		}
		start, end = o.prefix, prefixEnd(o.prefix)
	} else if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		it.err = wrapOp("scan", invalidArgf("empty range [%q, %q): start must be before end", start, end))
		return it
	}
	it.lo, it.hi = bytes.Clone(start), bytes.Clone(end)
	return it
}

// Iterator iterates over the result of a Scan. Use it from one goroutine:
//
//	it := c.Scan(ctx, start, end)
//	defer it.Close()
//	for it.Next() {
//		kv := it.KV()
//		...
//	}
//	if err := it.Err(); err != nil { ... }
type Iterator struct {
	c   *Client
	ctx context.Context
	o   scanOptions

	// lo and hi are the part of the range not yet returned (hi empty: the
	// end of the key space). They advance as pages arrive and start each
	// sub-scan.
	lo, hi []byte

	// The sub-scan in progress: a server-side scan of [subLo, subHi) with
	// limit subLimit, resumed with token at resume.
	subLo, subHi []byte
	subLimit     uint32
	subGot       int
	token        []byte
	resume       []byte

	buf     []*KeyValue
	idx     int
	cur     *KeyValue
	yielded int
	done    bool
	closed  bool
	err     error
}

// Next advances to the next key and reports whether there is one. It
// returns false at the end of the scan, after an error (see Err) and after
// Close.
func (it *Iterator) Next() bool {
	it.cur = nil
	if it.err != nil || it.closed {
		return false
	}
	for it.idx >= len(it.buf) {
		if it.done || !it.fetch() {
			it.buf = nil
			return false
		}
	}
	if it.o.limit > 0 && it.yielded >= it.o.limit {
		it.done, it.buf = true, nil
		return false
	}
	it.cur = it.buf[it.idx]
	it.buf[it.idx] = nil
	it.idx++
	it.yielded++
	return true
}

// KV returns the current key-value; valid after Next returned true, nil
// otherwise. The iterator does not reuse it.
func (it *Iterator) KV() *KeyValue { return it.cur }

// Err returns the error that ended the iteration, nil if it ended normally
// or has not ended.
func (it *Iterator) Err() error { return it.err }

// Close ends the iteration and releases the buffered page. It is safe to
// call more than once; Err still reports an earlier error.
func (it *Iterator) Close() {
	it.closed = true
	it.buf, it.cur = nil, nil
}

// emptyRange reports whether [lo, hi) holds no key.
func (it *Iterator) emptyRange() bool {
	return len(it.hi) > 0 && bytes.Compare(it.lo, it.hi) >= 0
}

// fetch loads the next page into buf. It returns false when the scan is
// over or failed.
func (it *Iterator) fetch() bool {
	if it.token == nil {
		// Start a sub-scan from the current position.
		if it.emptyRange() {
			it.done = true
			return false
		}
		it.subLo, it.subHi = it.lo, it.hi
		it.subLimit = 0
		remaining := 0
		if it.o.limit > 0 {
			remaining = it.o.limit - it.yielded
			if remaining <= 0 {
				it.done = true
				return false
			}
		}
		switch {
		case it.o.pageSize > 0 && (remaining == 0 || it.o.pageSize < remaining):
			it.subLimit = clampUint32(it.o.pageSize)
		case remaining > 0:
			it.subLimit = clampUint32(remaining)
		}
		it.subGot = 0
	}
	req := &shalev1.ScanRequest{
		StartKey:          it.subLo,
		EndKey:            it.subHi,
		Reverse:           it.o.reverse,
		Limit:             it.subLimit,
		ContinuationToken: it.token,
		KeysOnly:          it.o.keysOnly,
	}
	tg := target{key: it.lo}
	if it.o.reverse {
		tg = target{key: it.hi, before: true}
	}
	if it.token != nil && len(it.resume) > 0 {
		tg.key = it.resume
	}
	var resp *shalev1.ScanResponse
	err := it.c.invoke(it.ctx, readSpec("scan", it.o.consistency), tg,
		func(ctx context.Context, cc *grpc.ClientConn, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			r := proto.CloneOf(req)
			r.Header = hdr
			var err error
			resp, err = shalev1.NewKVClient(cc).Scan(ctx, r)
			return err
		})
	if err != nil {
		it.err = wrapOp("scan", err)
		return false
	}
	kvs := resp.GetKvs()
	it.buf = it.buf[:0]
	it.idx = 0
	for _, kv := range kvs {
		it.buf = append(it.buf, fromProto(kv))
	}
	it.subGot += len(kvs)
	lastEmpty := false
	if n := len(kvs); n > 0 {
		last := kvs[n-1].GetKey()
		if it.o.reverse {
			it.hi = bytes.Clone(last)
			lastEmpty = len(last) == 0
		} else {
			it.lo = append(bytes.Clone(last), 0)
		}
	}
	if len(resp.GetContinuationToken()) > 0 {
		it.token = resp.GetContinuationToken()
		it.resume = resp.GetResumeKey()
		return true
	}
	it.token, it.resume = nil, nil
	// The sub-scan ended: with a short count the range is exhausted; with
	// a full one (its limit reached) the next sub-scan starts after the last
	// key.
	if it.subLimit == 0 || it.subGot < int(it.subLimit) || lastEmpty {
		it.done = true
	}
	return true
}
