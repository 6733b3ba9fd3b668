package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// A KV.Calls stream normally goes over the connection's gRPC transport,
// which hands every message to a writer goroutine (the caller's send wakes
// it to make the write) and every received one from a reader goroutine to
// the stream's receiver: four goroutine hand-offs per call with one call in
// flight, and gRPC's per-message work around them. When the SDK does its
// own dialing (no WithDialOptions, a host:port address), a connection's
// stream goes instead over a TCP (or TLS) connection of its own that the
// SDK speaks HTTP/2 and gRPC's message framing on directly (callsConn):
// the sender writes the message itself, and the stream's receiver reads
// the results off the socket and hands each to its caller, two hand-offs
// per call. The node sees an ordinary gRPC stream. The connection is the
// stream's alone: it opens with the stream and closes when the stream
// ends.

// callsPath is the HTTP/2 path of KV.Calls.
const callsPath = "/shale.v1.KV/Calls"

// callsStreamID is the HTTP/2 stream a callsConn's KV.Calls stream uses:
// the first (and only) stream of its connection.
const callsStreamID = 1

// callsMaxRecvBytes bounds a message received on a callsConn, as
// MaxCallRecvMsgSize bounds one on the gRPC connection.
const callsMaxRecvBytes = 64 << 20

// callsWindowUpdateBytes is how much received data a callsConn lets
// accumulate before it returns it to the node's send windows.
const callsWindowUpdateBytes = 256 << 10

// callsDialTimeout bounds the dial and handshake of a callsConn, as
// MinConnectTimeout bounds a gRPC connection's.
const callsDialTimeout = 20 * time.Second

// Keepalive of a callsConn, as the gRPC connections' (WithKeepaliveParams):
// after callsKeepaliveTime without a frame from the node it is pinged, and
// the connection closed if nothing arrives within callsKeepaliveTimeout.
// Variables for tests.
var (
	callsKeepaliveTime    = 10 * time.Second
	callsKeepaliveTimeout = 5 * time.Second
)

// callsTransport is what a callStream sends its batches on and receives
// results from: a gRPC client stream, or a callsConn.
type callsTransport interface {
	Send(*shalev1.CallBatch) error
	Recv() (*shalev1.ResultBatch, error)
}

// callsDialer opens KV.Calls streams on connections of their own to one
// node (see callsConn).
type callsDialer struct {
	// target is the node's host:port, creds secure the connection.
	target string
	creds  credentials.TransportCredentials
	// clientCtx ends when the client closes: so does every connection.
	clientCtx context.Context
}

// callsTarget returns target if a callsConn can dial it (a host:port
// address; gRPC resolves anything else), or "".
func callsTarget(target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "unix:") {
		return ""
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return ""
	}
	return target
}

// callsConn is a KV.Calls stream on a connection of its own. Send is
// called by one goroutine at a time (the stream's sender of the moment),
// Recv by one (the stream's receiver); both may run at once, and with the
// keepalive timer's pings.
type callsConn struct {
	conn net.Conn
	// goAway is called once when the node announces it is going away: the
	// stream takes no new calls, and its calls in flight are answered.
	goAway func()

	// wmu serializes writes of frames (the framer and its buffer).
	wmu sync.Mutex
	bw  *bufio.Writer
	wfr *http2.Framer
	// enc holds the message being sent (Send's, one sender at a time).
	enc []byte

	// fmu guards the send windows; fcond is signalled when they grow or
	// the connection fails.
	fmu       sync.Mutex
	fcond     *sync.Cond
	connWin   int64
	streamWin int64
	// peerInitial is the node's initial stream window (its settings).
	peerInitial uint32
	maxFrame    uint32
	failed      error

	// Read side, the receiving goroutine's alone.
	rfr      *http2.Framer
	unacked  uint32
	msg      []byte
	headers  bool
	goneAway bool

	// frames counts the frames read, for the keepalive.
	frames atomic.Uint64
	// The keepalive timer (see keepaliveTick) and its state, under kaMu.
	kaMu     sync.Mutex
	ka       *time.Timer
	kaSeen   uint64
	kaPinged bool
	kaOff    bool

	stop func() bool // ends the tie to the client's context
}

