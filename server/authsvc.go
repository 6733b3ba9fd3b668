package server

import (
	"context"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/server/auth"
)

// authService serves the Auth API: logins on any node, reads from the
// node's view of the auth state, changes on the system shard's leader.
type authService struct {
	shalev1.UnimplementedAuthServer
	n *Node
}

// loadedAuth returns the node's view of the auth state, or Unavailable
// before it has one.
func (n *Node) loadedAuth() (*auth.Store, error) {
	st := n.auth()
	if st == nil {
		return nil, errAuthNotLoaded
	}
	return st, nil
}

func (s *authService) Authenticate(ctx context.Context, req *shalev1.AuthenticateRequest) (*shalev1.AuthenticateResponse, error) {
	n := s.n
	st, err := n.loadedAuth()
	if err != nil {
		return nil, err
	}
	if !st.Enabled() {
		return nil, status.Error(codes.FailedPrecondition, "authentication is not enabled")
	}
	if err := st.CheckPassword(req.GetName(), req.GetPassword()); err != nil {
		n.authm.logins.WithLabelValues("failed").Inc()
		n.authDenied(ctx, "login_failed", "/shale.v1.Auth/Authenticate", req.GetName(), err)
		return nil, err
	}
	tok, exp, err := st.IssueToken(req.GetName(), time.Now(), n.cfg.AuthTokenTTL)
	if err != nil {
		return nil, err
	}
	n.authm.logins.WithLabelValues("ok").Inc()
	n.log.Info("auth: login", "user", req.GetName(), "expires", exp.UTC().Format(time.RFC3339))
	return &shalev1.AuthenticateResponse{Token: tok, ExpiresUnixMs: exp.UnixMilli()}, nil
}

// changeAuth makes an auth change: on the system shard's leader when this
// node leads it (mk builds the change there), else through the leader's
// Auth service (fwd). This node's view includes the change when it
// returns. A call carrying a request ID (shalev1.RequestIDMetadataKey) makes its change at
// most once however often it is sent: a retry of a change already made
// returns the auth state's current revision (see editAuth).
func (n *Node) changeAuth(ctx context.Context, op string, mk func() (auth.Change, error),
	fwd func(context.Context, shalev1.AuthClient) (uint64, error)) (uint64, error) {
	var rev uint64
	reqID, err := incomingRequestID(ctx)
	if err != nil {
		return 0, err
	}
	if r := n.store.Replica(SystemShardID); r != nil && r.IsLeader() {
		var ch auth.Change
		if ch, err = mk(); err == nil {
			rev, err = n.editAuth(ctx, reqID, ch)
		}
	} else {
		rev, err = atAuthLeader(withRequestID(ctx, reqID), n, fwd)
		if err != nil {
			return 0, err
		}
		_ = n.refreshAuth(ctx) // read your writes on this node; the loop retries
	}
	if err == nil && !isForwarded(ctx) {
		n.log.Info("auth: changed", "op", op, "user", caller(ctx), "revision", rev)
	}
	return rev, err
}

// change adapts an auth.Change constructor without error.
func change(ch auth.Change) func() (auth.Change, error) {
	return func() (auth.Change, error) { return ch, nil }
}

