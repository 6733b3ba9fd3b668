package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/tlsconfig"
)

// Default values of the client options.
const (
	// DefaultTimeout is the per-call timeout applied when the caller's
	// context has no deadline (see WithDefaultTimeout).
	DefaultTimeout = 10 * time.Second
	// DefaultAttemptTimeout bounds each attempt of a call (see
	// WithAttemptTimeout).
	DefaultAttemptTimeout = 3 * time.Second
	// DefaultBackoffInitial and DefaultBackoffMax bound the retry backoff
	// (see WithBackoff).
	DefaultBackoffInitial = 20 * time.Millisecond
	DefaultBackoffMax     = time.Second
	// DefaultWindowBytes and DefaultConnWindowBytes are the HTTP/2
	// flow-control windows (per stream, per connection) the client grants
	// the nodes, the same as shale-server's defaults. Override them with
	// WithDialOptions(grpc.WithInitialWindowSize(...), ...).
	DefaultWindowBytes     = 2 << 20
	DefaultConnWindowBytes = 16 << 20
	// DefaultReconnectBackoffMax caps the wait between attempts to
	// reconnect to a node that refuses or drops connections (see
	// WithReconnectBackoff); gRPC's own cap is 120 s.
	DefaultReconnectBackoffMax = 5 * time.Second
)

// Option configures a Client in New.
type Option func(*options)

type options struct {
	dialOpts       []grpc.DialOption
	backoffInitial time.Duration
	backoffMax     time.Duration
	logger         *slog.Logger
	defaultTimeout time.Duration
	attemptTimeout time.Duration
	maxAttempts    int
	addrMap        func(string) string
	reconnectMax   time.Duration
	// tlsCreds (WithTLS) or tlsFiles (WithTLSFiles) replace the insecure
	// credentials.
	tlsCreds  credentials.TransportCredentials
	tlsFiles  *tlsconfig.Files
	tlsReload time.Duration
	// authUser and authPassword are WithCredentials' (authSet).
	authUser, authPassword string
	authSet                bool
	// unaryCalls (WithUnaryCalls) keeps KV calls off KV.Calls streams.
	unaryCalls bool
	// tracer is WithTracerProvider's (nil: the client makes no spans).
	tracer trace.Tracer
	// directCalls: a request's KV calls go straight onto the connection's
	// KV.Calls stream (kvConn.callDirect), bypassing gRPC's Invoke and the
	// interceptor chain; set when KV.Calls is on and no dial options were
	// given (they may hold interceptors that must see every call). The
	// KV.Calls streams then go over connections of their own (callsConn).
	directCalls bool
	// noWarmConns keeps the client from connecting to nodes before a
	// request needs them (warmConns); tests that count each stream's
	// requests set it.
	noWarmConns bool
	// creds secure every connection: tlsCreds, tlsFiles' or plaintext.
	creds credentials.TransportCredentials
}

// WithDialOptions sets the gRPC dial options used for every node
// connection, replacing the default (insecure transport credentials, or
// those of WithTLS or WithTLSFiles, which come before them). With any dial
// option, every KV call goes through gRPC's Invoke, so that interceptors
// among them see it; without, KV calls may skip it (docs/client.md, "The direct path").
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append([]grpc.DialOption(nil), opts...) }
}

// WithAddressMap translates every node address before the client dials it:
// the endpoints and the addresses the cluster reports for its nodes (their
// --advertise addresses). Use it when the client reaches the nodes on
// other addresses than the nodes use among themselves: from outside a
// Kubernetes cluster through port-forwards or per-pod load balancers, or
// from outside a container network. The function must be safe for
// concurrent use; returning its argument leaves an address as it is.
func WithAddressMap(fn func(addr string) string) Option {
	return func(o *options) { o.addrMap = fn }
}

// WithBackoff sets the retry backoff: the n-th consecutive retry waits a
// random duration in [0, min(max, initial·2ⁿ)) ("full jitter"). Defaults:
// DefaultBackoffInitial and DefaultBackoffMax. Non-positive values keep the
// defaults.
func WithBackoff(initial, max time.Duration) Option {
	return func(o *options) {
		if initial > 0 {
			o.backoffInitial = initial
		}
		if max > 0 {
			o.backoffMax = max
		}
	}
}