// dial opens a KV.Calls stream on a connection of its own, carrying md
// (and auth as its authorization, if not ""); goAway is called when the
// node announces it is going away.
func (d *callsDialer) dial(md metadata.MD, auth string, goAway func()) (*callsConn, error) {
	ctx, cancel := context.WithTimeout(d.clientCtx, callsDialTimeout)
	defer cancel()
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", d.target)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "shale client: KV.Calls connection to %s: %v", d.target, err)
	}
	// The authority gRPC would use: the credentials' server name (a
	// tls.Config's ServerName) when they set one, else the address.
	authority := d.target
	if sn := d.creds.Info().ServerName; sn != "" {
		authority = sn
	}
	conn, info, err := d.creds.ClientHandshake(ctx, authority, raw)
	if err != nil {
		raw.Close()
		return nil, status.Errorf(codes.Unavailable, "shale client: KV.Calls connection to %s: authentication handshake failed: %v", d.target, err)
	}
	c := newCallsConn(conn, goAway)
	scheme := "http"
	if info != nil && info.AuthType() == "tls" {
		scheme = "https"
	}
	if err := c.open(scheme, authority, md, auth); err != nil {
		conn.Close()
		return nil, status.Errorf(codes.Unavailable, "shale client: KV.Calls connection to %s: %v", d.target, err)
	}
	c.stop = context.AfterFunc(d.clientCtx, c.close)
	c.kaMu.Lock()
	c.ka = time.AfterFunc(callsKeepaliveTime, c.keepaliveTick)
	c.kaMu.Unlock()
	return c, nil
}

// newCallsConn returns a callsConn on conn, an established connection to
// the node, with HTTP/2's initial windows and frame size (the node's
// settings change them); open starts its stream.
func newCallsConn(conn net.Conn, goAway func()) *callsConn {
	c := &callsConn{conn: conn, goAway: goAway, bw: bufio.NewWriterSize(conn, 32<<10),
		connWin: 65535, streamWin: 65535, peerInitial: 65535, maxFrame: 16384}
	c.fcond = sync.NewCond(&c.fmu)
	c.wfr = http2.NewFramer(c.bw, nil)
	c.rfr = http2.NewFramer(nil, bufio.NewReaderSize(conn, 32<<10))
	c.rfr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.rfr.MaxHeaderListSize = 16 << 20
	c.rfr.SetMaxReadFrameSize(1 << 20)
	return c
}

// open writes the connection preface, the settings (the receive windows
// the gRPC connections grant) and the stream's request headers.
func (c *callsConn) open(scheme, authority string, md metadata.MD, auth string) error {
	if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
		return err
	}
	if err := c.wfr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: DefaultWindowBytes}); err != nil {
		return err
	}
	if err := c.wfr.WriteWindowUpdate(0, DefaultConnWindowBytes-65535); err != nil {
		return err
	}
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	field := func(name, value string) { _ = he.WriteField(hpack.HeaderField{Name: name, Value: value}) }
	field(":method", "POST")
	field(":scheme", scheme)
	field(":path", callsPath)
	field(":authority", authority)
	field("content-type", "application/grpc")
	field("te", "trailers")
	if auth != "" {
		field(AuthorizationMetadataKey, auth)
	}
	for k, vs := range md {
		k = strings.ToLower(k)
		if reservedHeader(k) {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			field(k, v)
		}
	}
	// The header block goes in frames of at most the default frame size
	// (the node's settings are not known yet): HEADERS, then
	// CONTINUATION.
	block := hb.Bytes()
	first := block[:min(len(block), 16384)]
	block = block[len(first):]
	if err := c.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: callsStreamID, BlockFragment: first, EndHeaders: len(block) == 0}); err != nil {
		return err
	}
	for len(block) > 0 {
		next := block[:min(len(block), 16384)]
		block = block[len(next):]
		if err := c.wfr.WriteContinuation(callsStreamID, len(block) == 0, next); err != nil {
			return err
		}
	}
	return c.bw.Flush()
}

// reservedHeader reports whether a metadata key is one the stream sets
// itself (or gRPC reserves), left out of its headers as gRPC leaves it.
func reservedHeader(k string) bool {
	switch k {
	case AuthorizationMetadataKey, "content-type", "user-agent", "te", "grpc-timeout", "grpc-encoding",
		"grpc-message-type", "grpc-accept-encoding", "grpc-status", "grpc-message", "grpc-status-details-bin":
		return true
	}
	return strings.HasPrefix(k, ":")
}

// Send sends b as one gRPC message, in DATA frames as large as the node
// accepts, waiting for the node's flow-control windows as needed.
func (c *callsConn) Send(b *shalev1.CallBatch) error {
	n := b.SizeVT()
	if cap(c.enc) < n+5 {
		c.enc = make([]byte, n+5)
	}
	msg := c.enc[:n+5]
	msg[0] = 0 // not compressed
	binary.BigEndian.PutUint32(msg[1:5], uint32(n))
	if _, err := b.MarshalToSizedBufferVT(msg[5:]); err != nil {
		return status.Errorf(codes.Internal, "shale client: encode KV.Calls batch: %v", err)
	}
	for len(msg) > 0 {
		k, err := c.reserve(len(msg))
		if err != nil {
			return err
		}
		c.wmu.Lock()
		err = c.wfr.WriteData(callsStreamID, false, msg[:k])
		msg = msg[k:]
		if err == nil && len(msg) == 0 {
			err = c.bw.Flush()
		}
		c.wmu.Unlock()
		if err != nil {
			c.fail(err)
			return status.Errorf(codes.Unavailable, "shale client: KV.Calls send: %v", err)
		}
	}
	if cap(c.enc) > 64<<10 {
		c.enc = nil // a large batch's buffer is not kept
	}
	return nil
}

