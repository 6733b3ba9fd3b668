package client

import (
	"bytes"
	"context"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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

// WithPageSize fetches the scan in pages of at most n keys, each its own
// Scan request, which caps the iterator's memory at n keys (the server may
// cap pages further). Without it (n <= 0, the default), each shard's part
// of the range streams on one ScanStream call in the server's pages (at
// most 1,000 keys and 3 MiB each), which is one round trip per shard;
// gRPC's flow control then bounds the memory to a page plus the
// connection's window.
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
// The iterator walks the shards the range overlaps in order. For each
// shard it opens one ScanStream, which sends the shard's part page by page
// as the iterator consumes them (with WithPageSize, one Scan request per
// page instead), and it follows the server's continuation token, routed by
// its resume key, to the next shard. It survives leader changes, shard
// splits and broken streams in the middle of the scan: opening a stream is
// retried like any other request, and a stream that fails or stays silent
// for the attempt timeout (WithAttemptTimeout) is resumed after the last
// key received. Each page is read at its own point in time: a scan is not a
// snapshot of the range, but it returns every key present throughout the
// scan exactly once, in order.
//
// Opening each stream (or each page request) gets the client's default
// timeout when ctx has no deadline; an open stream lives as long as ctx.
// Errors end the iteration and are reported by Err. Close (or the end of
// the iteration) releases the stream.
func (c *Client) Scan(ctx context.Context, start, end []byte, opts ...ScanOption) *Iterator {
	o := applied(opts, func(f ScanOption, o *scanOptions) { f(o) })
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

	// stream is the current shard's open ScanStream (nil between shards
	// and with WithPageSize); stopStream cancels it.
	stream     shalev1.KV_ScanStreamClient
	stopStream context.CancelFunc

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
			it.closeStream()
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
	it.closeStream()
}

// closeStream cancels the open stream, if any.
func (it *Iterator) closeStream() {
	if it.stream != nil {
		it.stopStream()
		it.stream, it.stopStream = nil, nil
	}
}

// emptyRange reports whether [lo, hi) holds no key.
func (it *Iterator) emptyRange() bool {
	return len(it.hi) > 0 && bytes.Compare(it.lo, it.hi) >= 0
}

// startSubScan starts a sub-scan from the current position: a scan of
// [lo, hi) with the remaining limit (or the page size), followed shard to
// shard by continuation tokens. It returns false when nothing is left.
func (it *Iterator) startSubScan() bool {
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
	return true
}

// request is the Scan or ScanStream request that continues the sub-scan,
// and the target that routes it.
func (it *Iterator) request() (*shalev1.ScanRequest, target) {
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
	return req, tg
}

// fetch loads the next page into buf. It returns false when the scan is
// over or failed.
func (it *Iterator) fetch() bool {
	if it.o.pageSize > 0 {
		return it.fetchPage()
	}
	return it.fetchStreamed()
}

// fetchStreamed loads the next page from the current shard's stream,
// opening one when there is none, and resuming after the last key received
// when the stream broke.
func (it *Iterator) fetchStreamed() bool {
	if it.stream == nil {
		if it.token == nil && !it.startSubScan() {
			return false
		}
		resp, err := it.openStream()
		if err != nil {
			it.err = wrapOp("scan", err)
			return false
		}
		it.take(resp)
		return true
	}
	resp, err := it.recv()
	switch {
	case err == nil:
		it.take(resp)
		return true
	case err == io.EOF:
		// The shard's part ended without a token: the range (or the
		// limit) is exhausted.
		it.closeStream()
		it.done = true
		return false
	}
	// The stream broke (the node stopped, the leader moved, it went
	// silent): a new sub-scan resumes after the last key received, routed
	// afresh.
	it.closeStream()
	if it.c.isClosed() || it.ctx.Err() != nil {
		it.err = it.c.stopped(it.ctx, "scan", typed(err))
		return false
	}
	it.c.log.Debug("shale client: scan stream broke; resuming", "error", err)
	it.token, it.resume = nil, nil
	it.buf, it.idx = it.buf[:0], 0
	return true
}

// openStream opens a ScanStream for the sub-scan's next shard and returns
// its first message; routing, retries and the attempt timeout are invoke's.
// The stream then lives on under the iterator's context.
func (it *Iterator) openStream() (*shalev1.ScanResponse, error) {
	req, tg := it.request()
	var first *shalev1.ScanResponse
	err := it.c.invoke(it.ctx, readSpec("scan", it.o.consistency), tg,
		func(actx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
			r := proto.CloneOf(req)
			r.Header = hdr
			// The attempt's metadata (the node it is for), but not its
			// deadline, which bounds only the wait for the first message.
			md, _ := metadata.FromOutgoingContext(actx)
			sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(it.ctx, md))
			stopOnClose := context.AfterFunc(it.c.ctx, cancel)
			stop := func() { stopOnClose(); cancel() }
			stopOnAttempt := context.AfterFunc(actx, cancel)
			st, err := shalev1.NewKVClient(cc).ScanStream(sctx, r)
			if err == nil {
				first, err = st.Recv()
			}
			if !stopOnAttempt() {
				// The attempt's time ran out while opening.
				stop()
				if err == nil || status.Code(err) == codes.Canceled {
					err = status.FromContextError(actx.Err()).Err()
				}
				return err
			}
			if err == io.EOF {
				// A stream that ended without a page: nothing left here.
				stop()
				first = &shalev1.ScanResponse{}
				return nil
			}
			if err != nil {
				stop()
				return err
			}
			it.stream, it.stopStream = st, stop
			return nil
		})
	return first, err
}