// WithReconnectBackoff caps the wait between attempts to reconnect to a
// node whose connection failed: a node back from an outage is reached again
// at most about max (plus 20% jitter) after it serves again. Default
// DefaultReconnectBackoffMax; non-positive keeps the default. A
// grpc.WithConnectParams given in WithDialOptions takes precedence.
func WithReconnectBackoff(max time.Duration) Option {
	return func(o *options) {
		if max > 0 {
			o.reconnectMax = max
		}
	}
}

// WithUnaryCalls makes every KV request its own unary gRPC call. By
// default a connection's KV requests go over one KV.Calls stream, which
// sends the requests made at the same time together and gets their
// responses together (unary calls to a node without it).
func WithUnaryCalls() Option {
	return func(o *options) { o.unaryCalls = true }
}

// WithLogger sets the logger for retries and routing changes (debug level)
// and connection problems (warn level). Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithDefaultTimeout sets the timeout applied to a call (including all its
// retries) whose context has no deadline. Default DefaultTimeout; 0 means no
// timeout (retries then continue until the context is cancelled).
func WithDefaultTimeout(d time.Duration) Option {
	return func(o *options) { o.defaultTimeout = d }
}

// WithAttemptTimeout bounds each attempt (one RPC to one replica) of a
// call, so that a replica that does not answer (a partitioned or stalled
// node) is given up for the next one before the call's deadline. Default
// DefaultAttemptTimeout; 0 means attempts are bounded only by the call's
// deadline.
func WithAttemptTimeout(d time.Duration) Option {
	return func(o *options) { o.attemptTimeout = d }
}

// WithMaxAttempts caps the attempts of one call (the first try included).
// Default 0: unlimited, retries end only at the call's deadline.
func WithMaxAttempts(n int) Option {
	return func(o *options) { o.maxAttempts = n }
}

// adminRoutingMaxAge is Client.routingMaxAge.
const adminRoutingMaxAge = 30 * time.Second

// Client is a connection to a Shale cluster. It is safe for concurrent use;
// Close releases its connections.
type Client struct {
	opts      options
	log       *slog.Logger
	endpoints []string

	// ctx is cancelled by Close; background routing refreshes use it.
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// muxes are the KV.Calls multiplexers of the connections in conns
	// when the direct path is allowed (options.directCalls).
	muxes map[*grpc.ClientConn]*callMux
	// retired are connections that reached the wrong node, closed a
	// while after (see retire).
	retired map[*grpc.ClientConn]struct{}
	closed  bool

	rt routing
	// routingMaxAge is the age past which a call to any node (Admin and
	// Auth calls) refreshes the routing table in the background, so that a
	// client making only such calls learns of added nodes before the ones
	// it knows are removed (adminRoutingMaxAge).
	routingMaxAge time.Duration
	// auth holds the credentials and token of WithCredentials (nil
	// without).
	auth *tokenAuth
}

// refusedGiveUp is how long New keeps trying while every endpoint refuses
// connections: long enough for a node that is restarting to listen again.
const refusedGiveUp = 2 * time.Second

