package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/tlsconfig"
	"github.com/shale-db/shale/server/auth"
)

// Who may call what, once auth is enabled (docs/api.md, "Authentication
// and access control"):
//   - open to anyone: health checks, reflection, Auth.Authenticate;
//   - node-to-node RPCs: node certificates only (checkPeerOnly);
//   - any authenticated user: Admin.GetRouting (clients route with it),
//     Auth.AuthStatus;
//   - KV RPCs: a permission on every key or range they touch;
//   - every other Admin and Auth RPC: the root role.
var (
	openMethods = []string{
		"/grpc.health.v1.Health/",
		"/grpc.reflection.",
		"/shale.v1.Auth/Authenticate",
	}
	anyUserMethods = map[string]bool{
		"/shale.v1.Admin/GetRouting": true,
		"/shale.v1.Auth/AuthStatus":  true,
	}
)

// authMetrics count authentication and authorization outcomes.
type authMetrics struct {
	logins *prometheus.CounterVec // result: ok, failed
	denied *prometheus.CounterVec // reason: unauthenticated, permission_denied
}

func newAuthMetrics(reg prometheus.Registerer) *authMetrics {
	m := &authMetrics{
		logins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_auth_logins_total",
			Help: "Auth.Authenticate calls this node answered, by result (ok, failed)."}, []string{"result"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_auth_denied_total",
			Help: "Requests this node refused for auth, by reason (unauthenticated, permission_denied, login_failed)."}, []string{"reason"}),
	}
	reg.MustRegister(m.logins, m.denied)
	return m
}

// tokenCache remembers verified tokens of one auth state (revision rev),
// so that a token's signature is checked once, not on every request. It
// starts over whenever the auth state changes, and refuses entries
// verified under another revision.
type tokenCache struct {
	mu  sync.RWMutex
	rev uint64
	m   map[string]cachedToken
}

type cachedToken struct {
	user    string
	expires time.Time
}

// tokenCacheMax bounds the tokens remembered; past it the cache starts
// over.
const tokenCacheMax = 10000

// reset empties the cache for the auth state at revision rev.
func (c *tokenCache) reset(rev uint64) {
	c.mu.Lock()
	c.rev, c.m = rev, nil
	c.mu.Unlock()
}

func (c *tokenCache) get(tok string, rev uint64, now time.Time) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.m[tok]
	if !ok || rev != c.rev || !now.Before(e.expires) {
		return "", false
	}
	return e.user, true
}

func (c *tokenCache) put(tok string, rev uint64, user string, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev != c.rev {
		return
	}
	if c.m == nil || len(c.m) >= tokenCacheMax {
		c.m = map[string]cachedToken{}
	}
	c.m[tok] = cachedToken{user: user, expires: expires}
}

// identify returns the caller's user: another node (by its certificate), a
// token's user, or a verified client certificate's common name (with
// --client-cert-auth).
func (n *Node) identify(ctx context.Context, st *auth.Store) (string, error) {
	if _, ok := tlsconfig.PeerName(ctx); ok {
		return auth.NodeUser, nil
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			tok, found := strings.CutPrefix(v[0], "Bearer ")
			if !found {
				return "", status.Error(codes.Unauthenticated, "the authorization metadata must be 'Bearer TOKEN'")
			}
			now := time.Now()
			if u, ok := n.tokens.get(tok, st.Revision(), now); ok {
				return u, nil
			}
			u, exp, err := st.VerifyToken(tok, now)
			if err != nil {
				return "", err
			}
			n.tokens.put(tok, st.Revision(), u, exp)
			return u, nil
		}
	}
	if n.cfg.TLS.ClientCertAuth {
		if cn, ok := tlsconfig.ClientCertName(ctx); ok {
			if !st.HasUser(cn) {
				return "", status.Errorf(codes.Unauthenticated, "the client certificate's user %q does not exist", cn)
			}
			return cn, nil
		}
	}
	return "", status.Error(codes.Unauthenticated, "authentication required: log in (shalectl --user; client.WithCredentials in the Go SDK) or present a client certificate")
}