func (s *authService) AuthEnable(ctx context.Context, req *shalev1.AuthEnableRequest) (*shalev1.AuthEnableResponse, error) {
	if s.n.tls == nil {
		return nil, status.Error(codes.FailedPrecondition, "auth needs TLS: without it, the nodes' traffic (Raft, the auth state) is not authenticated and tokens and passwords travel in the clear; start the nodes with --cert-file, --key-file and the --peer-* flags (SHALE_TLS=1 make run does)")
	}
	rev, err := s.n.changeAuth(ctx, "auth enable", func() (auth.Change, error) { return auth.Enable(time.Now()) },
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.AuthEnable(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.AuthEnableResponse{Revision: rev}, nil
}

func (s *authService) AuthDisable(ctx context.Context, req *shalev1.AuthDisableRequest) (*shalev1.AuthDisableResponse, error) {
	rev, err := s.n.changeAuth(ctx, "auth disable", change(auth.Disable()),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.AuthDisable(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.AuthDisableResponse{Revision: rev}, nil
}

func (s *authService) AuthRotateKey(ctx context.Context, req *shalev1.AuthRotateKeyRequest) (*shalev1.AuthRotateKeyResponse, error) {
	n := s.n
	rev, err := n.changeAuth(ctx, "auth rotate-key", func() (auth.Change, error) { return auth.RotateKey(time.Now()) },
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.AuthRotateKey(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	resp := &shalev1.AuthRotateKeyResponse{Revision: rev}
	if st := n.auth(); st != nil && len(st.State().GetSigningKeys()) > 0 {
		resp.KeyId = st.State().GetSigningKeys()[0].GetId()
	}
	return resp, nil
}

func (s *authService) AuthStatus(ctx context.Context, _ *shalev1.AuthStatusRequest) (*shalev1.AuthStatusResponse, error) {
	st, err := s.n.loadedAuth()
	if err != nil {
		return nil, err
	}
	resp := &shalev1.AuthStatusResponse{Enabled: st.Enabled(), Revision: st.Revision()}
	if u := caller(ctx); u != "" && u != auth.NodeUser {
		resp.User = u
		resp.Roles = st.Roles(u)
	}
	return resp, nil
}

func (s *authService) UserAdd(ctx context.Context, req *shalev1.UserAddRequest) (*shalev1.UserAddResponse, error) {
	rev, err := s.n.changeAuth(ctx, "user add "+req.GetName(),
		func() (auth.Change, error) {
			return auth.AddUser(req.GetName(), req.GetPassword(), req.GetNoPassword(), s.n.cfg.PasswordCost)
		},
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.UserAdd(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.UserAddResponse{Revision: rev}, nil
}

func (s *authService) UserDelete(ctx context.Context, req *shalev1.UserDeleteRequest) (*shalev1.UserDeleteResponse, error) {
	rev, err := s.n.changeAuth(ctx, "user delete "+req.GetName(), change(auth.DeleteUser(req.GetName())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.UserDelete(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.UserDeleteResponse{Revision: rev}, nil
}

func (s *authService) UserChangePassword(ctx context.Context, req *shalev1.UserChangePasswordRequest) (*shalev1.UserChangePasswordResponse, error) {
	rev, err := s.n.changeAuth(ctx, "user passwd "+req.GetName(),
		func() (auth.Change, error) {
			return auth.ChangePassword(req.GetName(), req.GetPassword(), s.n.cfg.PasswordCost)
		},
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.UserChangePassword(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.UserChangePasswordResponse{Revision: rev}, nil
}

func (s *authService) UserGrantRole(ctx context.Context, req *shalev1.UserGrantRoleRequest) (*shalev1.UserGrantRoleResponse, error) {
	rev, err := s.n.changeAuth(ctx, "user grant-role "+req.GetUser()+" "+req.GetRole(), change(auth.GrantRole(req.GetUser(), req.GetRole())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.UserGrantRole(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.UserGrantRoleResponse{Revision: rev}, nil
}

func (s *authService) UserRevokeRole(ctx context.Context, req *shalev1.UserRevokeRoleRequest) (*shalev1.UserRevokeRoleResponse, error) {
	rev, err := s.n.changeAuth(ctx, "user revoke-role "+req.GetUser()+" "+req.GetRole(), change(auth.RevokeRole(req.GetUser(), req.GetRole())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.UserRevokeRole(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.UserRevokeRoleResponse{Revision: rev}, nil
}

func (s *authService) RoleAdd(ctx context.Context, req *shalev1.RoleAddRequest) (*shalev1.RoleAddResponse, error) {
	rev, err := s.n.changeAuth(ctx, "role add "+req.GetName(), change(auth.AddRole(req.GetName())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.RoleAdd(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.RoleAddResponse{Revision: rev}, nil
}

func (s *authService) RoleDelete(ctx context.Context, req *shalev1.RoleDeleteRequest) (*shalev1.RoleDeleteResponse, error) {
	rev, err := s.n.changeAuth(ctx, "role delete "+req.GetName(), change(auth.DeleteRole(req.GetName())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.RoleDelete(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.RoleDeleteResponse{Revision: rev}, nil
}

func (s *authService) RoleGrantPermission(ctx context.Context, req *shalev1.RoleGrantPermissionRequest) (*shalev1.RoleGrantPermissionResponse, error) {
	rev, err := s.n.changeAuth(ctx, "role grant "+req.GetRole(), change(auth.GrantPermission(req.GetRole(), req.GetPermission())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.RoleGrantPermission(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.RoleGrantPermissionResponse{Revision: rev}, nil
}

func (s *authService) RoleRevokePermission(ctx context.Context, req *shalev1.RoleRevokePermissionRequest) (*shalev1.RoleRevokePermissionResponse, error) {
	rev, err := s.n.changeAuth(ctx, "role revoke "+req.GetRole(), change(auth.RevokePermission(req.GetRole(), req.GetPermission())),
		func(ctx context.Context, a shalev1.AuthClient) (uint64, error) {
			r, err := a.RoleRevokePermission(ctx, req)
			return r.GetRevision(), err
		})
	if err != nil {
		return nil, err
	}
	return &shalev1.RoleRevokePermissionResponse{Revision: rev}, nil
}

// userInfo describes u without its password.
func userInfo(u *shalev1.User) *shalev1.UserInfo {
	return &shalev1.UserInfo{Name: u.GetName(), Roles: append([]string(nil), u.GetRoles()...), HasPassword: len(u.GetPasswordHash()) > 0}
}

func (s *authService) UserGet(ctx context.Context, req *shalev1.UserGetRequest) (*shalev1.UserGetResponse, error) {
	if s.n.partialAuthView() {
		return atAuthLeader(ctx, s.n, func(ctx context.Context, a shalev1.AuthClient) (*shalev1.UserGetResponse, error) {
			return a.UserGet(ctx, req)
		})
	}
	st, err := s.n.loadedAuth()
	if err != nil {
		return nil, err
	}
	u := st.User(req.GetName())
	if u == nil {
		return nil, status.Errorf(codes.NotFound, "user %q does not exist", req.GetName())
	}
	return &shalev1.UserGetResponse{User: userInfo(u)}, nil
}

func (s *authService) UserList(ctx context.Context, _ *shalev1.UserListRequest) (*shalev1.UserListResponse, error) {
	if s.n.partialAuthView() {
		return atAuthLeader(ctx, s.n, func(ctx context.Context, a shalev1.AuthClient) (*shalev1.UserListResponse, error) {
			return a.UserList(ctx, &shalev1.UserListRequest{})
		})
	}
	st, err := s.n.loadedAuth()
	if err != nil {
		return nil, err
	}
	resp := &shalev1.UserListResponse{} // auth.Edit keeps the users sorted by name
	for _, u := range st.State().GetUsers() {
		resp.Users = append(resp.Users, userInfo(u))
	}
	return resp, nil
}

func (s *authService) RoleGet(ctx context.Context, req *shalev1.RoleGetRequest) (*shalev1.RoleGetResponse, error) {
	if s.n.partialAuthView() {
		return atAuthLeader(ctx, s.n, func(ctx context.Context, a shalev1.AuthClient) (*shalev1.RoleGetResponse, error) {
			return a.RoleGet(ctx, req)
		})
	}
	st, err := s.n.loadedAuth()
	if err != nil {
		return nil, err
	}
	if req.GetName() == auth.RootRole {
		return &shalev1.RoleGetResponse{Role: &shalev1.Role{Name: auth.RootRole}}, nil
	}
	for _, r := range st.State().GetRoles() {
		if r.GetName() == req.GetName() {
			return &shalev1.RoleGetResponse{Role: r}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "role %q does not exist", req.GetName())
}

func (s *authService) RoleList(ctx context.Context, _ *shalev1.RoleListRequest) (*shalev1.RoleListResponse, error) {
	if s.n.partialAuthView() {
		return atAuthLeader(ctx, s.n, func(ctx context.Context, a shalev1.AuthClient) (*shalev1.RoleListResponse, error) {
			return a.RoleList(ctx, &shalev1.RoleListRequest{})
		})
	}
	st, err := s.n.loadedAuth()
	if err != nil {
		return nil, err
	}
	resp := &shalev1.RoleListResponse{Roles: []*shalev1.Role{{Name: auth.RootRole}}}
	resp.Roles = append(resp.Roles, st.State().GetRoles()...)
	sort.Slice(resp.Roles, func(i, j int) bool { return resp.Roles[i].GetName() < resp.Roles[j].GetName() })
	return resp, nil
}

// partialAuthView reports whether this node's view of the auth state lacks
// the users and roles: a node without TLS gets from the system shard's
// leader only the revision and whether auth is enabled (the rest would
// cross the network in the clear), so the leader answers reads of users
// and roles for it.
func (n *Node) partialAuthView() bool {
	if n.tls != nil {
		return false
	}
	r := n.store.Replica(SystemShardID)
	return r == nil || !r.IsLeader()
}

// atAuthLeader makes an Auth call on the system shard's leader, forwarded
// once: a call already forwarded to a node that no longer leads gets
// Unavailable. ctx's outgoing metadata goes with the call.
func atAuthLeader[T any](ctx context.Context, n *Node, call func(context.Context, shalev1.AuthClient) (T, error)) (T, error) {
	var zero T
	if isForwarded(ctx) {
		return zero, status.Error(codes.Unavailable, "system shard leadership moved; retry")
	}
	addr, err := n.systemLeaderAddr(ctx)
	if err != nil {
		return zero, err
	}
	return call(forwarded(ctx), shalev1.NewAuthClient(n.conn(addr)))
}