// checkEndpoint refuses an endpoint that gRPC would resolve to a port
// nobody meant (a host without a port dials 443). A target with a scheme
// (dns:///, unix:, passthrough:///) is left to gRPC.
func checkEndpoint(e string) error {
	if strings.Contains(e, "://") || strings.HasPrefix(e, "unix:") {
		return nil
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil || port == "" {
		h := strings.TrimSuffix(e, ":")
		if err == nil {
			h = host
		}
		return invalidArgf("endpoint %q has no port: give host:port (a node's client port, shale-server --listen: %s by default)",
			e, net.JoinHostPort(strings.Trim(h, "[]"), "7001"))
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return invalidArgf("endpoint %q: port %q is not a number from 1 to 65535", e, port)
	}
	return nil
}

// New connects to the cluster reachable through endpoints (host:port
// addresses of any of its nodes; an endpoint without a port is
// ErrInvalidArgument) and loads the routing table from the first that
// answers Admin.GetRouting. It fails, with an error matching
// ErrUnavailable, when none answers before ctx's deadline (or the default
// timeout), or sooner, after refusedGiveUp (2 s), when every endpoint
// refuses connections: "no node reachable at ...: connection refused". With WithCredentials it authenticates first, and fails at once,
// with an error matching ErrUnauthenticated, when the credentials are
// refused. Connections to nodes are made lazily, one per node address.
func New(ctx context.Context, endpoints []string, opts ...Option) (*Client, error) {
	o := options{
		backoffInitial: DefaultBackoffInitial,
		backoffMax:     DefaultBackoffMax,
		logger:         slog.Default(),
		defaultTimeout: DefaultTimeout,
		attemptTimeout: DefaultAttemptTimeout,
		reconnectMax:   DefaultReconnectBackoffMax,
		tlsReload:      DefaultTLSReloadInterval,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.backoffMax < o.backoffInitial {
		o.backoffMax = o.backoffInitial
	}
	creds, tlsSrc, err := o.transportCredentials()
	if err != nil {
		return nil, err
	}
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	o.creds = creds
	o.directCalls = !o.unaryCalls && len(o.dialOpts) == 0
	// Dial options the caller gave come after the credentials and win.
	o.dialOpts = append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dialOpts...)
	var eps []string
	for _, e := range endpoints {
		if e = strings.TrimSpace(e); e != "" {
			if err := checkEndpoint(e); err != nil {
				return nil, err
			}
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, invalidArgf("no endpoints")
	}
	c := &Client{
		opts:      o,
		log:       o.logger,
		endpoints: eps,
		conns:     map[string]*grpc.ClientConn{},
		muxes:     map[*grpc.ClientConn]*callMux{},
		retired:   map[*grpc.ClientConn]struct{}{},

		routingMaxAge: adminRoutingMaxAge,
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if tlsSrc != nil {
		go tlsSrc.Watch(c.ctx, o.tlsReload)
	}
	c.rt.init()
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	if o.authSet {
		if err := c.startAuth(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	var last error
	var refusedSince time.Time
	for attempt := 1; ; attempt++ {
		err := c.refreshRouting(ctx, -1)
		if err == nil {
			return c, nil
		}
		if ctx.Err() == nil {
			last = err
		}
		if securityRefusal(err) {
			// A refused handshake or credentials: waiting cures nothing.
			c.Close()
			return nil, fmt.Errorf("shale: connect: refused by every endpoint's security (TLS or credentials): %w", err)
		}
		if !connectionRefused(err) {
			refusedSince = time.Time{}
		} else if refusedSince.IsZero() {
			refusedSince = time.Now()
		} else if time.Since(refusedSince) >= refusedGiveUp {
			// Nothing listens at any endpoint, and has not for a while:
			// a wrong address or a stopped cluster, not a blip.
			c.Close()
			return nil, &refusedError{endpoints: eps, cause: err}
		}
		reason := ctx.Err()
		if reason == nil && o.maxAttempts > 0 && attempt >= o.maxAttempts {
			reason = errAttempts
		}
		if reason == nil && !sleep(ctx, c.backoff(attempt)) {
			reason = ctx.Err()
		}
		if reason != nil {
			c.Close()
			return nil, &retryError{op: "connect", reason: reason, last: last}
		}
	}
}

// Close closes every connection. Calls in progress fail with ErrClosed (or
// a cancellation error); later calls fail with ErrClosed. Close is
// idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conns, retired := c.conns, c.retired
	c.conns, c.retired = nil, nil
	c.mu.Unlock()
	c.cancel()
	var errs []error
	for addr, cc := range conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close connection to %s: %w", addr, err))
		}
	}
	for cc := range retired {
		_ = cc.Close() // it reached the wrong node; nothing to report
	}
	return errors.Join(errs...)
}

// conn returns the connection to addr, creating it on first use.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	cc, _, err := c.connMux(addr)
	return cc, err
}

// connMux returns the connection to addr, creating it on first use, and
// its KV.Calls multiplexer when KV calls may take the direct path onto it
// (nil otherwise).
func (c *Client) connMux(addr string) (*grpc.ClientConn, *callMux, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, c.muxes[cc], nil
	}
	// Scan pages and MultiGet answers may be large: accept up to 64 MiB.
	// Fixed flow-control windows turn off gRPC's bandwidth estimator and
	// its PING round trip after every response. Dial options given by the
	// caller come later and win.
	// Keepalive pings find a connection to an address gone silent (a
	// node restarted elsewhere) within 15 s, so that it is redialed.
	// Reconnects start after 100 ms and grow by 1.6 up to reconnectMax
	// (gRPC's default grows to 120 s, which kept a node back from a long
	// outage without traffic for up to two minutes).
	// Messages are encoded by the generated methods (proto/codec), not by
	// protobuf's reflection.
	reconnect := backoff.DefaultConfig
	reconnect.BaseDelay = min(100*time.Millisecond, c.opts.reconnectMax)
	reconnect.MaxDelay = c.opts.reconnectMax
	opts := append([]grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 20 * time.Second}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		codec.DialOption(),
		grpc.WithInitialWindowSize(DefaultWindowBytes),
		grpc.WithInitialConnWindowSize(DefaultConnWindowBytes),
	}, c.opts.dialOpts...)
	var cc *grpc.ClientConn
	opts = append(opts, c.traceInterceptors()...)
	opts = append(opts, c.wrongNodeInterceptors(addr, &cc)...)
	opts = append(opts, c.authInterceptors()...)
	opts = append(opts, grpc.WithChainUnaryInterceptor(sentInterceptor))
	var mux *callMux
	if !c.opts.unaryCalls {
		mux = &callMux{}
		opts = append(opts, grpc.WithChainUnaryInterceptor(mux.intercept))
	}
	target := addr
	if c.opts.addrMap != nil {
		target = c.opts.addrMap(addr)
	}
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("shale: connect to %s: %w", target, err)
	}
	c.conns[addr] = cc
	if !c.opts.directCalls {
		mux = nil
	}
	if mux != nil {
		if t := callsTarget(target); t != "" {
			mux.dialer = &callsDialer{target: t, creds: c.opts.creds, clientCtx: c.ctx}
		}
		c.muxes[cc] = mux
	}
	return cc, mux, nil
}

