package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// authFake is a one-node fake cluster (the KV and Admin fakes of
// cluster_fake_test.go, one shard) with a fake Auth service that records
// the requests, issues tokens, and, once enabled, refuses calls without a
// valid token; alice may not write the key "secret".
type authFake struct {
	*fakeCluster
	mu      sync.Mutex
	enabled bool
	users   map[string]string // name → password
	tokens  map[string]string // token → user
	reqs    []proto.Message   // Auth requests but Authenticate
	auths   []*shalev1.AuthenticateRequest
	// calls are the methods called with the authorization they carried.
	calls []string
	puts  int
}

func newAuthFake(t *testing.T) *authFake {
	t.Helper()
	fa := &authFake{users: map[string]string{"root": "rootpw", "alice": "alicepw"}, tokens: map[string]string{}}
	fc := &fakeCluster{data: map[string]*fakeEntry{}, removed: map[uint64]bool{}, pageSize: 2,
		decommissioning: map[uint64]bool{}}
	fc.shards = []*fakeShard{{desc: &shalev1.ShardDescriptor{ShardId: 1, Epoch: 1,
		Replicas: []*shalev1.ReplicaDescriptor{{NodeId: 1, ReplicaId: 1}}}, leader: 1}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(fa.intercept))
	shalev1.RegisterKVServer(srv, &fakeKV{c: fc, node: 1})
	shalev1.RegisterAdminServer(srv, &fakeAdmin{c: fc, node: 1})
	shalev1.RegisterAuthServer(srv, &fakeAuthServer{fa: fa})
	go srv.Serve(lis)
	fc.servers = append(fc.servers, srv)
	fc.nodes = append(fc.nodes, &shalev1.NodeDescriptor{NodeId: 1, Address: lis.Addr().String()})
	t.Cleanup(srv.Stop)
	fa.fakeCluster = fc
	return fa
}

func (fa *authFake) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := strings.Join(md.Get("authorization"), "|")
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	fa.mu.Lock()
	fa.calls = append(fa.calls, method+" "+auth)
	user := fa.tokens[strings.TrimPrefix(auth, "Bearer ")]
	enabled := fa.enabled
	if method == "Put" {
		fa.puts++
	}
	fa.mu.Unlock()
	if enabled && method != "Authenticate" {
		if user == "" {
			return nil, status.Error(codes.Unauthenticated, "authentication required")
		}
		if p, ok := req.(*shalev1.PutRequest); ok && user == "alice" && string(p.GetKey()) == "secret" {
			return nil, status.Errorf(codes.PermissionDenied, "user alice may not write %q", p.GetKey())
		}
	}
	return handler(ctx, req)
}

func (fa *authFake) requests() []proto.Message {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return append([]proto.Message(nil), fa.reqs...)
}

func (fa *authFake) lastRequest(t *testing.T) proto.Message {
	t.Helper()
	reqs := fa.requests()
	if len(reqs) == 0 {
		t.Fatal("no Auth request")
	}
	return reqs[len(reqs)-1]
}

func (fa *authFake) authentications() []*shalev1.AuthenticateRequest {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return append([]*shalev1.AuthenticateRequest(nil), fa.auths...)
}

func (fa *authFake) callLog() []string {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return append([]string(nil), fa.calls...)
}

type fakeAuthServer struct {
	shalev1.UnimplementedAuthServer
	fa *authFake
}

func (s *fakeAuthServer) Authenticate(_ context.Context, req *shalev1.AuthenticateRequest) (*shalev1.AuthenticateResponse, error) {
	fa := s.fa
	fa.mu.Lock()
	defer fa.mu.Unlock()
	fa.auths = append(fa.auths, req)
	if !fa.enabled {
		return nil, status.Error(codes.FailedPrecondition, "authentication is not enabled")
	}
	if pw, ok := fa.users[req.GetName()]; !ok || pw != req.GetPassword() {
		return nil, status.Error(codes.Unauthenticated, "wrong user name or password")
	}
	tok := fmt.Sprintf("tok-%s-%d", req.GetName(), len(fa.auths))
	fa.tokens[tok] = req.GetName()
	return &shalev1.AuthenticateResponse{Token: tok, ExpiresUnixMs: time.Now().Add(10 * time.Minute).UnixMilli()}, nil
}

