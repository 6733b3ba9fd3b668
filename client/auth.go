package client

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// AuthorizationMetadataKey is the gRPC metadata key that carries a token
// from Auth.Authenticate, as "Bearer TOKEN".
const AuthorizationMetadataKey = "authorization"

// tokenRefreshFraction is the part of a token's lifetime after which the
// client gets the next one (in the background, while the current one
// still serves).
const tokenRefreshFraction = 2.0 / 3

// loginAttemptTimeout is the least time one Authenticate attempt is given,
// whatever WithAttemptTimeout says: the node checks the password with
// bcrypt, slow on purpose (about 60 ms of a core, much more on a loaded or
// instrumented node).
const loginAttemptTimeout = 5 * time.Second

// tokenRetryAfter spaces the background renewals that failed: a node that
// refuses the credentials is not asked again on every call.
const tokenRetryAfter = time.Second

// WithCredentials makes the client authenticate as user with password
// (Auth.Authenticate, on any node, retried while the nodes are unavailable)
// before its first call, and send the token it gets with every call it
// makes ("authorization: Bearer TOKEN" metadata, on TLS and plaintext
// connections alike). The client gets a new token when two thirds of the
// current one's life have passed, and when a node refuses a token
// (expired, revoked, signed with an unknown key) it authenticates again and
// resends the call once. New fails at once, with an error matching
// ErrUnauthenticated, when the node refuses the name or password. While the
// cluster's authentication is disabled the client sends no token, and
// authenticates when a node first asks for one.
func WithCredentials(user, password string) Option {
	return func(o *options) {
		o.authUser, o.authPassword, o.authSet = user, password, true
	}
}

// tokenAuth holds the client's credentials and its current token.
type tokenAuth struct {
	c        *Client
	user     string
	password string

	mu sync.Mutex
	// ready: token (empty while the cluster's auth is disabled) may be
	// sent until expireAt (zero: until a node refuses it); from refreshAt
	// on (zero: never) a background renewal gets the next.
	ready     bool
	token     string
	refreshAt time.Time
	expireAt  time.Time
	flight    *authFlight // the renewal in progress, if any
}

// authFlight is one renewal, shared by every call that waits for it.
type authFlight struct {
	done  chan struct{}
	token string
	err   error
}

// startAuth authenticates for New, under New's deadline.
func (c *Client) startAuth(ctx context.Context) error {
	if c.opts.authUser == "" {
		return invalidArgf("WithCredentials: empty user name")
	}
	c.auth = &tokenAuth{c: c, user: c.opts.authUser, password: c.opts.authPassword}
	return c.auth.login(ctx)
}

// login authenticates and installs the token, or records that the
// cluster's authentication is disabled (no token to send).
func (a *tokenAuth) login(ctx context.Context) error {
	a.mu.Lock()
	user, password := a.user, a.password
	a.mu.Unlock()
	resp, err := a.c.authenticate(ctx, user, password)
	now := time.Now()
	if err != nil && !authDisabled(err) {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ready, a.token, a.refreshAt, a.expireAt = true, "", time.Time{}, time.Time{}
	if err != nil {
		a.c.log.Debug("shale client: authentication is not enabled; sending no token", "error", err)
		return nil
	}
	a.token = resp.GetToken()
	if ms := resp.GetExpiresUnixMs(); ms > 0 {
		// The expiry is on the server's clock: the local lifetime is an
		// estimate, and a node's refusal of the token corrects it.
		if life := time.UnixMilli(ms).Sub(now); life > 0 {
			a.refreshAt = now.Add(time.Duration(float64(life) * tokenRefreshFraction))
			a.expireAt = now.Add(life - min(life/10, 10*time.Second))
		}
	}
	return nil
}

// authDisabled reports whether Authenticate's error says the cluster's
// authentication is not enabled (FailedPrecondition), or that the node has
// no Auth service (Unimplemented): there is then no token to send.
func authDisabled(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unimplemented:
		return true
	}
	return false
}