// warmConns connects, in the background, to every node of the routing
// table to which the client has no open KV.Calls stream, and opens one: the first request a node must serve (the leader of a split's new
// shard, or of a shard whose leadership moved) then does not wait for a
// dial and a stream's opening, which, when many clients meet a split at
// once, queued behind each other on a busy node. A node that cannot be
// reached is dialed again by the first request that needs it.
func (c *Client) warmConns() {
	if c.opts.noWarmConns {
		return
	}
	for id, addr := range c.rt.nodeAddrs() {
		c.mu.Lock()
		cc, have := c.conns[addr]
		mux := c.muxes[cc]
		closed := c.closed
		c.mu.Unlock()
		if addr == "" || closed || (have && (mux == nil || mux.warm())) {
			continue
		}
		go c.warmConn(id, addr)
	}
}

// warmConn opens the connection to node id at addr and its KV.Calls
// stream, with the current token when the client logs in.
func (c *Client) warmConn(id uint64, addr string) {
	cc, mux, err := c.connMux(addr)
	if err != nil {
		return
	}
	if mux == nil || mux.isUnary() {
		cc.Connect()
		return
	}
	auth := ""
	if c.auth != nil {
		ctx, cancel := context.WithTimeout(c.ctx, DefaultTimeout)
		tok, err := c.auth.get(ctx)
		cancel()
		if err != nil {
			return
		}
		if tok == "" {
			// The cluster's auth is off for now; a stream opened without a
			// token would be refused once it is on.
			cc.Connect()
			return
		}
		auth = "Bearer " + tok
	}
	mux.streamFor(cc, auth, strconv.FormatUint(id, 10), nil)
}

// isClosed reports whether Close was called.
func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// callContext applies the default timeout to a context without deadline,
// and ties the call to the client's lifetime.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); !ok && c.opts.defaultTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.opts.defaultTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Endpoints returns the endpoints the client was created with.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Routing returns a copy of the client's current routing table: the shards
// sorted by start key, each with its last known leader, and the node
// addresses by node ID. It is a snapshot for inspection (shalectl uses it);
// the client keeps it up to date on its own.
func (c *Client) Routing() ([]*shalev1.RoutedShard, map[uint64]string) {
	return c.rt.snapshot()
}