func rec[T proto.Message](s *fakeAuthServer, req proto.Message, resp T) (T, error) {
	s.fa.mu.Lock()
	defer s.fa.mu.Unlock()
	s.fa.reqs = append(s.fa.reqs, req)
	return resp, nil
}

func (s *fakeAuthServer) AuthEnable(_ context.Context, r *shalev1.AuthEnableRequest) (*shalev1.AuthEnableResponse, error) {
	s.fa.mu.Lock()
	s.fa.enabled = true
	s.fa.mu.Unlock()
	return rec(s, r, &shalev1.AuthEnableResponse{Revision: 5})
}

func (s *fakeAuthServer) AuthDisable(_ context.Context, r *shalev1.AuthDisableRequest) (*shalev1.AuthDisableResponse, error) {
	s.fa.mu.Lock()
	s.fa.enabled = false
	s.fa.mu.Unlock()
	return rec(s, r, &shalev1.AuthDisableResponse{Revision: 6})
}

func (s *fakeAuthServer) AuthStatus(ctx context.Context, r *shalev1.AuthStatusRequest) (*shalev1.AuthStatusResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.fa.mu.Lock()
	user := s.fa.tokens[strings.TrimPrefix(strings.Join(md.Get("authorization"), ""), "Bearer ")]
	enabled := s.fa.enabled
	s.fa.mu.Unlock()
	resp := &shalev1.AuthStatusResponse{Enabled: enabled, Revision: 7, User: user}
	if user == "root" {
		resp.Roles = []string{"root"}
	}
	return rec(s, r, resp)
}

func (s *fakeAuthServer) AuthRotateKey(_ context.Context, r *shalev1.AuthRotateKeyRequest) (*shalev1.AuthRotateKeyResponse, error) {
	return rec(s, r, &shalev1.AuthRotateKeyResponse{Revision: 8, KeyId: "k2"})
}

func (s *fakeAuthServer) UserAdd(_ context.Context, r *shalev1.UserAddRequest) (*shalev1.UserAddResponse, error) {
	if r.GetName() == "dup" {
		return nil, status.Error(codes.AlreadyExists, "user dup already exists")
	}
	return rec(s, r, &shalev1.UserAddResponse{Revision: 9})
}

func (s *fakeAuthServer) UserDelete(_ context.Context, r *shalev1.UserDeleteRequest) (*shalev1.UserDeleteResponse, error) {
	return rec(s, r, &shalev1.UserDeleteResponse{Revision: 10})
}

func (s *fakeAuthServer) UserChangePassword(_ context.Context, r *shalev1.UserChangePasswordRequest) (*shalev1.UserChangePasswordResponse, error) {
	return rec(s, r, &shalev1.UserChangePasswordResponse{Revision: 11})
}

func (s *fakeAuthServer) UserGrantRole(_ context.Context, r *shalev1.UserGrantRoleRequest) (*shalev1.UserGrantRoleResponse, error) {
	return rec(s, r, &shalev1.UserGrantRoleResponse{Revision: 12})
}

func (s *fakeAuthServer) UserRevokeRole(_ context.Context, r *shalev1.UserRevokeRoleRequest) (*shalev1.UserRevokeRoleResponse, error) {
	return rec(s, r, &shalev1.UserRevokeRoleResponse{Revision: 13})
}

func (s *fakeAuthServer) UserGet(_ context.Context, r *shalev1.UserGetRequest) (*shalev1.UserGetResponse, error) {
	if r.GetName() == "ghost" {
		return nil, status.Error(codes.NotFound, "user ghost not found")
	}
	return rec(s, r, &shalev1.UserGetResponse{User: &shalev1.UserInfo{Name: r.GetName(), Roles: []string{"reader", "writer"}, HasPassword: true}})
}