// get returns the token to send: the current one while it is valid
// (starting a background renewal once its refresh time has passed), else
// the result of a renewal, waited for.
func (a *tokenAuth) get(ctx context.Context) (string, error) {
	a.mu.Lock()
	now := time.Now()
	if a.ready && (a.expireAt.IsZero() || now.Before(a.expireAt)) {
		tok := a.token
		if tok != "" && !a.refreshAt.IsZero() && !now.Before(a.refreshAt) && a.flight == nil {
			a.startLocked()
		}
		a.mu.Unlock()
		return tok, nil
	}
	f := a.flight
	if f == nil {
		f = a.startLocked()
	}
	a.mu.Unlock()
	return f.wait(ctx)
}

// renew replaces used, a token a node refused, and returns the new one
// (the current one if another call renewed it already). fresh reports that
// this call started the authentication that issued it, after the refusal:
// a token another call obtained may predate a revocation of every token.
func (a *tokenAuth) renew(ctx context.Context, used string) (tok string, fresh bool, _ error) {
	a.mu.Lock()
	if a.ready && a.token != used && (a.expireAt.IsZero() || time.Now().Before(a.expireAt)) {
		tok := a.token
		a.mu.Unlock()
		return tok, false, nil
	}
	a.ready = false // the other calls wait for the renewal too
	f := a.flight
	if f == nil {
		f = a.startLocked()
		fresh = true
	}
	a.mu.Unlock()
	tok, err := f.wait(ctx)
	return tok, fresh, err
}

// renewals resends a call whose token a node refused with a renewed one:
// again if that one, which another call obtained, is refused too (it may
// predate a revocation of every token), but never after a fresh token is
// refused. send sends with a token and returns the call's error.
func (a *tokenAuth) renewals(ctx context.Context, tok string, err error, send func(tok string) error) (string, error) {
	for i := 0; i < 2 && rejected(err, tok); i++ {
		var fresh bool
		var rerr error
		if tok, fresh, rerr = a.renew(ctx, tok); rerr != nil {
			return tok, rpcError(ctx, rerr)
		}
		err = send(tok)
		if fresh {
			break
		}
	}
	return tok, err
}

// invalidate drops the current token (or the knowledge that auth is
// disabled), so that the next call authenticates first; a new password
// replaces the old when not empty.
func (a *tokenAuth) invalidate(password string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ready = false
	if password != "" {
		a.password = password
	}
}

// startLocked starts a renewal, tied to the client's lifetime (and its
// default timeout), not to the call that needed it. a.mu is held.
func (a *tokenAuth) startLocked() *authFlight {
	f := &authFlight{done: make(chan struct{})}
	a.flight = f
	go func() {
		ctx, cancel := a.c.callContext(a.c.ctx)
		err := a.login(ctx)
		cancel()
		a.mu.Lock()
		a.flight = nil
		f.token, f.err = a.token, err
		if err != nil {
			a.refreshAt = time.Now().Add(tokenRetryAfter)
			a.c.log.Debug("shale client: renewing the token failed", "user", a.user, "error", err)
		}
		a.mu.Unlock()
		close(f.done)
	}()
	return f
}

func (f *authFlight) wait(ctx context.Context) (string, error) {
	select {
	case <-f.done:
		return f.token, f.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// rejected reports whether err is a node's refusal of the token tok that
// a new token may cure: Unauthenticated saying the token expired, was
// revoked or is invalid, or asking for one when none was sent (the
// cluster's auth was enabled since the client learnt it was not).
func rejected(err error, tok string) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unauthenticated {
		return false
	}
	if tok == "" {
		return true
	}
	msg := strings.ToLower(st.Message())
	for _, w := range []string{"token", "expired", "revoked"} {
		if strings.Contains(msg, w) {
			return true
		}
	}
	return false
}

// rpcError turns the error of getting a token into one a call's retry loop
// understands: the refusal of the credentials as it is (final), the end of
// the call's context as its status, anything else as Unavailable (the
// call retries, and a later attempt authenticates again).
func rpcError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrPermissionDenied), errors.Is(err, ErrClosed):
		return err
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Errorf(codes.Unavailable, "authenticate: %v", err)
}

