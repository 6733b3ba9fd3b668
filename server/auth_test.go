package server_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/certgen"
	"github.com/shale-db/shale/server"
)

// authConn is a raw gRPC connection over TLS to one node of c.
func authConn(t *testing.T, c *testcluster.Cluster, addr string) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(c.Certs().CA.Cert)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// as returns a context carrying user's token ("" for none).
func as(token string) context.Context {
	ctx := context.Background()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return ctx
}

func login(t *testing.T, a shalev1.AuthClient, user, password string) string {
	t.Helper()
	resp, err := a.Authenticate(context.Background(), &shalev1.AuthenticateRequest{Name: user, Password: password})
	if err != nil {
		t.Fatalf("login %s: %v", user, err)
	}
	return resp.GetToken()
}

// noErr fails the test on a call's error: noErr(t)(client.Call(...)).
func noErr(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// setUpAuth adds root (password rootpw) and, from perms, roles with one
// user each holding them ("alice" holds role "r-alice"), then enables
// auth, all through the SDK (with the cluster's client certificate, of
// user root) before auth is on.
func setUpAuth(t *testing.T, c *testcluster.Cluster, perms map[string][]*shalev1.Permission) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := c.Certs()
	cl, err := client.New(ctx, c.Endpoints(), client.WithTLSFiles(cs.CAFile(), cs.ClientCertFile(), cs.ClientKeyFile()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ok(cl.UserAdd(ctx, "root", "rootpw", false))
	ok(cl.UserGrantRole(ctx, "root", "root"))
	for user, ps := range perms {
		ok(cl.UserAdd(ctx, user, user+"pw", false))
		role := "r-" + user
		ok(cl.RoleAdd(ctx, role))
		for _, p := range ps {
			ok(cl.RoleGrantPermission(ctx, role, p))
		}
		ok(cl.UserGrantRole(ctx, user, role))
	}
	ok(cl.AuthEnable(ctx))
	// Every node enforces it before the test goes on.
	for _, id := range c.NodeIDs() {
		for !c.Node(id).AuthEnabled() {
			if ctx.Err() != nil {
				t.Fatalf("node %d does not enforce auth", id)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitAuthLoaded waits until the node behind a has loaded the auth state.
func waitAuthLoaded(t *testing.T, a shalev1.AuthClient) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := a.AuthStatus(context.Background(), &shalev1.AuthStatusRequest{})
		if status.Code(err) != codes.Unavailable {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not load the auth state: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readPerm(start, end string) *shalev1.Permission {
	return &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READ, Key: []byte(start), RangeEnd: []byte(end)}
}

// TestAuthRBAC: with auth enabled, every KV RPC is allowed exactly when the
// caller's roles cover every key or range it touches (ranges across shard
// boundaries and prefixes included), every Admin and Auth RPC needs root
// (except GetRouting and AuthStatus), a caller without a valid token is
// Unauthenticated, and a refused request changes nothing.
func TestAuthRBAC(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, TLS: true, Splits: [][]byte{[]byte("g"), []byte("m")},
		Configure: func(cfg *server.Config) {
			cfg.ReplicationFactor = 1
			cfg.WatchProgressInterval = 100 * time.Millisecond
		}})
	cc := authConn(t, c, c.Endpoints()[0])
	kv, adm, au := shalev1.NewKVClient(cc), shalev1.NewAdminClient(cc), shalev1.NewAuthClient(cc)
	rw := shalev1.PermissionType_PERMISSION_TYPE_READWRITE
	setUpAuth(t, c, map[string][]*shalev1.Permission{
		// alice reads [a, m), across the shard boundary at g.
		"alice": {readPerm("a", "m")},
		// bob reads and writes keys under user/, and writes key x.
		"bob": {{Type: rw, Key: []byte("user/"), Prefix: true}, {Type: shalev1.PermissionType_PERMISSION_TYPE_WRITE, Key: []byte("x")}},
		// carol holds a role without permissions.
		"carol": nil,
	})
	tok := map[string]string{}
	for _, u := range []string{"alice", "bob", "carol"} {
		tok[u] = login(t, au, u, u+"pw")
	}
	tok["root"] = login(t, au, "root", "rootpw")
	if _, err := au.Authenticate(context.Background(), &shalev1.AuthenticateRequest{Name: "alice", Password: "wrong"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong password: %v", err)
	}
	for _, k := range []string{"a1", "b1", "h1", "n1", "user/1", "x", "y"} {
		noErr(t)(kv.Put(as(tok["root"]), &shalev1.PutRequest{Key: []byte(k), Value: []byte("v0")}))
	}
	digest := func() [32]byte {
		t.Helper()
		h := sha256.New()
		var token []byte
		for {
			r, err := kv.Scan(as(tok["root"]), &shalev1.ScanRequest{ContinuationToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range r.GetKvs() {
				fmt.Fprintf(h, "%q=%q@%d;", e.GetKey(), e.GetValue(), e.GetModRevision())
			}
			if token = r.GetContinuationToken(); len(token) == 0 {
				break
			}
		}
		var d [32]byte
		copy(d[:], h.Sum(nil))
		return d
	}
	put := func(k string, prev bool) *shalev1.RequestOp {
		return &shalev1.RequestOp{Op: &shalev1.RequestOp_Put{Put: &shalev1.PutOp{Key: []byte(k), Value: []byte("v1"), PrevKv: prev}}}
	}
	scanStream := func(ctx context.Context, r *shalev1.ScanRequest) error {
		s, err := kv.ScanStream(ctx, r)
		if err != nil {
			return err
		}
		for {
			if _, err := s.Recv(); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	watch := func(ctx context.Context, r *shalev1.WatchRequest) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r.ProgressNotify = true
		s, err := kv.Watch(ctx, r)
		if err != nil {
			return err
		}
		_, err = s.Recv() // a progress notification when allowed
		return err
	}
	type rpc func(ctx context.Context) error
	unary := func(f func(ctx context.Context) (any, error)) rpc {
		return func(ctx context.Context) error { _, err := f(ctx); return err }
	}
	cases := []struct {
		name  string
		call  rpc
		allow []string // users allowed besides root
	}{
		{"Get a1", unary(func(ctx context.Context) (any, error) { return kv.Get(ctx, &shalev1.GetRequest{Key: []byte("a1")}) }), []string{"alice"}},
		{"Get n1", unary(func(ctx context.Context) (any, error) { return kv.Get(ctx, &shalev1.GetRequest{Key: []byte("n1")}) }), nil},
		{"Get user/1", unary(func(ctx context.Context) (any, error) { return kv.Get(ctx, &shalev1.GetRequest{Key: []byte("user/1")}) }), []string{"bob"}},
		{"MultiGet a1 b1", unary(func(ctx context.Context) (any, error) {
			return kv.MultiGet(ctx, &shalev1.MultiGetRequest{Keys: [][]byte{[]byte("a1"), []byte("b1")}})
		}), []string{"alice"}},
		{"MultiGet n1 user/1", unary(func(ctx context.Context) (any, error) {
			return kv.MultiGet(ctx, &shalev1.MultiGetRequest{Keys: [][]byte{[]byte("n1"), []byte("user/1")}})
		}), nil},
		{"Put a1", unary(func(ctx context.Context) (any, error) {
			return kv.Put(ctx, &shalev1.PutRequest{Key: []byte("a1"), Value: []byte("v1")})
		}), nil},
		{"Put user/1", unary(func(ctx context.Context) (any, error) {
			return kv.Put(ctx, &shalev1.PutRequest{Key: []byte("user/1"), Value: []byte("v1")})
		}), []string{"bob"}},
		{"Put x", unary(func(ctx context.Context) (any, error) {
			return kv.Put(ctx, &shalev1.PutRequest{Key: []byte("x"), Value: []byte("v1")})
		}), []string{"bob"}},
		{"Put x prev_kv (a read)", unary(func(ctx context.Context) (any, error) {
			return kv.Put(ctx, &shalev1.PutRequest{Key: []byte("x"), Value: []byte("v1"), PrevKv: true})
		}), nil},
		{"Put y", unary(func(ctx context.Context) (any, error) {
			return kv.Put(ctx, &shalev1.PutRequest{Key: []byte("y"), Value: []byte("v1")})
		}), nil},
		{"Delete user/1 prev_kv", unary(func(ctx context.Context) (any, error) {
			return kv.Delete(ctx, &shalev1.DeleteRequest{Key: []byte("user/1"), PrevKv: true})
		}), []string{"bob"}},
		{"Delete b1", unary(func(ctx context.Context) (any, error) {
			return kv.Delete(ctx, &shalev1.DeleteRequest{Key: []byte("b1")})
		}), nil},
		{"DeleteRange [user/, user0)", unary(func(ctx context.Context) (any, error) {
			return kv.DeleteRange(ctx, &shalev1.DeleteRangeRequest{StartKey: []byte("user/"), EndKey: []byte("user0")})
		}), []string{"bob"}},
		{"DeleteRange [user/, v)", unary(func(ctx context.Context) (any, error) {
			return kv.DeleteRange(ctx, &shalev1.DeleteRangeRequest{StartKey: []byte("user/"), EndKey: []byte("v")})
		}), nil},
		{"Scan [a, m) across shards", unary(func(ctx context.Context) (any, error) {
			return kv.Scan(ctx, &shalev1.ScanRequest{StartKey: []byte("a"), EndKey: []byte("m")})
		}), []string{"alice"}},
		{"Scan [a, n)", unary(func(ctx context.Context) (any, error) {
			return kv.Scan(ctx, &shalev1.ScanRequest{StartKey: []byte("a"), EndKey: []byte("n")})
		}), nil},
		{"Scan prefix b", unary(func(ctx context.Context) (any, error) { return kv.Scan(ctx, &shalev1.ScanRequest{Prefix: []byte("b")}) }), []string{"alice"}},
		{"Scan everything", unary(func(ctx context.Context) (any, error) { return kv.Scan(ctx, &shalev1.ScanRequest{}) }), nil},
		{"ScanStream [h, m)", func(ctx context.Context) error {
			return scanStream(ctx, &shalev1.ScanRequest{StartKey: []byte("h"), EndKey: []byte("m")})
		}, []string{"alice"}},
		{"ScanStream prefix user/", func(ctx context.Context) error { return scanStream(ctx, &shalev1.ScanRequest{Prefix: []byte("user/")}) }, []string{"bob"}},
		{"ScanStream [a, z)", func(ctx context.Context) error {
			return scanStream(ctx, &shalev1.ScanRequest{StartKey: []byte("a"), EndKey: []byte("z")})
		}, nil},
		{"Batch put user/2, x", unary(func(ctx context.Context) (any, error) {
			return kv.Batch(ctx, &shalev1.BatchRequest{Ops: []*shalev1.RequestOp{put("user/2", false), put("x", false)}})
		}), []string{"bob"}},
		{"Batch put user/3, y", unary(func(ctx context.Context) (any, error) {
			return kv.Batch(ctx, &shalev1.BatchRequest{Ops: []*shalev1.RequestOp{put("user/3", false), put("y", false)}})
		}), nil},
		{"CompareAndSwap user/1", unary(func(ctx context.Context) (any, error) {
			return kv.CompareAndSwap(ctx, &shalev1.CompareAndSwapRequest{Key: []byte("user/1"), ExpectAbsent: true, NewValue: []byte("v2")})
		}), []string{"bob"}},
		{"CompareAndSwap x (compares read)", unary(func(ctx context.Context) (any, error) {
			return kv.CompareAndSwap(ctx, &shalev1.CompareAndSwapRequest{Key: []byte("x"), ExpectAbsent: true, NewValue: []byte("v2")})
		}), nil},
		{"Txn compare user/1, put user/4", unary(func(ctx context.Context) (any, error) {
			return kv.Txn(ctx, &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("user/1"), Target: shalev1.Compare_TARGET_EXISTS, Number: 1}},
				Success: []*shalev1.RequestOp{put("user/4", false)}})
		}), []string{"bob"}},
		{"Txn compare x, put user/4", unary(func(ctx context.Context) (any, error) {
			return kv.Txn(ctx, &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("x"), Target: shalev1.Compare_TARGET_EXISTS, Number: 1}},
				Success: []*shalev1.RequestOp{put("user/4", false)}})
		}), nil},
		{"Txn failure branch put y", unary(func(ctx context.Context) (any, error) {
			return kv.Txn(ctx, &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("user/1"), Target: shalev1.Compare_TARGET_EXISTS, Number: 1}},
				Success: []*shalev1.RequestOp{put("user/4", false)}, Failure: []*shalev1.RequestOp{put("y", false)}})
		}), nil},
		{"Watch prefix user/", func(ctx context.Context) error { return watch(ctx, &shalev1.WatchRequest{Prefix: []byte("user/")}) }, []string{"bob"}},
		{"Watch [h, m)", func(ctx context.Context) error {
			return watch(ctx, &shalev1.WatchRequest{StartKey: []byte("h"), EndKey: []byte("m")})
		}, []string{"alice"}},
		{"Watch [m, z)", func(ctx context.Context) error {
			return watch(ctx, &shalev1.WatchRequest{StartKey: []byte("m"), EndKey: []byte("z")})
		}, nil},
		{"Admin ClusterStatus", unary(func(ctx context.Context) (any, error) {
			return adm.ClusterStatus(ctx, &shalev1.ClusterStatusRequest{})
		}), nil},
		{"Admin GetRouting", unary(func(ctx context.Context) (any, error) { return adm.GetRouting(ctx, &shalev1.GetRoutingRequest{}) }),
			[]string{"alice", "bob", "carol"}},
		{"Auth AuthStatus", unary(func(ctx context.Context) (any, error) { return au.AuthStatus(ctx, &shalev1.AuthStatusRequest{}) }),
			[]string{"alice", "bob", "carol"}},
		{"Auth UserList", unary(func(ctx context.Context) (any, error) { return au.UserList(ctx, &shalev1.UserListRequest{}) }), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, user := range []string{"", "bad-token", "carol", "alice", "bob", "root"} {
				token := tok[user]
				if user == "bad-token" {
					token = "e30.e30.AAAA"
				}
				allowed := user == "root"
				for _, a := range tc.allow {
					allowed = allowed || a == user
				}
				before := digest()
				err := tc.call(as(token))
				switch {
				case user == "" || user == "bad-token":
					if status.Code(err) != codes.Unauthenticated {
						t.Errorf("%s without a valid token: %v; want Unauthenticated", tc.name, err)
					}
				case allowed && err != nil:
					t.Errorf("%s as %s: %v; want it allowed", tc.name, user, err)
				case !allowed:
					if status.Code(err) != codes.PermissionDenied {
						t.Errorf("%s as %s: %v; want PermissionDenied", tc.name, user, err)
					} else if !strings.Contains(err.Error(), user) {
						t.Errorf("%s as %s: the refusal does not name the user: %v", tc.name, user, err)
					}
				}
				if !allowed && digest() != before {
					t.Errorf("%s as %s was refused but changed the store", tc.name, user)
				}
			}
		})
	}

	// Every Admin and Auth RPC but the ones open to every user needs root:
	// called with an empty request as bob, each is refused before its
	// handler runs.
	open := map[string]bool{"GetRouting": true, "AuthStatus": true, "Authenticate": true}
	for _, sd := range []grpc.ServiceDesc{shalev1.Admin_ServiceDesc, shalev1.Auth_ServiceDesc} {
		fd, err := protoFileOf(sd)
		if err != nil {
			t.Fatal(err)
		}
		svc := fd.Services().ByName(protoreflect.Name(strings.TrimPrefix(sd.ServiceName, "shale.v1.")))
		for i := 0; i < svc.Methods().Len(); i++ {
			m := svc.Methods().Get(i)
			if open[string(m.Name())] {
				continue
			}
			full := "/" + sd.ServiceName + "/" + string(m.Name())
			in := dynamicpb.NewMessage(m.Input())
			var err error
			if m.IsStreamingServer() || m.IsStreamingClient() {
				var s grpc.ClientStream
				s, err = cc.NewStream(as(tok["bob"]), &grpc.StreamDesc{ServerStreams: true}, full)
				if err == nil {
					if err = s.SendMsg(in); err == nil {
						_ = s.CloseSend()
						err = s.RecvMsg(dynamicpb.NewMessage(m.Output()))
					}
				}
			} else {
				err = cc.Invoke(as(tok["bob"]), full, in, dynamicpb.NewMessage(m.Output()))
			}
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s as bob: %v; want PermissionDenied", full, err)
			}
		}
	}
}