// authorize decides a call of method whose request is req (nil for a
// stream before its first message): nil to serve it, else the error to
// answer.
func (n *Node) authorize(ctx context.Context, method string, req any) (user string, err error) {
	for _, m := range openMethods {
		if strings.HasPrefix(method, m) {
			return "", nil
		}
	}
	if isPeerOnly(method) {
		return "", n.checkPeerOnly(ctx, method)
	}
	st := n.auth()
	if st == nil {
		if _, ok := tlsconfig.PeerName(ctx); ok {
			return auth.NodeUser, nil
		}
		return "", errAuthNotLoaded
	}
	if !st.Enabled() {
		return "", nil
	}
	if n.tls == nil {
		return "", errAuthNeedsTLS
	}
	user, err = n.identify(ctx, st)
	if err != nil {
		n.authDenied(ctx, "unauthenticated", method, "", err)
		return "", err
	}
	switch {
	case st.IsRoot(user), anyUserMethods[method]:
		return user, nil
	case strings.HasPrefix(method, "/shale.v1.KV/"):
		if req == nil {
			return user, nil // checked on the stream's first message
		}
		for _, nd := range kvNeeds(req) {
			if err := st.Check(user, nd.perm, nd.span); err != nil {
				n.authDenied(ctx, "permission_denied", method, user, err)
				return "", err
			}
		}
		return user, nil
	}
	err = status.Errorf(codes.PermissionDenied, "user %q may not call %s: it needs the root role", user, method)
	n.authDenied(ctx, "permission_denied", method, user, err)
	return "", err
}

func (n *Node) authDenied(ctx context.Context, reason, method, user string, err error) {
	n.authm.denied.WithLabelValues(reason).Inc()
	remote := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		remote = p.Addr.String()
	}
	n.log.Warn("auth: request refused", "reason", reason, "method", method, "user", user, "remote", remote, "err", status.Convert(err).Message())
}

// need is one permission a request needs.
type need struct {
	perm auth.Perm
	span auth.Span
}

// kvNeeds lists the permissions a KV request needs: read for what it reads
// (gets, scans, watches, compares, previous values), write for what it
// changes.
func kvNeeds(req any) []need {
	key := func(p auth.Perm, k []byte) need { return need{p, auth.KeySpan(k)} }
	rng := func(p auth.Perm, start, end, prefix []byte) need {
		if len(prefix) > 0 {
			return need{p, auth.PrefixSpan(prefix)}
		}
		return need{p, auth.RangeSpan(start, end)}
	}
	var out []need
	ops := func(ops []*shalev1.RequestOp) {
		for _, op := range ops {
			switch o := op.GetOp().(type) {
			case *shalev1.RequestOp_Put:
				out = append(out, key(auth.Write, o.Put.GetKey()))
				if o.Put.GetPrevKv() {
					out = append(out, key(auth.Read, o.Put.GetKey()))
				}
			case *shalev1.RequestOp_Delete:
				out = append(out, key(auth.Write, o.Delete.GetKey()))
				if o.Delete.GetPrevKv() {
					out = append(out, key(auth.Read, o.Delete.GetKey()))
				}
			case *shalev1.RequestOp_DeleteRange:
				out = append(out, rng(auth.Write, o.DeleteRange.GetStartKey(), o.DeleteRange.GetEndKey(), nil))
			case *shalev1.RequestOp_Get:
				out = append(out, key(auth.Read, o.Get.GetKey()))
			}
		}
	}
	switch r := req.(type) {
	case *shalev1.GetRequest:
		out = append(out, key(auth.Read, r.GetKey()))
	case *shalev1.MultiGetRequest:
		for _, k := range r.GetKeys() {
			out = append(out, key(auth.Read, k))
		}
	case *shalev1.PutRequest:
		out = append(out, key(auth.Write, r.GetKey()))
		if r.GetPrevKv() {
			out = append(out, key(auth.Read, r.GetKey()))
		}
	case *shalev1.DeleteRequest:
		out = append(out, key(auth.Write, r.GetKey()))
		if r.GetPrevKv() {
			out = append(out, key(auth.Read, r.GetKey()))
		}
	case *shalev1.DeleteRangeRequest:
		out = append(out, rng(auth.Write, r.GetStartKey(), r.GetEndKey(), nil))
	case *shalev1.ScanRequest:
		out = append(out, rng(auth.Read, r.GetStartKey(), r.GetEndKey(), r.GetPrefix()))
	case *shalev1.BatchRequest:
		ops(r.GetOps())
	case *shalev1.CompareAndSwapRequest:
		out = append(out, key(auth.Read, r.GetKey()), key(auth.Write, r.GetKey()))
	case *shalev1.TxnRequest:
		for _, c := range r.GetCompares() {
			out = append(out, key(auth.Read, c.GetKey()))
		}
		ops(r.GetSuccess())
		ops(r.GetFailure())
	case *shalev1.WatchRequest:
		out = append(out, rng(auth.Read, r.GetStartKey(), r.GetEndKey(), r.GetPrefix()))
	default:
		// An unknown KV request: nothing a user may do without root.
		out = append(out, need{auth.Read, auth.RangeSpan(nil, nil)}, need{auth.Write, auth.RangeSpan(nil, nil)})
	}
	return out
}

