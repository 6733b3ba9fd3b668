package client

// Tests of WithCredentials (tokens on every call, renewal before expiry and
// after a refusal, wrong passwords), ErrUnauthenticated and
// ErrPermissionDenied, and the Auth API methods, against the fake cluster
// with a fake Auth service and server interceptors that check tokens the
// way the server does.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// fakeToken is a token the fake Auth service issued.
type fakeToken struct {
	user    string
	expires time.Time
	revoked bool
}

// seenCall is a call as the fake's interceptor saw it: its method and the
// authorization metadata it carried.
type seenCall struct {
	method string
	auth   []string
}

// fakeAuth is the fake cluster's authentication: the users, the tokens
// issued, the calls seen, and injectable refusals.
type fakeAuth struct {
	mu       sync.Mutex
	enabled  bool
	users    map[string]string // name → password
	lifetime time.Duration
	tokens   map[string]*fakeToken
	issued   int
	// unavailable Authenticate answers to give before the next success.
	unavailable int
	// deny refuses calls with PermissionDenied.
	deny   func(method string, req any) bool
	seen   []seenCall
	reqs   []proto.Message // Auth requests, Authenticate excepted
	denied int
	// rejections counts the calls refused for their token.
	rejections int
}

// newAuthCluster starts a fake cluster of nodes with the fake Auth service
// and authentication enabled, user alice (password "secret") and root
// (password "rootpw").
func newAuthCluster(t *testing.T, nodes int, splits ...string) (*fakeCluster, *fakeAuth) {
	t.Helper()
	fa := &fakeAuth{enabled: true, users: map[string]string{"alice": "secret", "root": "rootpw"},
		lifetime: time.Hour, tokens: map[string]*fakeToken{}}
	fc := newFakeClusterWith(t, nodes, fakeServerSetup{
		opts: func(*fakeNode) []grpc.ServerOption {
			return []grpc.ServerOption{grpc.UnaryInterceptor(fa.unary), grpc.StreamInterceptor(fa.stream)}
		},
		kv: func(n *fakeNode) shalev1.KVServer { return &watchingKV{fakeKVService{n: n}} },
		register: func(srv *grpc.Server, n *fakeNode) {
			shalev1.RegisterAuthServer(srv, &fakeAuthService{fa: fa})
		},
	}, splits...)
	return fc, fa
}

// watchingKV is the fake KV service with a Watch that sends its first
// (header) response, then waits for the client to end the stream.
type watchingKV struct{ fakeKVService }

func (k *watchingKV) Watch(req *shalev1.WatchRequest, st grpc.ServerStreamingServer[shalev1.WatchResponse]) error {
	if err := st.Send(&shalev1.WatchResponse{Header: &shalev1.ResponseHeader{ShardId: req.GetHeader().GetShardId(), Revision: 1}}); err != nil {
		return err
	}
	<-st.Context().Done()
	return nil
}

// check records a call and refuses it the way the server does: a missing,
// unknown, expired or revoked token is Unauthenticated (saying which), a
// call deny picks is PermissionDenied.
func (fa *fakeAuth) check(ctx context.Context, method string, req any) error {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get(AuthorizationMetadataKey)
	fa.mu.Lock()
	defer fa.mu.Unlock()
	fa.seen = append(fa.seen, seenCall{method: method, auth: auth})
	if method == shalev1.Auth_Authenticate_FullMethodName {
		return nil
	}
	if fa.enabled {
		var why string
		switch {
		case len(auth) == 0:
			why = "authentication required: no token or client certificate"
		case len(auth) > 1 || !strings.HasPrefix(auth[0], "Bearer "):
			why = "malformed authorization metadata"
		default:
			tok := fa.tokens[strings.TrimPrefix(auth[0], "Bearer ")]
			switch {
			case tok == nil:
				why = "invalid token"
			case tok.revoked:
				why = "token revoked"
			case !time.Now().Before(tok.expires):
				why = "token expired"
			}
		}
		if why != "" {
			fa.rejections++
			return status.Error(codes.Unauthenticated, why)
		}
	}
	if fa.deny != nil && fa.deny(method, req) {
		fa.denied++
		return status.Errorf(codes.PermissionDenied, "%s: permission denied", method)
	}
	return nil
}