// reserve takes up to want bytes of the send windows (and at most a
// frame's), waiting until there are some.
func (c *callsConn) reserve(want int) (int, error) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	for c.failed == nil && (c.connWin <= 0 || c.streamWin <= 0) {
		c.fcond.Wait()
	}
	if c.failed != nil {
		return 0, status.Errorf(codes.Unavailable, "shale client: KV.Calls send: %v", c.failed)
	}
	k := int64(min(want, int(c.maxFrame)))
	k = min(k, c.connWin, c.streamWin)
	c.connWin -= k
	c.streamWin -= k
	return int(k), nil
}

// fail records that the connection failed (senders waiting for a window
// stop) and closes it (the receiver's read fails).
func (c *callsConn) fail(err error) {
	c.fmu.Lock()
	if c.failed == nil {
		c.failed = err
	}
	c.fcond.Broadcast()
	c.fmu.Unlock()
	_ = c.conn.Close()
}

// close ends the stream and the connection.
func (c *callsConn) close() {
	c.fail(net.ErrClosed)
	c.kaMu.Lock()
	c.kaOff = true
	if c.ka != nil {
		c.ka.Stop()
	}
	c.kaMu.Unlock()
	if c.stop != nil {
		c.stop()
	}
}

// control writes a control frame (a settings or ping acknowledgement, a
// window update, a ping) and flushes it.
func (c *callsConn) control(write func() error) {
	c.wmu.Lock()
	err := write()
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(err)
	}
}

// keepaliveTick is the keepalive timer's function: when no frame arrived
// since the last tick it pings the node, and when none arrived either
// within the timeout after a ping it fails the connection.
func (c *callsConn) keepaliveTick() {
	c.kaMu.Lock()
	defer c.kaMu.Unlock()
	if c.kaOff {
		return
	}
	now := c.frames.Load()
	switch {
	case now != c.kaSeen:
		c.kaSeen, c.kaPinged = now, false
		c.ka.Reset(callsKeepaliveTime)
	case c.kaPinged:
		c.fail(errors.New("keepalive ping not answered"))
	default:
		c.kaPinged = true
		c.ka.Reset(callsKeepaliveTimeout)
		// Not under kaMu: a write blocked on a node that reads nothing
		// must not hold up the timeout, which closes the connection.
		go c.control(func() error { return c.wfr.WritePing(false, [8]byte{'s', 'h', 'a', 'l', 'e'}) })
	}
}

// Recv returns the next message of results, handling the frames before it
// (settings, pings, window updates, the node going away); the stream's end
// is an error: its status, or Unavailable when the connection failed.
func (c *callsConn) Recv() (*shalev1.ResultBatch, error) {
	for {
		if rb, err := c.nextMessage(); rb != nil || err != nil {
			return rb, err
		}
		f, err := c.rfr.ReadFrame()
		if err != nil {
			c.fail(err)
			return nil, status.Errorf(codes.Unavailable, "shale client: KV.Calls connection: %v", err)
		}
		c.frames.Add(1)
		if err := c.handle(f); err != nil {
			c.fail(err)
			return nil, err
		}
	}
}

// nextMessage decodes the first whole message received, if any.
func (c *callsConn) nextMessage() (*shalev1.ResultBatch, error) {
	if len(c.msg) < 5 {
		return nil, nil
	}
	if c.msg[0] != 0 {
		return nil, status.Error(codes.Internal, "shale client: KV.Calls: a compressed message (none was asked for)")
	}
	n := int(binary.BigEndian.Uint32(c.msg[1:5]))
	if n > callsMaxRecvBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "shale client: KV.Calls: received message larger than max (%d vs. %d)", n, callsMaxRecvBytes)
	}
	if len(c.msg) < 5+n {
		return nil, nil
	}
	rb := &shalev1.ResultBatch{}
	if err := rb.UnmarshalVT(c.msg[5 : 5+n]); err != nil {
		return nil, status.Errorf(codes.Internal, "shale client: decode KV.Calls results: %v", err)
	}
	// The decoded results copy what they hold: the buffer is reused.
	c.msg = c.msg[:copy(c.msg, c.msg[5+n:])]
	if len(c.msg) == 0 && cap(c.msg) > 64<<10 {
		c.msg = nil
	}
	return rb, nil
}