// protoFileOf finds the file descriptor of a generated service.
func protoFileOf(sd grpc.ServiceDesc) (protoreflect.FileDescriptor, error) {
	switch sd.ServiceName {
	case "shale.v1.Admin":
		return shalev1.File_shale_v1_admin_proto, nil
	case "shale.v1.Auth":
		return shalev1.File_shale_v1_auth_proto, nil
	}
	return nil, fmt.Errorf("no file for %s", sd.ServiceName)
}

// TestAuthChangesReachEveryNode: a permission granted through one node is
// honoured by every other node within a second; revoking it ends a watch
// open on another node with PermissionDenied, and refuses the next
// request there too.
func TestAuthChangesReachEveryNode(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{TLS: true})
	eps := c.Endpoints()
	a1 := shalev1.NewAuthClient(authConn(t, c, eps[0]))
	setUpAuth(t, c, map[string][]*shalev1.Permission{"bob": nil})
	rootTok := login(t, a1, "root", "rootpw")
	bobTok := login(t, a1, "bob", "bobpw")
	cc3 := authConn(t, c, eps[2])
	kv3 := shalev1.NewKVClient(cc3)
	// Wait until node 3 enforces auth at all.
	waitFor := func(what string, ok func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !ok() {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: not after 10s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	scanUser := func() error {
		_, err := kv3.Scan(as(bobTok), &shalev1.ScanRequest{Prefix: []byte("user/"), Header: &shalev1.RequestHeader{Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_STALE}})
		return err
	}
	waitFor("node 3 enforces auth", func() bool { return status.Code(scanUser()) == codes.PermissionDenied })

	grant := &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READ, Key: []byte("user/"), Prefix: true}
	if _, err := a1.RoleGrantPermission(as(rootTok), &shalev1.RoleGrantPermissionRequest{Role: "r-bob", Permission: grant}); err != nil {
		t.Fatal(err)
	}
	d := waitFor("node 3 honours the grant", func() bool { return scanUser() == nil })
	if d > time.Second {
		t.Errorf("the grant reached node 3 after %v; want within 1s", d)
	}
	t.Logf("grant honoured on node 3 after %v", d)

	// A watch on node 3; the revocation through node 1 ends it.
	ctx, cancel := context.WithTimeout(as(bobTok), 20*time.Second)
	defer cancel()
	w, err := kv3.Watch(ctx, &shalev1.WatchRequest{Prefix: []byte("user/"), ProgressNotify: true,
		Header: &shalev1.RequestHeader{Consistency: shalev1.ReadConsistency_READ_CONSISTENCY_STALE}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("watch as bob: %v", err)
	}
	revoked := time.Now()
	if _, err := a1.RoleRevokePermission(as(rootTok), &shalev1.RoleRevokePermissionRequest{Role: "r-bob", Permission: grant}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := w.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("watch ended with %v; want PermissionDenied", err)
		}
		if d := time.Since(revoked); d > time.Second {
			t.Errorf("the watch ended %v after the revocation; want within 1s", d)
		}
		break
	}
	if err := scanUser(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("scan after the revocation: %v", err)
	}
}