// withToken adds the token to ctx's outgoing metadata (nothing for none).
func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, AuthorizationMetadataKey, "Bearer "+tok)
}

// tokenCall makes a unary call with the client's token: send sends it with
// a token ("" for none) and returns its error. A token refused by the node
// is renewed and the call resent (see renewals); the error returned is
// typed (authTyped). Without WithCredentials the call is sent once, with
// no token. It is the one place a unary call's authentication happens,
// whether through the interceptors or on the direct path (kvConn.callDirect).
func (c *Client) tokenCall(ctx context.Context, method string, send func(tok string) error) error {
	a := c.auth
	if a == nil {
		return authTyped(send(""))
	}
	tok, err := a.get(ctx)
	if err != nil {
		return rpcError(ctx, err)
	}
	err = send(tok)
	if rejected(err, tok) {
		c.log.Debug("shale client: token refused; authenticating again", "method", method, "error", err)
		_, err = a.renewals(ctx, tok, err, send)
	}
	return authTyped(err)
}

// authInterceptors attach the token to every call on a connection (not to
// Authenticate itself), authenticate again and resend a call when a node
// refuses the token (see renewals), and type Unauthenticated and PermissionDenied
// errors (ErrUnauthenticated, ErrPermissionDenied). Without WithCredentials
// they only type the errors.
func (c *Client) authInterceptors() []grpc.DialOption {
	a := c.auth
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == shalev1.Auth_Authenticate_FullMethodName {
				return authTyped(invoker(ctx, method, req, reply, cc, opts...))
			}
			return c.tokenCall(ctx, method, func(tok string) error {
				return invoker(withToken(ctx, tok), method, req, reply, cc, opts...)
			})
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			var tok string
			if a != nil {
				var err error
				if tok, err = a.get(ctx); err != nil {
					return nil, rpcError(ctx, err)
				}
			}
			s, err := streamer(withToken(ctx, tok), desc, cc, method, opts...)
			if a != nil && rejected(err, tok) {
				tok, err = a.renewals(ctx, tok, err, func(tok string) error {
					var serr error
					s, serr = streamer(withToken(ctx, tok), desc, cc, method, opts...)
					return serr
				})
			}
			if err != nil {
				return nil, authTyped(err)
			}
			return &authStream{ClientStream: s, a: a, ctx: ctx, desc: desc, cc: cc, method: method,
				streamer: streamer, opts: opts, tok: tok}, nil
		}),
	}
}

// authStream types a stream's errors and, for a server stream (one
// request, then responses) refused for its token before it delivered
// anything, authenticates again and reopens it once with the same request.
// Like any ClientStream, it is received from by one goroutine at a time.
type authStream struct {
	grpc.ClientStream
	a        *tokenAuth
	ctx      context.Context
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	tok      string

	sent     any  // the request of a server stream
	closed   bool // CloseSend was called
	received bool // a response arrived
	retried  bool
}

func (s *authStream) SendMsg(m any) error {
	if !s.desc.ClientStreams {
		s.sent = m
	}
	return authTyped(s.ClientStream.SendMsg(m))
}

func (s *authStream) CloseSend() error {
	s.closed = true
	return s.ClientStream.CloseSend()
}

func (s *authStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.received = true
		return nil
	}
	if s.a == nil || s.retried || s.received || s.desc.ClientStreams || s.sent == nil || !s.closed || !rejected(err, s.tok) {
		return authTyped(err)
	}
	s.retried = true
	tok, _, rerr := s.a.renew(s.ctx, s.tok)
	if rerr != nil {
		return rpcError(s.ctx, rerr)
	}
	ns, nerr := s.streamer(withToken(s.ctx, tok), s.desc, s.cc, s.method, s.opts...)
	if nerr != nil {
		return authTyped(nerr)
	}
	// A failed send shows in the next receive, with the stream's status.
	_ = ns.SendMsg(s.sent)
	_ = ns.CloseSend()
	s.ClientStream, s.tok = ns, tok
	return s.RecvMsg(m)
}