func (fa *fakeAuth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := fa.check(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (fa *fakeAuth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := fa.check(ss.Context(), info.FullMethod, nil); err != nil {
		return err
	}
	return handler(srv, ss)
}

// tokensOf returns the authorization values the calls of a method (by
// its short name: "Get", "GetRouting", ...) carried, in order.
func (fa *fakeAuth) tokensOf(method string) []string {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	var out []string
	for _, c := range fa.seen {
		if strings.HasSuffix(c.method, "/"+method) {
			out = append(out, strings.Join(c.auth, "|"))
		}
	}
	return out
}

func (fa *fakeAuth) counts() (issued, rejections, denied int) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return fa.issued, fa.rejections, fa.denied
}

// expireAll makes every token issued so far expired (expired) or revoked.
func (fa *fakeAuth) expireAll(revoke bool) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	for _, t := range fa.tokens {
		if revoke {
			t.revoked = true
		} else {
			t.expires = time.Now().Add(-time.Second)
		}
	}
}

func (fa *fakeAuth) set(fn func(fa *fakeAuth)) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	fn(fa)
}

func (fa *fakeAuth) requests() []proto.Message {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return append([]proto.Message(nil), fa.reqs...)
}

type fakeAuthService struct {
	shalev1.UnimplementedAuthServer
	fa *fakeAuth
}

func (s *fakeAuthService) Authenticate(ctx context.Context, req *shalev1.AuthenticateRequest) (*shalev1.AuthenticateResponse, error) {
	fa := s.fa
	fa.mu.Lock()
	defer fa.mu.Unlock()
	switch {
	case fa.unavailable > 0:
		fa.unavailable--
		return nil, status.Error(codes.Unavailable, "no quorum")
	case !fa.enabled:
		return nil, status.Error(codes.FailedPrecondition, "authentication is not enabled")
	}
	if pw, ok := fa.users[req.GetName()]; !ok || pw != req.GetPassword() {
		return nil, status.Error(codes.Unauthenticated, "wrong user name or password")
	}
	fa.issued++
	tok := fmt.Sprintf("tok-%d", fa.issued)
	exp := time.Now().Add(fa.lifetime)
	fa.tokens[tok] = &fakeToken{user: req.GetName(), expires: exp}
	return &shalev1.AuthenticateResponse{Token: tok, ExpiresUnixMs: exp.UnixMilli()}, nil
}

// record notes an Auth request and answers it with resp.
func record[T proto.Message](s *fakeAuthService, req proto.Message, resp T) (T, error) {
	s.fa.mu.Lock()
	defer s.fa.mu.Unlock()
	s.fa.reqs = append(s.fa.reqs, req)
	return resp, nil
}

func (s *fakeAuthService) AuthEnable(_ context.Context, req *shalev1.AuthEnableRequest) (*shalev1.AuthEnableResponse, error) {
	s.fa.set(func(fa *fakeAuth) { fa.enabled = true })
	return record(s, req, &shalev1.AuthEnableResponse{Revision: 2})
}

func (s *fakeAuthService) AuthDisable(_ context.Context, req *shalev1.AuthDisableRequest) (*shalev1.AuthDisableResponse, error) {
	return record(s, req, &shalev1.AuthDisableResponse{Revision: 3})
}

func (s *fakeAuthService) AuthStatus(ctx context.Context, req *shalev1.AuthStatusRequest) (*shalev1.AuthStatusResponse, error) {
	return record(s, req, &shalev1.AuthStatusResponse{Enabled: true, Revision: 7, User: "alice", Roles: []string{"reader"}})
}

func (s *fakeAuthService) AuthRotateKey(_ context.Context, req *shalev1.AuthRotateKeyRequest) (*shalev1.AuthRotateKeyResponse, error) {
	return record(s, req, &shalev1.AuthRotateKeyResponse{Revision: 8, KeyId: "k2"})
}

func (s *fakeAuthService) UserAdd(_ context.Context, req *shalev1.UserAddRequest) (*shalev1.UserAddResponse, error) {
	return record(s, req, &shalev1.UserAddResponse{Revision: 9})
}

func (s *fakeAuthService) UserDelete(_ context.Context, req *shalev1.UserDeleteRequest) (*shalev1.UserDeleteResponse, error) {
	return record(s, req, &shalev1.UserDeleteResponse{Revision: 10})
}