// TestAuthClientCertificateIdentity: with --client-cert-auth, a client
// certificate's common name is its user, without a login; a certificate
// naming no user is Unauthenticated.
func TestAuthClientCertificateIdentity(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, TLS: true, Configure: func(cfg *server.Config) {
		cfg.ReplicationFactor = 1
		cfg.TLS.ClientCertAuth = true
	}})
	cs := c.Certs()
	dial := func(cn string) *grpc.ClientConn {
		t.Helper()
		p, err := cs.CA.Issue(certgen.Options{CommonName: cn, Client: true})
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(cs.CA.Cert)
		cc, err := grpc.NewClient(c.Endpoints()[0], grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	rootCC := dial("root")
	au := shalev1.NewAuthClient(rootCC)
	setUpAuth(t, c, map[string][]*shalev1.Permission{"alice": {readPerm("a", "b")}})
	// The root certificate acts as root with no token.
	if _, err := au.UserList(context.Background(), &shalev1.UserListRequest{}); err != nil {
		t.Fatalf("root by certificate: %v", err)
	}
	st, err := shalev1.NewAuthClient(dial("alice")).AuthStatus(context.Background(), &shalev1.AuthStatusRequest{})
	if err != nil || st.GetUser() != "alice" || len(st.GetRoles()) != 1 {
		t.Fatalf("alice's status: %v %v", st, err)
	}
	kv := shalev1.NewKVClient(dial("alice"))
	if _, err := kv.Get(context.Background(), &shalev1.GetRequest{Key: []byte("a1")}); err != nil {
		t.Fatalf("alice reads a1: %v", err)
	}
	if _, err := kv.Put(context.Background(), &shalev1.PutRequest{Key: []byte("a1"), Value: []byte("v")}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("alice writes a1: %v", err)
	}
	if _, err := shalev1.NewKVClient(dial("mallory")).Get(context.Background(), &shalev1.GetRequest{Key: []byte("a1")}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a certificate of no user: %v", err)
	}
}

// TestAuthNeedsTLS: auth cannot be enabled on a plaintext cluster.
func TestAuthNeedsTLS(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Configure: func(cfg *server.Config) { cfg.ReplicationFactor = 1 }})
	cc, err := grpc.NewClient(c.Endpoints()[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	a := shalev1.NewAuthClient(cc)
	waitAuthLoaded(t, a)
	noErr(t)(a.UserAdd(context.Background(), &shalev1.UserAddRequest{Name: "root", Password: "pw"}))
	noErr(t)(a.UserGrantRole(context.Background(), &shalev1.UserGrantRoleRequest{User: "root", Role: "root"}))
	_, err = a.AuthEnable(context.Background(), &shalev1.AuthEnableRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("auth enable without TLS: %v", err)
	}
}

// TestAuthTokenExpiryUnderLoad: SDK clients writing without pause through
// several token lifetimes (2 s) renew their tokens with no failed request;
// a watch of the SDK ends with PermissionDenied when its permission is
// revoked.
func TestAuthTokenExpiryUnderLoad(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{TLS: true, Splits: [][]byte{[]byte("app/m")}, Configure: func(cfg *server.Config) {
		cfg.AuthTokenTTL = 2 * time.Second
	}})
	cs := c.Certs()
	a1 := shalev1.NewAuthClient(authConn(t, c, c.Endpoints()[0]))
	setUpAuth(t, c, map[string][]*shalev1.Permission{
		"app": {{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: []byte("app/"), Prefix: true}},
	})
	ctx := context.Background()
	cl, err := client.New(ctx, c.Endpoints(), client.WithTLSFiles(cs.CAFile(), "", ""), client.WithCredentials("app", "apppw"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, []byte("other"), []byte("v")); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("put outside the prefix: %v; want ErrPermissionDenied", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	events := cl.Watch(wctx, []byte("app/"), []byte("app0"))

	var puts, failures atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(7 * time.Second)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				k := fmt.Sprintf("app/%c/%d/%d", "az"[i%2], w, i)
				if _, err := cl.Put(ctx, []byte(k), []byte("v")); err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				puts.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d writes failed across token expiries; first: %v", n, puts.Load()+n, firstErr.Load())
	}
	t.Logf("%d writes over 3.5 token lifetimes, none failed", puts.Load())

	rootTok := login(t, a1, "root", "rootpw")
	if _, err := a1.RoleRevokePermission(as(rootTok), &shalev1.RoleRevokePermissionRequest{Role: "r-app",
		Permission: &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READWRITE, Key: []byte("app/"), Prefix: true}}); err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.Err != nil {
			if !errors.Is(ev.Err, client.ErrPermissionDenied) {
				t.Fatalf("the watch ended with %v; want ErrPermissionDenied", ev.Err)
			}
			return
		}
	}
	t.Fatal("the watch's channel closed without an error")
}