// authenticate asks the nodes in turn (the last that answered, the
// endpoints, the known nodes) for a token, passing over them with backoff
// until one answers, one refuses the credentials (returned at once: wrong
// name or password), every one refuses the connection's security
// (returned at once), or ctx ends.
func (c *Client) authenticate(ctx context.Context, user, password string) (*shalev1.AuthenticateResponse, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	req := &shalev1.AuthenticateRequest{Name: user, Password: password}
	var last error
	for attempt := 1; ; attempt++ {
		resp, err, final := c.authenticateOnce(ctx, req)
		switch {
		case err == nil:
			return resp, nil
		case final:
			return nil, wrapOp("authenticate", err)
		}
		if ctx.Err() == nil {
			last = err
		}
		if securityRefusal(err) {
			return nil, fmt.Errorf("shale: authenticate: refused by every endpoint's security (TLS or credentials): %w", err)
		}
		reason := ctx.Err()
		if reason == nil && callOver(ctx) {
			reason = context.DeadlineExceeded
		}
		if reason == nil && c.opts.maxAttempts > 0 && attempt >= c.opts.maxAttempts {
			reason = errAttempts
		}
		if reason == nil && !sleep(ctx, c.backoff(attempt)) {
			reason = ctx.Err()
		}
		if reason != nil {
			if c.isClosed() {
				return nil, ErrClosed
			}
			return nil, &retryError{op: "authenticate", reason: reason, last: last}
		}
	}
}

// authenticateOnce asks each node once; final reports an answer retrying
// cannot change (a refusal of the credentials, auth not enabled, a closed
// client).
func (c *Client) authenticateOnce(ctx context.Context, req *shalev1.AuthenticateRequest) (_ *shalev1.AuthenticateResponse, _ error, final bool) {
	var errs []error
	for _, addr := range c.adminAddrs() {
		cc, err := c.conn(addr)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return nil, err, true
			}
			errs = append(errs, err)
			continue
		}
		actx, acancel := ctx, context.CancelFunc(func() {})
		if c.opts.attemptTimeout > 0 {
			actx, acancel = context.WithTimeout(ctx, max(c.opts.attemptTimeout, loginAttemptTimeout))
		}
		resp, err := shalev1.NewAuthClient(cc).Authenticate(actx, req)
		acancel()
		if err == nil {
			c.rt.mu.Lock()
			c.rt.lastGood = addr
			c.rt.mu.Unlock()
			return resp, nil, false
		}
		if c.isClosed() {
			return nil, ErrClosed, true
		}
		st := status.Convert(err)
		c.log.Debug("shale client: Authenticate failed", "address", addr, "error", err)
		switch {
		case statusDetails(st).notLeader != nil, overloaded(st), st.Code() == codes.Aborted:
		case st.Code() == codes.Unavailable, ctxCode(st.Code()):
			if callOver(ctx) {
				return nil, fmt.Errorf("%s: %w", addr, typed(err)), false
			}
		default:
			return nil, typed(err), true
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, typed(err)))
	}
	if len(errs) == 0 {
		return nil, errors.New("shale: no address to authenticate with"), false
	}
	return nil, errors.Join(errs...), false
}

// invokeAuth runs an Auth request on any node (see invokeAnyNode).
func (c *Client) invokeAuth(ctx context.Context, op string, mutation bool, fn func(ctx context.Context, a shalev1.AuthClient) error) error {
	if mutation {
		// One ID for every attempt: the cluster makes the change once,
		// though an attempt that failed may have made it.
		ctx = metadata.AppendToOutgoingContext(ctx, shalev1.RequestIDMetadataKey, hex.EncodeToString(newRequestID()))
	}
	return c.invokeAnyNode(ctx, op, mutation, func(ctx context.Context, cc grpc.ClientConnInterface) error {
		return fn(ctx, shalev1.NewAuthClient(cc))
	})
}

// authCall runs an Auth mutation that answers only a revision.
func (c *Client) authCall(ctx context.Context, op string, fn func(ctx context.Context, a shalev1.AuthClient) error) error {
	return wrapOp(op, c.invokeAuth(ctx, op, true, fn))
}