func (s *fakeAuthServer) UserList(_ context.Context, r *shalev1.UserListRequest) (*shalev1.UserListResponse, error) {
	return rec(s, r, &shalev1.UserListResponse{Users: []*shalev1.UserInfo{
		{Name: "alice", Roles: []string{"reader"}, HasPassword: true},
		{Name: "agent"},
		{Name: "root", Roles: []string{"root"}, HasPassword: true}}})
}

func (s *fakeAuthServer) RoleAdd(_ context.Context, r *shalev1.RoleAddRequest) (*shalev1.RoleAddResponse, error) {
	return rec(s, r, &shalev1.RoleAddResponse{Revision: 14})
}

func (s *fakeAuthServer) RoleDelete(_ context.Context, r *shalev1.RoleDeleteRequest) (*shalev1.RoleDeleteResponse, error) {
	return rec(s, r, &shalev1.RoleDeleteResponse{Revision: 15})
}

func (s *fakeAuthServer) RoleGrantPermission(_ context.Context, r *shalev1.RoleGrantPermissionRequest) (*shalev1.RoleGrantPermissionResponse, error) {
	return rec(s, r, &shalev1.RoleGrantPermissionResponse{Revision: 16})
}

func (s *fakeAuthServer) RoleRevokePermission(_ context.Context, r *shalev1.RoleRevokePermissionRequest) (*shalev1.RoleRevokePermissionResponse, error) {
	return rec(s, r, &shalev1.RoleRevokePermissionResponse{Revision: 17})
}

var (
	permRead      = shalev1.PermissionType_PERMISSION_TYPE_READ
	permWrite     = shalev1.PermissionType_PERMISSION_TYPE_WRITE
	permReadWrite = shalev1.PermissionType_PERMISSION_TYPE_READWRITE
)

// fakeRoles are the roles RoleGet and RoleList report.
var fakeRoles = []*shalev1.Role{
	{Name: "app", Permissions: []*shalev1.Permission{
		{Type: permReadWrite, Key: []byte("a"), RangeEnd: []byte("b")},
		{Type: permRead, Key: []byte("user/"), Prefix: true},
		{Type: permWrite, Key: []byte("x")},
		{Type: permRead, Prefix: true},
		{Type: permRead, Key: []byte("k\x00"), RangeEnd: []byte("k\xff")},
	}},
	{Name: "empty"},
	{Name: "root"},
}

func (s *fakeAuthServer) RoleGet(_ context.Context, r *shalev1.RoleGetRequest) (*shalev1.RoleGetResponse, error) {
	for _, role := range fakeRoles {
		if role.GetName() == r.GetName() {
			return rec(s, r, &shalev1.RoleGetResponse{Role: role})
		}
	}
	return nil, status.Errorf(codes.NotFound, "role %s not found", r.GetName())
}

func (s *fakeAuthServer) RoleList(_ context.Context, r *shalev1.RoleListRequest) (*shalev1.RoleListResponse, error) {
	return rec(s, r, &shalev1.RoleListResponse{Roles: fakeRoles})
}