// TestAuthChangeSentAgainAppliesOnce: an auth change whose reply was lost
// is retried by the SDK with the same request ID and succeeds, made once
// (without the ID, the retry of a role grant that was made failed with
// AlreadyExists: CI's TestLinearizability met it under load); the same ID
// sent to every node, the leader of the system shard and the nodes that
// forward to it, gets success without a second change; a change sent again
// without an ID is refused as before, and a malformed ID is
// InvalidArgument.
func TestAuthChangeSentAgainAppliesOnce(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{TLS: true})
	ctx := context.Background()
	cs := c.Certs()
	const grant = "/shale.v1.Auth/UserGrantRole"
	var mu sync.Mutex
	var ids []string // the request IDs of the grant's attempts
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method != grant {
			return err
		}
		md, _ := metadata.FromOutgoingContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, strings.Join(md.Get("x-shale-request-id"), ","))
		if len(ids) == 1 && err == nil {
			return status.Error(codes.Unavailable, "test: the reply was lost")
		}
		return err
	}
	cl, err := client.New(ctx, c.Endpoints(), client.WithTLSFiles(cs.CAFile(), cs.ClientCertFile(), cs.ClientKeyFile()),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(lose)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.UserAdd(ctx, "alice", "alicepw", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.RoleAdd(ctx, "reader"); err != nil {
		t.Fatal(err)
	}
	if err := cl.UserGrantRole(ctx, "alice", "reader"); err != nil {
		t.Fatalf("a grant whose first reply was lost: %v", err)
	}
	mu.Lock()
	if len(ids) < 2 || ids[0] == "" || ids[1] != ids[0] {
		t.Fatalf("the grant's attempts carried request IDs %q; want at least 2, all the same", ids)
	}
	mu.Unlock()
	// A node's view of the auth state may lag the change by a refresh
	// (about 200 ms) when the SDK reads it from another node.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		u, err := cl.UserGet(ctx, "alice")
		if err == nil && fmt.Sprint(u.GetRoles()) == "[reader]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice after the retried grant: %v, %v; want the role reader", u, err)
		}
	}
	st, err := cl.AuthStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The same ID on every node: no node makes the change again, and each
	// answers a revision that holds it.
	idCtx := metadata.AppendToOutgoingContext(ctx, "x-shale-request-id", "0123456789abcdef0123")
	var first uint64
	for i, ep := range c.Endpoints() {
		a := shalev1.NewAuthClient(authConn(t, c, ep))
		waitAuthLoaded(t, a)
		resp, err := a.RoleAdd(idCtx, &shalev1.RoleAddRequest{Name: "writer"})
		if err != nil {
			t.Fatalf("node %d: a role added again with the same request ID: %v", i+1, err)
		}
		if i == 0 {
			first = resp.GetRevision()
			if first <= st.GetRevision() {
				t.Fatalf("the role's revision %d, not after %d", first, st.GetRevision())
			}
		} else if resp.GetRevision() < first {
			t.Fatalf("node %d answered revision %d, before the change's %d", i+1, resp.GetRevision(), first)
		}
		if i == len(c.Endpoints())-1 {
			if _, err := a.RoleAdd(ctx, &shalev1.RoleAddRequest{Name: "writer"}); status.Code(err) != codes.AlreadyExists {
				t.Fatalf("a role added again without a request ID: %v; want AlreadyExists", err)
			}
			bad := metadata.AppendToOutgoingContext(ctx, "x-shale-request-id", "not hex")
			if _, err := a.RoleAdd(bad, &shalev1.RoleAddRequest{Name: "other"}); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a malformed request ID: %v; want InvalidArgument", err)
			}
		}
	}
	// Every node answered with its view holding the change, and none was
	// made after it: the revision stays.
	if st2, err := cl.AuthStatus(ctx); err != nil || st2.GetRevision() != first {
		t.Fatalf("auth revision %d (%v) after the role was added once at %d", st2.GetRevision(), err, first)
	}
}