// authUnaryInterceptor authorizes unary calls.
func (n *Node) authUnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := n.authorizeCall(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// authorizeCall authorizes a unary call of method with req, and returns
// the context its handler runs in (which names its user).
func (n *Node) authorizeCall(ctx context.Context, method string, req any) (context.Context, error) {
	user, err := n.authorize(ctx, method, req)
	if err != nil {
		return nil, err
	}
	return withCaller(ctx, user), nil
}

// authStreamInterceptor authorizes streams: the method first, then the
// request on its first message; a watch is ended when its user loses the
// permission to read its range.
func (n *Node) authStreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	user, err := n.authorize(ss.Context(), info.FullMethod, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(withCaller(ss.Context(), user))
	defer cancel(nil)
	as := &authStream{ServerStream: ss, ctx: ctx, n: n, method: info.FullMethod, cancel: cancel}
	err = handler(srv, as)
	if cause := context.Cause(ctx); cause != nil && status.Code(cause) == codes.PermissionDenied {
		return cause
	}
	return err
}

// authStream checks a stream's first request and, for watches, registers
// the watch for re-checks when the auth state changes.
type authStream struct {
	grpc.ServerStream
	ctx     context.Context
	n       *Node
	method  string
	cancel  context.CancelCauseFunc
	checked bool
	watch   *authWatch
}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.checked {
		return nil
	}
	s.checked = true
	if s.method == shalev1.KV_Calls_FullMethodName {
		return nil // each call is authorized as its unary method (serveCall)
	}
	user, err := s.n.authorize(s.ServerStream.Context(), s.method, m)
	if err != nil {
		return err
	}
	if w, ok := m.(*shalev1.WatchRequest); ok && user != "" {
		s.watch = s.n.watchAuth.add(user, kvNeeds(w), s.cancel)
		context.AfterFunc(s.ctx, func() { s.n.watchAuth.remove(s.watch) })
	}
	return nil
}

// callerKey carries the authenticated user of a call in its context.
type callerKey struct{}

func withCaller(ctx context.Context, user string) context.Context {
	if user == "" {
		return ctx
	}
	return context.WithValue(ctx, callerKey{}, user)
}

// caller returns the authenticated user of a call ("" while auth is
// disabled).
func caller(ctx context.Context) string {
	u, _ := ctx.Value(callerKey{}).(string)
	return u
}

// authWatches are the open watches of users, re-checked on every auth
// change.
type authWatches struct {
	mu sync.Mutex
	m  map[*authWatch]struct{}
}

type authWatch struct {
	user   string
	needs  []need
	cancel context.CancelCauseFunc
}

func (w *authWatches) add(user string, needs []need, cancel context.CancelCauseFunc) *authWatch {
	aw := &authWatch{user: user, needs: needs, cancel: cancel}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[*authWatch]struct{}{}
	}
	w.m[aw] = struct{}{}
	return aw
}

func (w *authWatches) remove(aw *authWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, aw)
}

// recheckWatches ends every open watch whose user may no longer read its
// range under st, with PermissionDenied.
func (n *Node) recheckWatches(st *auth.Store) {
	n.watchAuth.mu.Lock()
	var ended []*authWatch
	var errs []error
	for aw := range n.watchAuth.m {
		var err error
		for _, nd := range aw.needs {
			// Check allows everything while auth is off, and refuses a
			// user that no longer exists.
			if err = st.Check(aw.user, nd.perm, nd.span); err != nil {
				break
			}
		}
		if err != nil {
			ended = append(ended, aw)
			errs = append(errs, err)
		}
	}
	n.watchAuth.mu.Unlock()
	for i, aw := range ended {
		n.log.Info("auth: watch ended: its user lost the permission", "user", aw.user, "err", status.Convert(errs[i]).Message())
		aw.cancel(errs[i])
	}
}