// recv returns the stream's next message. A stream silent for the attempt
// timeout is cancelled (and so resumed by the caller).
func (it *Iterator) recv() (*shalev1.ScanResponse, error) {
	if d := it.c.opts.attemptTimeout; d > 0 {
		t := time.AfterFunc(d, it.stopStream)
		defer t.Stop()
	}
	return it.stream.Recv()
}

// take makes a streamed page the buffer and advances the position past it.
// The page that carries a continuation token is the shard's last: the
// stream is done, and the next fetch opens one on the next shard.
func (it *Iterator) take(resp *shalev1.ScanResponse) {
	lastEmpty := it.load(resp)
	switch {
	case len(resp.GetContinuationToken()) > 0:
		it.closeStream()
		it.token, it.resume = resp.GetContinuationToken(), resp.GetResumeKey()
	case lastEmpty:
		// A reverse scan reached the empty key, the first of all.
		it.closeStream()
		it.done = true
	case it.stream == nil:
		it.done = true // the stream ended with its first message
	default:
		it.token, it.resume = nil, nil
	}
}

// load makes a page the buffer and advances the position past its keys.
// It reports whether a reverse page ended at the empty key.
func (it *Iterator) load(resp *shalev1.ScanResponse) (lastEmpty bool) {
	kvs := resp.GetKvs()
	it.buf = it.buf[:0]
	it.idx = 0
	for _, kv := range kvs {
		it.buf = append(it.buf, fromProto(kv))
	}
	it.subGot += len(kvs)
	if n := len(kvs); n > 0 {
		last := kvs[n-1].GetKey()
		if it.o.reverse {
			it.hi = bytes.Clone(last)
			lastEmpty = len(last) == 0
		} else {
			it.lo = append(bytes.Clone(last), 0)
		}
	}
	return lastEmpty
}

// fetchPage loads the next page with a Scan request (WithPageSize).
func (it *Iterator) fetchPage() bool {
	if it.token == nil && !it.startSubScan() {
		return false
	}
	req, tg := it.request()
	var resp *shalev1.ScanResponse
	err := it.c.invoke(it.ctx, readSpec("scan", it.o.consistency), tg,
		func(ctx context.Context, cc grpc.ClientConnInterface, _ *shardRoute, hdr *shalev1.RequestHeader) error {
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
	lastEmpty := it.load(resp)
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