// TestAuthReadsOnPlaintextNodes: on a cluster without TLS, whose nodes other
// than the system shard's leader hold only the auth state's revision (the
// users' password hashes do not cross the network in the clear), every
// node answers UserGet, UserList, RoleGet and RoleList with the users and
// roles (before, the others answered NotFound and empty lists).
func TestAuthReadsOnPlaintextNodes(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	ctx := context.Background()
	cl := newClient(t, c)
	if err := cl.UserAdd(ctx, "alice", "alicepw", false); err != nil {
		t.Fatal(err)
	}
	if err := cl.RoleAdd(ctx, "reader"); err != nil {
		t.Fatal(err)
	}
	if err := cl.UserGrantRole(ctx, "alice", "reader"); err != nil {
		t.Fatal(err)
	}
	for i, ep := range c.Endpoints() {
		cc, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		a := shalev1.NewAuthClient(cc)
		waitAuthLoaded(t, a)
		u, err := a.UserGet(ctx, &shalev1.UserGetRequest{Name: "alice"})
		if err != nil || fmt.Sprint(u.GetUser().GetRoles()) != "[reader]" {
			t.Fatalf("node %d: UserGet alice: %v, %v", i+1, u, err)
		}
		ul, err := a.UserList(ctx, &shalev1.UserListRequest{})
		if err != nil || len(ul.GetUsers()) != 1 || ul.GetUsers()[0].GetName() != "alice" {
			t.Fatalf("node %d: UserList: %v, %v", i+1, ul, err)
		}
		if r, err := a.RoleGet(ctx, &shalev1.RoleGetRequest{Name: "reader"}); err != nil || r.GetRole().GetName() != "reader" {
			t.Fatalf("node %d: RoleGet reader: %v, %v", i+1, r, err)
		}
		if rl, err := a.RoleList(ctx, &shalev1.RoleListRequest{}); err != nil || len(rl.GetRoles()) != 2 {
			t.Fatalf("node %d: RoleList: %v, %v; want root and reader", i+1, rl, err)
		}
	}
}