// AuthEnable turns the cluster's authentication and access control on:
// from then on every call needs a user (a token or a client certificate),
// and may do only what the user's roles allow. It fails (FailedPrecondition)
// unless a user "root" with the root role exists. A client made
// WithCredentials while auth was disabled authenticates on its next call.
func (c *Client) AuthEnable(ctx context.Context) error {
	err := c.authCall(ctx, "auth-enable", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.AuthEnable(ctx, &shalev1.AuthEnableRequest{})
		return err
	})
	if err == nil && c.auth != nil {
		c.auth.invalidate("")
	}
	return err
}

// AuthDisable turns authentication and access control off: every caller
// may then do everything. Needs the root role.
func (c *Client) AuthDisable(ctx context.Context) error {
	return c.authCall(ctx, "auth-disable", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.AuthDisable(ctx, &shalev1.AuthDisableRequest{})
		return err
	})
}

// AuthStatus reports whether authentication is enabled, the auth state's
// revision, and the caller's user and roles as the node sees them (none
// while auth is disabled). Any authenticated user may ask.
func (c *Client) AuthStatus(ctx context.Context) (*shalev1.AuthStatusResponse, error) {
	var resp *shalev1.AuthStatusResponse
	err := c.invokeAuth(ctx, "auth-status", false, func(ctx context.Context, a shalev1.AuthClient) error {
		var err error
		resp, err = a.AuthStatus(ctx, &shalev1.AuthStatusRequest{})
		return err
	})
	if err != nil {
		return nil, wrapOp("auth-status", err)
	}
	return resp, nil
}

// AuthRotateKey makes a new token signing key: new tokens are signed with
// it, and tokens signed with the previous keys stay valid until they
// expire. Needs the root role.
func (c *Client) AuthRotateKey(ctx context.Context) error {
	return c.authCall(ctx, "auth-rotate-key", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.AuthRotateKey(ctx, &shalev1.AuthRotateKeyRequest{})
		return err
	})
}

// UserAdd adds a user with a password, or, with noPassword (password must
// then be empty), a user that authenticates only with a client certificate
// whose common name is its name. Needs the root role.
func (c *Client) UserAdd(ctx context.Context, name, password string, noPassword bool) error {
	if noPassword && password != "" {
		return wrapOp("user-add", invalidArgf("a user without password given a password"))
	}
	req := &shalev1.UserAddRequest{Name: name, Password: password, NoPassword: noPassword}
	return c.authCall(ctx, "user-add", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.UserAdd(ctx, req)
		return err
	})
}

// UserDelete removes a user; its tokens stop working at once. Needs the
// root role.
func (c *Client) UserDelete(ctx context.Context, name string) error {
	return c.authCall(ctx, "user-delete", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.UserDelete(ctx, &shalev1.UserDeleteRequest{Name: name})
		return err
	})
}

// UserChangePassword sets a user's password; the user's earlier tokens stop
// working at once. When name is the client's own user (WithCredentials),
// the client goes on with the new password. Needs the root role.
func (c *Client) UserChangePassword(ctx context.Context, name, password string) error {
	err := c.authCall(ctx, "user-change-password", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.UserChangePassword(ctx, &shalev1.UserChangePasswordRequest{Name: name, Password: password})
		return err
	})
	if err == nil && c.auth != nil && c.auth.user == name {
		c.auth.invalidate(password)
	}
	return err
}

// UserGrantRole gives a user a role. Needs the root role.
func (c *Client) UserGrantRole(ctx context.Context, user, role string) error {
	return c.authCall(ctx, "user-grant-role", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.UserGrantRole(ctx, &shalev1.UserGrantRoleRequest{User: user, Role: role})
		return err
	})
}

// UserRevokeRole takes a role from a user. Needs the root role.
func (c *Client) UserRevokeRole(ctx context.Context, user, role string) error {
	return c.authCall(ctx, "user-revoke-role", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.UserRevokeRole(ctx, &shalev1.UserRevokeRoleRequest{User: user, Role: role})
		return err
	})
}