// shalectlIn runs shalectl with stdin.
func shalectlIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx := context.WithValue(context.Background(), stdinKey{}, io.Reader(strings.NewReader(stdin)))
	code := run(ctx, args, &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// okIn runs shalectl with stdin and requires success.
func okIn(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	r := shalectlIn(t, stdin, args...)
	if r.code != 0 {
		t.Fatalf("shalectl %q: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// failsIn runs shalectl with stdin, requires exit status 1 and returns its
// stderr.
func failsIn(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	r := shalectlIn(t, stdin, args...)
	if r.code != 1 {
		t.Fatalf("shalectl %q: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stderr
}

func TestAuthCommandsRequests(t *testing.T) {
	t.Parallel()
	fa := newAuthFake(t)
	perm := func(typ shalev1.PermissionType, key, end string, prefix bool) *shalev1.Permission {
		p := &shalev1.Permission{Type: typ, Key: []byte(key), Prefix: prefix}
		if end != "" {
			p.RangeEnd = []byte(end)
		}
		return p
	}
	steps := []struct {
		stdin string
		args  []string
		want  proto.Message
		out   []string
	}{
		{"", []string{"user", "add", "root:rootpw"}, &shalev1.UserAddRequest{Name: "root", Password: "rootpw"}, []string{"user root added"}},
		{"", []string{"user", "add", "agent", "--no-password"}, &shalev1.UserAddRequest{Name: "agent", NoPassword: true}, []string{"user agent added"}},
		{"s3cret:with colon\nignored\n", []string{"user", "add", "bob", "--password-stdin"}, &shalev1.UserAddRequest{Name: "bob", Password: "s3cret:with colon"}, nil},
		{"last line without newline", []string{"user", "add", "carol", "--password-stdin"}, &shalev1.UserAddRequest{Name: "carol", Password: "last line without newline"}, nil},
		{"", []string{"user", "grant-role", "root", "root"}, &shalev1.UserGrantRoleRequest{User: "root", Role: "root"}, []string{"role root granted to user root"}},
		{"", []string{"user", "revoke-role", "bob", "app"}, &shalev1.UserRevokeRoleRequest{User: "bob", Role: "app"}, []string{"role app revoked from user bob"}},
		{"newpw\r\n", []string{"user", "passwd", "bob", "--password-stdin"}, &shalev1.UserChangePasswordRequest{Name: "bob", Password: "newpw"}, []string{"password of user bob changed"}},
		{"", []string{"user", "delete", "bob"}, &shalev1.UserDeleteRequest{Name: "bob"}, []string{"user bob deleted"}},
		{"", []string{"role", "add", "app"}, &shalev1.RoleAddRequest{Name: "app"}, []string{"role app added"}},
		{"", []string{"role", "grant", "app", "read", "user/", "--prefix"},
			&shalev1.RoleGrantPermissionRequest{Role: "app", Permission: perm(permRead, "user/", "", true)}, []string{`role app: granted read prefix "user/"`}},
		{"", []string{"role", "grant", "app", "readwrite", "a", "b"},
			&shalev1.RoleGrantPermissionRequest{Role: "app", Permission: perm(permReadWrite, "a", "b", false)}, []string{"role app: granted readwrite [a, b)"}},
		{"", []string{"role", "grant", "app", "WRITE", "x"},
			&shalev1.RoleGrantPermissionRequest{Role: "app", Permission: perm(permWrite, "x", "", false)}, []string{`role app: granted write key "x"`}},
		{"", []string{"role", "grant", "app", "read", "", "--prefix"},
			&shalev1.RoleGrantPermissionRequest{Role: "app", Permission: perm(permRead, "", "", true)}, []string{`granted read prefix "" (every key)`}},
		{"", []string{"role", "grant-permission", "--hex", "app", "read", "0x6100", "ff"},
			&shalev1.RoleGrantPermissionRequest{Role: "app", Permission: perm(permRead, "a\x00", "\xff", false)}, []string{"granted read [0x6100, 0xff)"}},
		{"", []string{"role", "revoke", "app", "read", "user/", "--prefix"},
			&shalev1.RoleRevokePermissionRequest{Role: "app", Permission: perm(permRead, "user/", "", true)}, []string{`role app: revoked read prefix "user/"`}},
		{"", []string{"role", "revoke-permission", "app", "readwrite", "a", "b"},
			&shalev1.RoleRevokePermissionRequest{Role: "app", Permission: perm(permReadWrite, "a", "b", false)}, []string{"revoked readwrite [a, b)"}},
		{"", []string{"role", "delete", "app"}, &shalev1.RoleDeleteRequest{Name: "app"}, []string{"role app deleted"}},
		{"", []string{"auth", "enable"}, &shalev1.AuthEnableRequest{}, []string{"authentication enabled"}},
		{"", []string{"--user", "root:rootpw", "auth", "status"}, &shalev1.AuthStatusRequest{},
			[]string{"enabled:   yes", "revision:  7", "user:      root", "roles:     root"}},
		{"", []string{"--user", "root:rootpw", "auth", "rotate-key"}, &shalev1.AuthRotateKeyRequest{}, []string{"token signing key rotated"}},
		{"", []string{"--user", "root:rootpw", "user", "list"}, &shalev1.UserListRequest{},
			[]string{"NAME   ROLES   PASSWORD", "alice  reader  yes", "agent  -       no", "root   root    yes"}},
		{"", []string{"--user", "root:rootpw", "user", "get", "alice"}, &shalev1.UserGetRequest{Name: "alice"},
			[]string{"user:      alice", "roles:     reader, writer", "password:  yes"}},
		{"", []string{"--user", "root:rootpw", "role", "get", "app"}, &shalev1.RoleGetRequest{Name: "app"},
			[]string{"role: app\npermissions:\n  readwrite [a, b)\n  read prefix \"user/\"\n  write key \"x\"\n  read prefix \"\" (every key)\n  read [\"k\\x00\", \"k\\xff\")\n"}},
		{"", []string{"--user", "root:rootpw", "role", "get", "empty"}, &shalev1.RoleGetRequest{Name: "empty"}, []string{"role: empty\npermissions: none\n"}},
		{"", []string{"--user", "root:rootpw", "role", "get", "--hex", "app"}, &shalev1.RoleGetRequest{Name: "app"},
			[]string{"readwrite [0x61, 0x62)", "read prefix 0x757365722f", "write key 0x78", "read [0x6b00, 0x6bff)"}},
		{"", []string{"--user", "root:rootpw", "role", "list"}, &shalev1.RoleListRequest{},
			[]string{"ROLE   PERMISSION", "app    readwrite [a, b)", `app    write key "x"`, "empty  -", "root   everything (built-in role)"}},
		{"", []string{"--user", "root:rootpw", "auth", "disable"}, &shalev1.AuthDisableRequest{}, []string{"authentication disabled"}},
	}
	for i, s := range steps {
		out := okIn(t, s.stdin, fa.args(s.args...)...)
		if got := fa.lastRequest(t); !proto.Equal(got, s.want) || len(fa.requests()) != i+1 {
			t.Fatalf("%q: the server got %v (%d requests); want %v", s.args, got, len(fa.requests()), s.want)
		}
		contains(t, strings.Join(s.args, " "), out, s.out...)
	}
	// The token went with the calls made as root.
	var authed int
	for _, c := range fa.callLog() {
		if strings.HasPrefix(c, "Authenticate ") && c != "Authenticate " {
			t.Errorf("Authenticate carried a token: %q", c)
		}
		if strings.Contains(c, "Bearer tok-root-") {
			authed++
		}
	}
	if authed < 16 { // each of the 8 root commands: GetRouting and its call
		t.Errorf("%d calls carried root's token:\n%s", authed, strings.Join(fa.callLog(), "\n"))
	}
	for _, a := range fa.authentications() {
		if a.GetName() != "root" || a.GetPassword() != "rootpw" {
			t.Errorf("Authenticate(%v)", a)
		}
	}
}

func TestAuthCommandsJSON(t *testing.T) {
	t.Parallel()
	fa := newAuthFake(t)
	decode := func(args ...string) map[string]any {
		t.Helper()
		out := ok(t, fa.args(append(args, "-o", "json")...)...)
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%q: %v in %s", args, err, out)
		}
		return m
	}
	check := func(what string, got map[string]any, want string) {
		t.Helper()
		b, _ := json.Marshal(got)
		if string(b) != want {
			t.Errorf("%s -o json = %s; want %s", what, b, want)
		}
	}
	check("auth enable", decode("auth", "enable"), `{"enabled":true}`)
	check("auth status", decode("--user", "alice:alicepw", "auth", "status"), `{"enabled":true,"revision":"7","roles":[],"user":"alice"}`)
	check("user add", decode("--user", "root:rootpw", "user", "add", "dave:pw"), `{"added":true,"user":"dave"}`)
	check("user grant-role", decode("--user", "root:rootpw", "user", "grant-role", "dave", "app"), `{"granted":true,"role":"app","user":"dave"}`)
	check("role grant", decode("--user", "root:rootpw", "role", "grant", "app", "read", "a", "b"),
		`{"granted":true,"permission":{"key":"a","prefix":false,"range_end":"b","type":"read"},"role":"app"}`)
	check("role revoke --hex", decode("--user", "root:rootpw", "role", "revoke", "--hex", "app", "write", "00", "--prefix"),
		`{"permission":{"key":"0x00","prefix":true,"type":"write"},"revoked":true,"role":"app"}`)
	users := decode("--user", "root:rootpw", "user", "list")
	if us, _ := users["users"].([]any); len(us) != 3 {
		t.Errorf("user list -o json = %v", users)
	}
	role := decode("--user", "root:rootpw", "role", "get", "app")
	r, _ := role["role"].(map[string]any)
	ps, _ := r["permissions"].([]any)
	if r["name"] != "app" || len(ps) != 5 {
		t.Fatalf("role get -o json = %v", role)
	}
	// Bytes in base64, per the protobuf JSON mapping.
	if p, _ := ps[1].(map[string]any); p["key"] != "dXNlci8=" || p["prefix"] != true || p["type"] != "PERMISSION_TYPE_READ" {
		t.Errorf("role get -o json permission = %v", ps[1])
	}
	if roles, _ := decode("--user", "root:rootpw", "role", "list")["roles"].([]any); len(roles) != 3 {
		t.Errorf("role list -o json: %d roles", len(roles))
	}
}

func TestAuthCommandsErrors(t *testing.T) {
	t.Parallel()
	fa := newAuthFake(t)
	// Usage errors: nothing sent.
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"role", "grant", "app", "execute", "k"}, `permission type "execute": want read, write or readwrite`},
		{"", []string{"role", "grant", "app", "read"}, "takes 3 or 4 arguments, ROLE TYPE KEY [END]; got 2"},
		{"", []string{"role", "grant", "app", "read", "a", "b", "c"}, "takes 3 or 4 arguments"},
		{"", []string{"role", "grant", "app", "read", "a", "b", "--prefix"}, "--prefix takes no END"},
		{"", []string{"role", "revoke", "app", "read", "b", "a"}, "END a does not sort after KEY b"},
		{"", []string{"role", "grant", "app", "read", "a", "a"}, "does not sort after"},
		{"", []string{"role", "grant", "--hex", "app", "read", "zz"}, "KEY: invalid hex"},
		{"", []string{"user", "add", "x:y", "--no-password"}, "--no-password with a password"},
		{"pw\n", []string{"user", "add", "x:y", "--password-stdin"}, "both give a password"},
		{"", []string{"user", "add", ":pw"}, "empty user name"},
		{"", []string{"user", "add", "x:"}, "empty password for user x"},
		{"", []string{"user", "add", "x", "--password-stdin"}, "no password on stdin: empty input"},
		{"\n", []string{"user", "add", "x", "--password-stdin"}, "empty password for user x"},
		{"pw\n", []string{"user", "add", "x"}, "stdin is not a terminal; pass --password-stdin"},
		{"", []string{"user", "passwd", "x"}, "stdin is not a terminal; pass --password-stdin"},
		{"", []string{"user", "grant-role", "x"}, "takes 2 argument(s), USER ROLE"},
		{"", []string{"user", "frobnicate"}, `unknown command "frobnicate" for "shalectl user"`},
		{"", []string{"--user", ":pw", "auth", "status"}, "--user: empty user name"},
		{"", []string{"--user", "root:x", "--password-file", "f", "auth", "status"}, "both give a password"},
		{"", []string{"--password-file", "f", "auth", "status"}, "--password-file needs --user"},
		{"", []string{"--user", "root", "--password-file", "/nonexistent/pw", "auth", "status"}, "--password-file: open /nonexistent/pw"},
		{"", []string{"auth", "status", "extra"}, "takes no arguments"},
	} {
		got := failsIn(t, c.stdin, fa.args(c.args...)...)
		contains(t, strings.Join(c.args, " "), got, c.want)
	}
	if n := len(fa.requests()); n != 0 {
		t.Errorf("usage errors sent %d Auth requests: %v", n, fa.requests())
	}

	// Server errors: exit 1 with the server's message.
	contains(t, "user add dup", fails(t, fa.args("user", "add", "dup:pw")...), "user add dup:", "user dup already exists")
	contains(t, "user get ghost", fails(t, fa.args("user", "get", "ghost")...), "user get ghost:", "user ghost not found")
	ok(t, fa.args("auth", "enable")...)

	// A wrong password fails at once, with the server's reason.
	start := time.Now()
	stderr := fails(t, fa.args("--user", "root:wrong", "--timeout", "30s", "user", "list")...)
	contains(t, "wrong password", stderr, "unauthenticated", "wrong user name or password")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a wrong password took %v to fail", d)
	}
	// No user while auth is enabled.
	contains(t, "no user", fails(t, fa.args("kv", "get", "k")...), "unauthenticated", "authentication required")

	// PermissionDenied: exit 1, the server's message, no retry.
	fa.mu.Lock()
	puts := fa.puts
	fa.mu.Unlock()
	stderr = fails(t, fa.args("--user", "alice:alicepw", "kv", "put", "secret", "v")...)
	contains(t, "permission denied", stderr, "permission denied", `user alice may not write "secret"`)
	fa.mu.Lock()
	puts = fa.puts - puts
	fa.mu.Unlock()
	if puts != 1 {
		t.Errorf("%d Put calls for a denied put; want 1", puts)
	}
	contains(t, "allowed put", ok(t, fa.args("--user", "alice:alicepw", "kv", "put", "open", "v")...), "OK")
}

// TestAuthPasswordSources checks where the password of --user comes from:
// the flag, --password-file, $SHALE_PASSWORD; $SHALE_USER sets the user.
// Not parallel: it sets environment variables.
func TestAuthPasswordSources(t *testing.T) {
	fa := newAuthFake(t)
	fa.mu.Lock()
	fa.enabled = true
	fa.mu.Unlock()
	last := func() string {
		t.Helper()
		as := fa.authentications()
		if len(as) == 0 {
			t.Fatal("no Authenticate call")
		}
		return as[len(as)-1].GetName() + ":" + as[len(as)-1].GetPassword()
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("alicepw\nrest\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ok(t, fa.args("--user", "alice:alicepw", "auth", "status")...)
	if got := last(); got != "alice:alicepw" {
		t.Errorf("--user NAME:PASSWORD authenticated as %q", got)
	}
	ok(t, fa.args("--user", "alice", "--password-file", pwFile, "auth", "status")...)
	if got := last(); got != "alice:alicepw" {
		t.Errorf("--password-file authenticated as %q", got)
	}
	contains(t, "no password", failsIn(t, "", fa.args("--user", "alice", "auth", "status")...),
		"no password for user alice: give --user alice:PASSWORD, --password-file FILE or $SHALE_PASSWORD, or run in a terminal")

	t.Setenv(passwordEnv, "alicepw")
	ok(t, fa.args("--user", "alice", "auth", "status")...)
	if got := last(); got != "alice:alicepw" {
		t.Errorf("$SHALE_PASSWORD authenticated as %q", got)
	}
	t.Setenv(userEnv, "root:rootpw")
	contains(t, "$SHALE_USER", ok(t, fa.args("auth", "status")...), "user:      root")
	if got := last(); got != "root:rootpw" {
		t.Errorf("$SHALE_USER authenticated as %q", got)
	}
	// The flag wins over $SHALE_USER, and a password in it over $SHALE_PASSWORD.
	t.Setenv(passwordEnv, "wrong")
	ok(t, fa.args("--user", "alice:alicepw", "auth", "status")...)
	if got := last(); got != "alice:alicepw" {
		t.Errorf("--user with $SHALE_USER set authenticated as %q", got)
	}
}

// TestAuthEndToEnd runs the setup of docs/shalectl.md on a real cluster
// (with TLS, which auth needs): root and a limited user, auth enabled;
// then the limited user's put is allowed on its prefix and denied
// elsewhere, a command without user or with a wrong password is refused,
// and root administers.
func TestAuthEndToEnd(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{TLS: true, Splits: [][]byte{[]byte("app/m")}})
	eps := strings.Join(c.Endpoints(), ",")
	args := func(a ...string) []string {
		return append([]string{"--endpoints", eps, "--cacert", c.Certs().CAFile(), "--timeout", "20s"}, a...)
	}
	// settle waits until every node has the auth state of the first
	// endpoint, which answered the last change (the others read it from
	// the system shard a moment later).
	revision := func(ep string) uint64 {
		t.Helper()
		var st struct {
			Revision uint64 `json:"revision,string"`
		}
		out := ok(t, "--endpoints", ep, "--cacert", c.Certs().CAFile(), "--timeout", "20s", "--user", "root:rootpw",
			"-o", "json", "auth", "status")
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("auth status -o json: %v in %s", err, out)
		}
		return st.Revision
	}
	settle := func() {
		t.Helper()
		want := revision(c.Endpoints()[0])
		for _, ep := range c.Endpoints()[1:] {
			deadline := time.Now().Add(10 * time.Second)
			for revision(ep) < want {
				if time.Now().After(deadline) {
					t.Fatalf("node %s did not reach auth revision %d", ep, want)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	// Auth disabled: no user needed; --user works too (no token is sent).
	ok(t, args("user", "add", "root:rootpw")...)
	ok(t, args("user", "grant-role", "root", "root")...)
	ok(t, args("--user", "root:rootpw", "role", "add", "app")...)
	ok(t, args("role", "grant", "app", "readwrite", "app/", "--prefix")...)
	okIn(t, "alicepw\n", args("user", "add", "alice", "--password-stdin")...)
	ok(t, args("user", "grant-role", "alice", "app")...)
	contains(t, "auth enable", ok(t, args("auth", "enable")...), "authentication enabled")
	settle()

	// alice: her prefix on both shards, nothing else.
	alice := func(a ...string) []string { return args(append([]string{"--user", "alice:alicepw"}, a...)...) }
	contains(t, "alice put app/a", ok(t, alice("kv", "put", "app/a", "1")...), "OK")
	contains(t, "alice put app/z", ok(t, alice("kv", "put", "app/z", "2")...), "OK")
	if out := ok(t, alice("kv", "get", "app/z")...); out != "2\n" {
		t.Errorf("alice get app/z = %q", out)
	}
	contains(t, "alice scan", ok(t, alice("kv", "scan", "--prefix", "app/")...), "app/a", "app/z")
	contains(t, "alice put other", fails(t, alice("kv", "put", "other", "1")...), "permission denied")
	contains(t, "alice user list", fails(t, alice("user", "list")...), "permission denied", "root")
	contains(t, "alice status", ok(t, alice("auth", "status")...), "enabled:   yes", "user:      alice", "roles:     app")

	// No user, a wrong password: refused at once.
	contains(t, "no user", fails(t, args("kv", "get", "app/a")...), "unauthenticated")
	start := time.Now()
	contains(t, "wrong password", fails(t, args("--user", "alice:wrong", "kv", "get", "app/a")...), "wrong user name or password")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a wrong password took %v to fail", d)
	}

	// root: administers, reads everything; the denied put changed nothing.
	root := func(a ...string) []string { return args(append([]string{"--user", "root:rootpw"}, a...)...) }
	contains(t, "root role get", ok(t, root("role", "get", "app")...), `readwrite prefix "app/"`)
	contains(t, "root user list", ok(t, root("user", "list")...), "alice  app", "root   root")
	contains(t, "root get other", fails(t, root("kv", "get", "other")...), "key not found")

	// Backups of the secured cluster: root may take one, alice may not.
	loc := t.TempDir()
	contains(t, "alice backup create", fails(t, alice("backup", "create", "--location", loc, "--id", "a")...), "permission denied")
	ok(t, root("backup", "create", "--location", loc, "--id", "secured")...)
	contains(t, "backup verify", ok(t, "backup", "verify", "secured", "--location", loc), "secured")

	ok(t, root("role", "revoke", "app", "readwrite", "app/", "--prefix")...)
	settle()
	contains(t, "alice after revoke", fails(t, alice("kv", "get", "app/a")...), "permission denied")
	contains(t, "auth disable", ok(t, root("auth", "disable")...), "authentication disabled")
	settle()
	ok(t, args("kv", "put", "other", "1")...)
}