// handle handles a frame; an error ends the stream.
func (c *callsConn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		if f.StreamID != callsStreamID {
			return nil
		}
		c.msg = append(c.msg, f.Data()...)
		c.unacked += f.Length
		if c.unacked >= callsWindowUpdateBytes {
			n := c.unacked
			c.unacked = 0
			c.control(func() error {
				if err := c.wfr.WriteWindowUpdate(0, n); err != nil {
					return err
				}
				return c.wfr.WriteWindowUpdate(callsStreamID, n)
			})
		}
		if f.StreamEnded() {
			return status.Error(codes.Internal, "shale client: KV.Calls stream ended without a status")
		}
	case *http2.MetaHeadersFrame:
		if f.StreamID != callsStreamID {
			return nil
		}
		if !c.headers {
			c.headers = true
			if err := responseHeadersError(f); err != nil {
				return err
			}
		}
		if f.StreamEnded() {
			return trailerStatus(f)
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		c.fmu.Lock()
		_ = f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingInitialWindowSize:
				// A change applies to the stream's window as a delta.
				c.streamWin += int64(s.Val) - int64(c.peerInitial)
				c.peerInitial = s.Val
			case http2.SettingMaxFrameSize:
				c.maxFrame = s.Val
			}
			return nil
		})
		c.fcond.Broadcast()
		c.fmu.Unlock()
		c.control(c.wfr.WriteSettingsAck)
	case *http2.WindowUpdateFrame:
		c.fmu.Lock()
		switch f.StreamID {
		case 0:
			c.connWin += int64(f.Increment)
		case callsStreamID:
			c.streamWin += int64(f.Increment)
		}
		c.fcond.Broadcast()
		c.fmu.Unlock()
	case *http2.PingFrame:
		if !f.IsAck() {
			c.control(func() error { return c.wfr.WritePing(true, f.Data) })
		}
	case *http2.RSTStreamFrame:
		if f.StreamID != callsStreamID {
			return nil
		}
		code := codes.Internal
		switch f.ErrCode {
		case http2.ErrCodeRefusedStream:
			code = codes.Unavailable
		case http2.ErrCodeCancel:
			code = codes.Canceled
		}
		return status.Errorf(code, "shale client: KV.Calls stream reset by the node: %v", f.ErrCode)
	case *http2.GoAwayFrame:
		if f.LastStreamID < callsStreamID {
			return status.Errorf(codes.Unavailable, "shale client: KV.Calls stream refused: the node is going away (%v)", f.ErrCode)
		}
		if !c.goneAway {
			c.goneAway = true
			if c.goAway != nil {
				c.goAway()
			}
		}
	}
	return nil
}

// responseHeadersError checks the stream's response headers: a gRPC
// response (trailers-only ones included) has HTTP status 200.
func responseHeadersError(f *http2.MetaHeadersFrame) error {
	st := f.PseudoValue("status")
	if st == "200" {
		return nil
	}
	code := codes.Unknown
	switch st {
	case "400":
		code = codes.Internal
	case "401":
		code = codes.Unauthenticated
	case "403":
		code = codes.PermissionDenied
	case "404":
		code = codes.Unimplemented
	case "429", "502", "503", "504":
		code = codes.Unavailable
	}
	return status.Errorf(code, "shale client: KV.Calls: unexpected HTTP status %s", st)
}

// trailerStatus is the stream's status from its trailers: grpc-status,
// grpc-message, and the details of grpc-status-details-bin.
func trailerStatus(f *http2.MetaHeadersFrame) error {
	var code int
	var msg, details string
	var hasCode bool
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "grpc-status":
			n, err := strconv.Atoi(hf.Value)
			if err != nil {
				return status.Errorf(codes.Internal, "shale client: KV.Calls: malformed grpc-status %q", hf.Value)
			}
			code, hasCode = n, true
		case "grpc-message":
			if m, err := url.PathUnescape(hf.Value); err == nil {
				msg = m
			} else {
				msg = hf.Value
			}
		case "grpc-status-details-bin":
			details = hf.Value
		}
	}
	if !hasCode {
		return status.Error(codes.Internal, "shale client: KV.Calls stream ended without grpc-status")
	}
	if details != "" {
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(details, "="))
		if err == nil {
			sp := &spb.Status{}
			if err := proto.Unmarshal(b, sp); err == nil && sp.GetCode() == int32(code) {
				return status.FromProto(sp).Err()
			}
		}
	}
	if code == 0 {
		return status.Error(codes.Unavailable, "shale client: KV.Calls stream closed")
	}
	return status.Error(codes.Code(code), msg)
}