func (s *fakeAuthService) UserChangePassword(_ context.Context, req *shalev1.UserChangePasswordRequest) (*shalev1.UserChangePasswordResponse, error) {
	s.fa.set(func(fa *fakeAuth) {
		fa.users[req.GetName()] = req.GetPassword()
		for _, t := range fa.tokens {
			if t.user == req.GetName() {
				t.revoked = true
			}
		}
	})
	return record(s, req, &shalev1.UserChangePasswordResponse{Revision: 11})
}

func (s *fakeAuthService) UserGrantRole(_ context.Context, req *shalev1.UserGrantRoleRequest) (*shalev1.UserGrantRoleResponse, error) {
	return record(s, req, &shalev1.UserGrantRoleResponse{Revision: 12})
}

func (s *fakeAuthService) UserRevokeRole(_ context.Context, req *shalev1.UserRevokeRoleRequest) (*shalev1.UserRevokeRoleResponse, error) {
	return record(s, req, &shalev1.UserRevokeRoleResponse{Revision: 13})
}

func (s *fakeAuthService) UserGet(_ context.Context, req *shalev1.UserGetRequest) (*shalev1.UserGetResponse, error) {
	return record(s, req, &shalev1.UserGetResponse{User: &shalev1.UserInfo{Name: req.GetName(), Roles: []string{"reader"}, HasPassword: true}})
}

func (s *fakeAuthService) UserList(_ context.Context, req *shalev1.UserListRequest) (*shalev1.UserListResponse, error) {
	return record(s, req, &shalev1.UserListResponse{Users: []*shalev1.UserInfo{{Name: "alice"}, {Name: "root", Roles: []string{"root"}}}})
}

func (s *fakeAuthService) RoleAdd(_ context.Context, req *shalev1.RoleAddRequest) (*shalev1.RoleAddResponse, error) {
	return record(s, req, &shalev1.RoleAddResponse{Revision: 14})
}

func (s *fakeAuthService) RoleDelete(_ context.Context, req *shalev1.RoleDeleteRequest) (*shalev1.RoleDeleteResponse, error) {
	return record(s, req, &shalev1.RoleDeleteResponse{Revision: 15})
}

func (s *fakeAuthService) RoleGrantPermission(_ context.Context, req *shalev1.RoleGrantPermissionRequest) (*shalev1.RoleGrantPermissionResponse, error) {
	return record(s, req, &shalev1.RoleGrantPermissionResponse{Revision: 16})
}

func (s *fakeAuthService) RoleRevokePermission(_ context.Context, req *shalev1.RoleRevokePermissionRequest) (*shalev1.RoleRevokePermissionResponse, error) {
	return record(s, req, &shalev1.RoleRevokePermissionResponse{Revision: 17})
}

func (s *fakeAuthService) RoleGet(_ context.Context, req *shalev1.RoleGetRequest) (*shalev1.RoleGetResponse, error) {
	return record(s, req, &shalev1.RoleGetResponse{Role: &shalev1.Role{Name: req.GetName(), Permissions: []*shalev1.Permission{
		{Type: shalev1.PermissionType_PERMISSION_TYPE_READ, Key: []byte("a"), RangeEnd: []byte("b")}}}})
}

func (s *fakeAuthService) RoleList(_ context.Context, req *shalev1.RoleListRequest) (*shalev1.RoleListResponse, error) {
	return record(s, req, &shalev1.RoleListResponse{Roles: []*shalev1.Role{{Name: "reader"}, {Name: "root"}}})
}

// authClient connects to fc as alice.
func authClient(t *testing.T, fc *fakeCluster, opts ...Option) *Client {
	t.Helper()
	return fc.client(append([]Option{WithCredentials("alice", "secret"), withoutWarmConns()}, opts...)...)
}

// withoutWarmConns keeps the client from opening streams in the background
// (Client.warmConns): the auth tests count every token a node sees, and a
// stream opened in the background at an arbitrary moment (say after the
// test expired the tokens) would add a refusal.
func withoutWarmConns() Option { return func(o *options) { o.noWarmConns = true } }