// UserGet describes a user: its roles and whether it has a password. An
// unknown user is a gRPC NotFound error. Needs the root role.
func (c *Client) UserGet(ctx context.Context, name string) (*shalev1.UserInfo, error) {
	var resp *shalev1.UserGetResponse
	err := c.invokeAuth(ctx, "user-get", false, func(ctx context.Context, a shalev1.AuthClient) error {
		var err error
		resp, err = a.UserGet(ctx, &shalev1.UserGetRequest{Name: name})
		return err
	})
	if err != nil {
		return nil, wrapOp("user-get", err)
	}
	return resp.GetUser(), nil
}

// UserList describes every user. Needs the root role.
func (c *Client) UserList(ctx context.Context) ([]*shalev1.UserInfo, error) {
	var resp *shalev1.UserListResponse
	err := c.invokeAuth(ctx, "user-list", false, func(ctx context.Context, a shalev1.AuthClient) error {
		var err error
		resp, err = a.UserList(ctx, &shalev1.UserListRequest{})
		return err
	})
	if err != nil {
		return nil, wrapOp("user-list", err)
	}
	return resp.GetUsers(), nil
}

// RoleAdd adds a role without permissions. Needs the root role.
func (c *Client) RoleAdd(ctx context.Context, name string) error {
	return c.authCall(ctx, "role-add", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.RoleAdd(ctx, &shalev1.RoleAddRequest{Name: name})
		return err
	})
}

// RoleDelete removes a role and takes it from every user that held it.
// Needs the root role.
func (c *Client) RoleDelete(ctx context.Context, name string) error {
	return c.authCall(ctx, "role-delete", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.RoleDelete(ctx, &shalev1.RoleDeleteRequest{Name: name})
		return err
	})
}

// RoleGrantPermission adds a permission to a role: reading, writing or
// both on one key, a range [Key, RangeEnd) or, with Prefix, the keys
// starting with Key. Needs the root role.
func (c *Client) RoleGrantPermission(ctx context.Context, role string, p *shalev1.Permission) error {
	if p == nil {
		return wrapOp("role-grant-permission", invalidArgf("no permission"))
	}
	req := &shalev1.RoleGrantPermissionRequest{Role: role, Permission: p}
	return c.authCall(ctx, "role-grant-permission", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.RoleGrantPermission(ctx, req)
		return err
	})
}

// RoleRevokePermission removes the role's permission on exactly p's keys
// (a gRPC NotFound error when it has none there). Needs the root role.
func (c *Client) RoleRevokePermission(ctx context.Context, role string, p *shalev1.Permission) error {
	if p == nil {
		return wrapOp("role-revoke-permission", invalidArgf("no permission"))
	}
	req := &shalev1.RoleRevokePermissionRequest{Role: role, Permission: p}
	return c.authCall(ctx, "role-revoke-permission", func(ctx context.Context, a shalev1.AuthClient) error {
		_, err := a.RoleRevokePermission(ctx, req)
		return err
	})
}

// RoleGet returns a role with its permissions. An unknown role is a gRPC
// NotFound error. Needs the root role.
func (c *Client) RoleGet(ctx context.Context, name string) (*shalev1.Role, error) {
	var resp *shalev1.RoleGetResponse
	err := c.invokeAuth(ctx, "role-get", false, func(ctx context.Context, a shalev1.AuthClient) error {
		var err error
		resp, err = a.RoleGet(ctx, &shalev1.RoleGetRequest{Name: name})
		return err
	})
	if err != nil {
		return nil, wrapOp("role-get", err)
	}
	return resp.GetRole(), nil
}

// RoleList returns every role with its permissions. Needs the root role.
func (c *Client) RoleList(ctx context.Context) ([]*shalev1.Role, error) {
	var resp *shalev1.RoleListResponse
	err := c.invokeAuth(ctx, "role-list", false, func(ctx context.Context, a shalev1.AuthClient) error {
		var err error
		resp, err = a.RoleList(ctx, &shalev1.RoleListRequest{})
		return err
	})
	if err != nil {
		return nil, wrapOp("role-list", err)
	}
	return resp.GetRoles(), nil
}