// TestAuthTokenOnEveryCall checks that the token goes with every kind of
// call: routing, reads, writes, scans, admin, auth and watch streams; and
// not with Authenticate.
func TestAuthTokenOnEveryCall(t *testing.T) {
	fc, fa := newAuthCluster(t, 2, "m")
	c := authClient(t, fc)
	ctx := context.Background()
	if _, err := c.Put(ctx, []byte("apple"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, []byte("zebra"), []byte("2")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, []byte("apple")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MultiGet(ctx, [][]byte{[]byte("apple"), []byte("zebra")}); err != nil {
		t.Fatal(err)
	}
	it := c.Scan(ctx, nil, nil)
	n := 0
	for it.Next() {
		n++
	}
	if err := it.Err(); err != nil || n != 2 {
		t.Fatalf("scan: %d keys, %v", n, err)
	}
	it.Close()
	if _, err := c.ClusterStatus(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UserList(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AuthStatus(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	ch := c.Watch(wctx, []byte("a"), []byte("b"))
	waitFor(t, "a Watch stream", func() bool { return len(fa.tokensOf("Watch")) > 0 })
	cancel()
	for range ch {
	}

	for _, m := range []string{"GetRouting", "Put", "Get", "MultiGet", "ScanStream", "ClusterStatus", "UserList", "AuthStatus", "Watch"} {
		toks := fa.tokensOf(m)
		if len(toks) == 0 {
			t.Errorf("no %s call seen", m)
		}
		for _, tok := range toks {
			if tok != "Bearer tok-1" {
				t.Errorf("%s carried authorization %q, want \"Bearer tok-1\"", m, tok)
			}
		}
	}
	if got := fa.tokensOf("Authenticate"); len(got) != 1 || got[0] != "" {
		t.Errorf("Authenticate calls carried %q; want one call without token", got)
	}
	if issued, rej, _ := fa.counts(); issued != 1 || rej != 0 {
		t.Errorf("%d tokens issued, %d calls refused; want 1, 0", issued, rej)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAuthTokenRefreshedBeforeExpiry checks that the client gets a new
// token before its token expires: calls running through several token
// lifetimes are never refused.
func TestAuthTokenRefreshedBeforeExpiry(t *testing.T) {
	fc, fa := newAuthCluster(t, 1)
	fa.set(func(fa *fakeAuth) { fa.lifetime = 600 * time.Millisecond })
	c := authClient(t, fc)
	end := time.Now().Add(2 * time.Second)
	for time.Now().Before(end) {
		if _, err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	issued, rej, _ := fa.counts()
	if rej != 0 {
		t.Errorf("%d calls refused for their token", rej)
	}
	// Renewals at 2/3 of each 600ms life: at least 3 in 2 s.
	if issued < 3 {
		t.Errorf("%d tokens issued in 2s of 600ms tokens", issued)
	}
}

// TestAuthReauthenticatesOnRefusedToken checks that a call whose token a
// node refuses (expired, revoked) is resent once with a new token and
// succeeds: unary calls, admin calls and watch streams.
func TestAuthReauthenticatesOnRefusedToken(t *testing.T) {
	fc, fa := newAuthCluster(t, 2, "m")
	c := authClient(t, fc)
	ctx := context.Background()
	if _, err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}

	fa.expireAll(false)
	if _, err := c.Get(ctx, []byte("k")); err != nil {
		t.Fatalf("Get after the token expired: %v", err)
	}
	if got, want := fa.tokensOf("Get"), []string{"Bearer tok-1", "Bearer tok-2"}; !equalStrings(got, want) {
		t.Errorf("Get carried %q; want %q", got, want)
	}

	fa.expireAll(true)
	if _, err := c.ClusterStatus(ctx); err != nil {
		t.Fatalf("ClusterStatus after the token was revoked: %v", err)
	}
	if got, want := fa.tokensOf("ClusterStatus"), []string{"Bearer tok-2", "Bearer tok-3"}; !equalStrings(got, want) {
		t.Errorf("ClusterStatus carried %q; want %q", got, want)
	}

	// A watch stream refused for its token is reopened at once with a new
	// one (not after the watch's backoff).
	fa.expireAll(false)
	wctx, cancel := context.WithCancel(ctx)
	ch := c.Watch(wctx, []byte("a"), []byte("b"))
	waitFor(t, "the second Watch stream", func() bool { return len(fa.tokensOf("Watch")) >= 2 })
	cancel()
	for range ch {
	}
	if got, want := fa.tokensOf("Watch"), []string{"Bearer tok-3", "Bearer tok-4"}; !equalStrings(got, want) {
		t.Errorf("Watch carried %q; want %q", got, want)
	}
	if issued, rej, _ := fa.counts(); issued != 4 || rej != 3 {
		t.Errorf("%d tokens issued, %d refusals; want 4, 3", issued, rej)
	}

	// Refused again after a renewal: the call fails (once is enough).
	fa.set(func(fa *fakeAuth) { fa.lifetime = -time.Second }) // tokens born expired
	fa.expireAll(false)
	_, err := c.Get(ctx, []byte("k"))
	if !errors.Is(err, ErrUnauthenticated) || status.Code(err) != codes.Unauthenticated || errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get with tokens that never work: %v; want ErrUnauthenticated", err)
	}
	if issued, _, _ := fa.counts(); issued != 5 {
		t.Errorf("%d tokens issued; want one more", issued)
	}
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00") && len(a) == len(b)
}

// TestAuthNoFailureUnderLoad runs concurrent calls through short token
// lifetimes and a revocation of every token: none fails.
func TestAuthNoFailureUnderLoad(t *testing.T) {
	fc, fa := newAuthCluster(t, 2, "m")
	fa.set(func(fa *fakeAuth) { fa.lifetime = 300 * time.Millisecond })
	c := authClient(t, fc)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	end := time.Now().Add(1500 * time.Millisecond)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprintf("%c%d", 'a'+i*3, i))
			for time.Now().Before(end) {
				if _, err := c.Put(context.Background(), key, []byte("v")); err != nil {
					errc <- err
					return
				}
				if _, err := c.Get(context.Background(), key); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	fa.expireAll(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if issued, _, _ := fa.counts(); issued < 3 {
		t.Errorf("only %d tokens issued", issued)
	}
}

// TestAuthWrongPasswordFailsFast checks that New fails at once when the
// credentials are refused, with ErrUnauthenticated.
func TestAuthWrongPasswordFailsFast(t *testing.T) {
	fc, fa := newAuthCluster(t, 3)
	start := time.Now()
	c, err := New(context.Background(), fc.addrs(), WithCredentials("alice", "wrong"), WithLogger(discardLogger()))
	if err == nil {
		c.Close()
		t.Fatal("New with a wrong password succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("New took %v to fail", d)
	}
	if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrUnavailable) || status.Code(err) != codes.Unauthenticated {
		t.Errorf("New: %v; want ErrUnauthenticated", err)
	}
	if !strings.Contains(err.Error(), "wrong user name or password") {
		t.Errorf("New: %v; want the server's reason", err)
	}
	if n := len(fa.tokensOf("Authenticate")); n != 1 {
		t.Errorf("%d Authenticate calls; want 1", n)
	}
	if n := len(fa.tokensOf("GetRouting")); n != 0 {
		t.Errorf("%d GetRouting calls after a refused password", n)
	}

	// Without credentials, a cluster with auth enabled refuses the routing
	// call: New fails at once too.
	start = time.Now()
	c, err = New(context.Background(), fc.addrs(), WithLogger(discardLogger()))
	if err == nil {
		c.Close()
		t.Fatal("New without credentials succeeded")
	}
	if d := time.Since(start); d > 2*time.Second || !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("New without credentials: %v after %v; want ErrUnauthenticated at once", err, d)
	}

	if _, err := New(context.Background(), fc.addrs(), WithCredentials("", "x")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("New with an empty user name: %v", err)
	}
}

// TestAuthAuthenticateRetried checks that Authenticate is retried while
// the nodes are unavailable.
func TestAuthAuthenticateRetried(t *testing.T) {
	fc, fa := newAuthCluster(t, 2)
	fa.set(func(fa *fakeAuth) { fa.unavailable = 5 })
	c := authClient(t, fc)
	if _, err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if n := len(fa.tokensOf("Authenticate")); n != 6 {
		t.Errorf("%d Authenticate calls; want 6", n)
	}
}

// TestAuthPermissionDenied checks that PermissionDenied is returned at
// once, never retried, as ErrPermissionDenied, for KV and Auth calls, with
// and without credentials.
func TestAuthPermissionDenied(t *testing.T) {
	fc, fa := newAuthCluster(t, 2, "m")
	fa.set(func(fa *fakeAuth) {
		fa.deny = func(method string, req any) bool {
			if r, ok := req.(*shalev1.PutRequest); ok {
				return string(r.GetKey()) == "secret"
			}
			return method == shalev1.Auth_UserAdd_FullMethodName
		}
	})
	c := authClient(t, fc)
	ctx := context.Background()
	_, err := c.Put(ctx, []byte("secret"), []byte("v"))
	if !errors.Is(err, ErrPermissionDenied) || status.Code(err) != codes.PermissionDenied || errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put: %v; want ErrPermissionDenied", err)
	}
	if !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("Put: %q", err)
	}
	if n := len(fa.tokensOf("Put")); n != 1 {
		t.Errorf("%d Put calls; want 1 (not retried)", n)
	}
	err = c.UserAdd(ctx, "bob", "pw", false)
	if !errors.Is(err, ErrPermissionDenied) || status.Code(err) != codes.PermissionDenied {
		t.Fatalf("UserAdd: %v; want ErrPermissionDenied", err)
	}
	if n := len(fa.tokensOf("UserAdd")); n != 1 {
		t.Errorf("%d UserAdd calls; want 1 (not retried)", n)
	}
	if _, err := c.Put(ctx, []byte("open"), []byte("v")); err != nil {
		t.Errorf("Put of an allowed key: %v", err)
	}

	// Without credentials (auth disabled, or identified by certificate),
	// PermissionDenied is typed the same.
	fa.set(func(fa *fakeAuth) { fa.enabled = false })
	c2 := fc.client()
	if _, err := c2.Put(ctx, []byte("secret"), []byte("v")); !errors.Is(err, ErrPermissionDenied) {
		t.Errorf("Put without credentials: %v; want ErrPermissionDenied", err)
	}
}

// TestAuthDisabledThenEnabled checks a client made with credentials while
// the cluster's auth is disabled: it sends no token, and authenticates
// when auth gets enabled.
func TestAuthDisabledThenEnabled(t *testing.T) {
	fc, fa := newAuthCluster(t, 2)
	fa.set(func(fa *fakeAuth) { fa.enabled = false })
	c := authClient(t, fc)
	ctx := context.Background()
	if _, err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if got := fa.tokensOf("Put"); !equalStrings(got, []string{""}) {
		t.Errorf("Put with auth disabled carried %q", got)
	}
	// Enabled by another client: the next call is refused, authenticates
	// and goes again.
	fa.set(func(fa *fakeAuth) { fa.enabled = true })
	if _, err := c.Get(ctx, []byte("k")); err != nil {
		t.Fatal(err)
	}
	if got := fa.tokensOf("Get"); !equalStrings(got, []string{"", "Bearer tok-1"}) {
		t.Errorf("Get carried %q", got)
	}
	// Enabled by this client: it authenticates before its next call.
	fa.set(func(fa *fakeAuth) { fa.enabled = false })
	c2 := authClient(t, fc)
	if err := c2.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Get(ctx, []byte("k")); err != nil {
		t.Fatal(err)
	}
	if got := fa.tokensOf("Get"); len(got) != 3 || got[2] != "Bearer tok-2" {
		t.Errorf("Get carried %q", got)
	}
	if _, rej, _ := fa.counts(); rej != 1 {
		t.Errorf("%d refusals; want 1", rej)
	}
}

// TestAuthChangeOwnPassword checks that a client that changes its own
// user's password goes on with the new one.
func TestAuthChangeOwnPassword(t *testing.T) {
	fc, fa := newAuthCluster(t, 1)
	c := authClient(t, fc)
	ctx := context.Background()
	if err := c.UserChangePassword(ctx, "alice", "newpw"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if issued, rej, _ := fa.counts(); issued != 2 || rej != 0 {
		t.Errorf("%d tokens issued, %d refusals; want 2, 0", issued, rej)
	}
}

// TestAuthAPI checks the request each Auth method sends and what it
// returns.
func TestAuthAPI(t *testing.T) {
	fc, fa := newAuthCluster(t, 2)
	c := fc.client(WithCredentials("root", "rootpw"))
	ctx := context.Background()
	perm := &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: []byte("user/"), Prefix: true}
	steps := []struct {
		call func() error
		want proto.Message
	}{
		{func() error { return c.AuthEnable(ctx) }, &shalev1.AuthEnableRequest{}},
		{func() error { return c.AuthDisable(ctx) }, &shalev1.AuthDisableRequest{}},
		{func() error {
			st, err := c.AuthStatus(ctx)
			if err == nil && (!st.GetEnabled() || st.GetUser() != "alice" || st.GetRevision() != 7) {
				err = fmt.Errorf("AuthStatus = %v", st)
			}
			return err
		}, &shalev1.AuthStatusRequest{}},
		{func() error { return c.AuthRotateKey(ctx) }, &shalev1.AuthRotateKeyRequest{}},
		{func() error { return c.UserAdd(ctx, "bob", "pw", false) }, &shalev1.UserAddRequest{Name: "bob", Password: "pw"}},
		{func() error { return c.UserAdd(ctx, "carol", "", true) }, &shalev1.UserAddRequest{Name: "carol", NoPassword: true}},
		{func() error { return c.UserDelete(ctx, "bob") }, &shalev1.UserDeleteRequest{Name: "bob"}},
		{func() error { return c.UserChangePassword(ctx, "carol", "x") }, &shalev1.UserChangePasswordRequest{Name: "carol", Password: "x"}},
		{func() error { return c.UserGrantRole(ctx, "carol", "reader") }, &shalev1.UserGrantRoleRequest{User: "carol", Role: "reader"}},
		{func() error { return c.UserRevokeRole(ctx, "carol", "reader") }, &shalev1.UserRevokeRoleRequest{User: "carol", Role: "reader"}},
		{func() error {
			u, err := c.UserGet(ctx, "carol")
			if err == nil && (u.GetName() != "carol" || !u.GetHasPassword()) {
				err = fmt.Errorf("UserGet = %v", u)
			}
			return err
		}, &shalev1.UserGetRequest{Name: "carol"}},
		{func() error {
			us, err := c.UserList(ctx)
			if err == nil && len(us) != 2 {
				err = fmt.Errorf("UserList = %v", us)
			}
			return err
		}, &shalev1.UserListRequest{}},
		{func() error { return c.RoleAdd(ctx, "reader") }, &shalev1.RoleAddRequest{Name: "reader"}},
		{func() error { return c.RoleDelete(ctx, "reader") }, &shalev1.RoleDeleteRequest{Name: "reader"}},
		{func() error { return c.RoleGrantPermission(ctx, "reader", perm) }, &shalev1.RoleGrantPermissionRequest{Role: "reader", Permission: perm}},
		{func() error { return c.RoleRevokePermission(ctx, "reader", perm) }, &shalev1.RoleRevokePermissionRequest{Role: "reader", Permission: perm}},
		{func() error {
			r, err := c.RoleGet(ctx, "reader")
			if err == nil && (r.GetName() != "reader" || len(r.GetPermissions()) != 1) {
				err = fmt.Errorf("RoleGet = %v", r)
			}
			return err
		}, &shalev1.RoleGetRequest{Name: "reader"}},
		{func() error {
			rs, err := c.RoleList(ctx)
			if err == nil && len(rs) != 2 {
				err = fmt.Errorf("RoleList = %v", rs)
			}
			return err
		}, &shalev1.RoleListRequest{}},
	}
	for i, s := range steps {
		if err := s.call(); err != nil {
			t.Fatalf("step %d (%T): %v", i, s.want, err)
		}
		reqs := fa.requests()
		if len(reqs) != i+1 || !proto.Equal(reqs[i], s.want) {
			t.Fatalf("step %d: the server got %v; want %v", i, reqs[len(reqs)-1], s.want)
		}
	}
	// Argument checks, without a request.
	if err := c.UserAdd(ctx, "dave", "pw", true); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("UserAdd with a password and noPassword: %v", err)
	}
	if err := c.RoleGrantPermission(ctx, "reader", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("RoleGrantPermission(nil): %v", err)
	}
	if n := len(fa.requests()); n != len(steps) {
		t.Errorf("%d requests; the argument checks sent some", n-len(steps))
	}
}

// TestAuthCallsRetriedOnUnavailable checks that Auth calls move to another
// node when one is down.
func TestAuthCallsRetriedOnUnavailable(t *testing.T) {
	fc, _ := newAuthCluster(t, 3)
	c := fc.client(WithCredentials("root", "rootpw"))
	fc.stopNode(1)
	fc.stopNode(2)
	if err := c.RoleAdd(context.Background(), "reader"); err != nil {
		t.Fatal(err)
	}
}
