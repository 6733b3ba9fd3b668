package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/security/tlsconfig"
	"github.com/shale-db/shale/server/auth"
	"github.com/shale-db/shale/server/shard"
)

// authRefreshInterval is how often a node reads the auth state from the
// system shard's leader: an auth change takes effect on every node within
// about this (plus a round trip).
const authRefreshInterval = 200 * time.Millisecond

// authEditAttempts bounds the retries of an auth change that met a
// concurrent one.
const authEditAttempts = 10

// AuthLoaded reports whether the node has loaded the cluster's auth state;
// until it has, it refuses client calls with Unavailable.
func (n *Node) AuthLoaded() bool { return n.auth() != nil }

// AuthEnabled reports whether the node's view of the auth state has
// authentication and access control on.
func (n *Node) AuthEnabled() bool {
	st := n.auth()
	return st != nil && st.Enabled()
}

// auth returns the node's view of the auth state, nil until the node first
// loaded it.
func (n *Node) auth() *auth.Store { return n.authStore.Load() }

// setAuth installs st when it is newer than the node's view (or the first
// one), and re-checks open watches against it.
func (n *Node) setAuth(st *auth.Store) {
	for {
		cur := n.authStore.Load()
		if cur != nil && st.Revision() <= cur.Revision() {
			return
		}
		if n.authStore.CompareAndSwap(cur, st) {
			break
		}
	}
	n.tokens.reset(st.Revision())
	if cur := n.authStore.Load(); cur == st {
		n.log.Info("auth state loaded", "revision", st.Revision(), "enabled", st.Enabled())
	}
	n.recheckWatches(st)
}

// refreshAuthLoop keeps the node's view of the auth state current until
// the node stops.
func (n *Node) refreshAuthLoop() {
	defer n.wg.Done()
	t := time.NewTicker(authRefreshInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := n.refreshAuth(ctx); err != nil && n.auth() == nil {
			n.log.Debug("auth state not loaded yet", "err", err)
		}
		cancel()
		wait := t.C
		if n.auth() == nil {
			// Not loaded yet: every client call is refused until it is.
			wait = time.After(20 * time.Millisecond)
		}
		select {
		case <-n.stop:
			return
		case <-wait:
		}
	}
}

// refreshAuth reads the auth state from the system shard's leader (this
// node's replica when it leads) and installs it when it changed.
func (n *Node) refreshAuth(ctx context.Context) error {
	known := uint64(0)
	cur := n.auth()
	if cur != nil {
		known = cur.Revision()
	}
	resp, err := n.authStateFromLeader(ctx, known, true)
	if err != nil {
		return err
	}
	if cur == nil || resp.GetRevision() != known {
		n.setAuth(auth.NewStore(resp.GetState()))
	}
	return nil
}

// authStateFromLeader answers GetAuthState: the leader's state, read
// locally when this node leads the system shard, else asked of the
// leader (once: forward is false for a request already forwarded).
func (n *Node) authStateFromLeader(ctx context.Context, known uint64, forward bool) (*shalev1.GetAuthStateResponse, error) {
	if r := n.store.Replica(SystemShardID); r != nil && r.IsLeader() {
		sh := n.Shard(SystemShardID)
		if sh == nil {
			return nil, status.Error(codes.Unavailable, "the system shard is not open")
		}
		st, err := sh.AuthState()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read the auth state: %v", err)
		}
		resp := &shalev1.GetAuthStateResponse{Revision: st.GetRevision()}
		if st.GetRevision() != known {
			resp.State = st
		}
		return resp, nil
	}
	if !forward {
		return nil, status.Error(codes.Unavailable, "system shard leadership moved; retry")
	}
	addr, err := n.systemLeaderAddr(ctx)
	if err != nil {
		return nil, err
	}
	return shalev1.NewAdminClient(n.conn(addr)).GetAuthState(forwarded(ctx), &shalev1.GetAuthStateRequest{KnownRevision: known})
}

// GetAuthState serves another node's read of the auth state. Over a
// plaintext port, where the caller cannot be proven a node, it gives only
// whether auth is enabled: never password hashes or signing keys.
func (s *adminService) GetAuthState(ctx context.Context, req *shalev1.GetAuthStateRequest) (*shalev1.GetAuthStateResponse, error) {
	resp, err := s.n.authStateFromLeader(ctx, req.GetKnownRevision(), !isForwarded(ctx))
	if err != nil {
		return nil, err
	}
	if _, peer := tlsconfig.PeerName(ctx); !peer && resp.GetState() != nil {
		resp.State = &shalev1.AuthState{Enabled: resp.GetState().GetEnabled(), Revision: resp.GetState().GetRevision()}
	}
	return resp, nil
}

// editAuth applies an auth change on the system shard's leader (this node
// must lead it): it reads the stored state, applies ch, and proposes the
// result for the revision it read, again when another change came first.
// It returns the revision of the state it then reads, which holds the
// change.
//
// reqID, when not nil, is the caller's ID for the change, the same in each
// of its retries: a change whose ID the system shard has applied is not
// made again (its result is looked up before ch is applied to the state,
// and the shard's deduplication refuses a second application that the
// lookup missed because this leader had not applied the first yet).
func (n *Node) editAuth(ctx context.Context, reqID []byte, ch auth.Change) (uint64, error) {
	for attempt := 1; ; attempt++ {
		sh := n.Shard(SystemShardID)
		if sh == nil {
			return 0, status.Error(codes.Unavailable, "the system shard is not open")
		}
		if reqID != nil {
			if _, done, err := sh.StoredResult(reqID); err != nil {
				return 0, status.Errorf(codes.Internal, "look up request %x: %v", reqID, err)
			} else if done {
				return n.reloadAuth(sh)
			}
		}
		cur, err := sh.AuthState()
		if err != nil {
			return 0, status.Errorf(codes.Internal, "read the auth state: %v", err)
		}
		next, err := auth.Edit(cur, ch)
		if err != nil {
			return 0, err
		}
		id := reqID
		if id == nil {
			id = make([]byte, 16)
			if _, err := rand.Read(id); err != nil {
				return 0, fmt.Errorf("server: request ID: %w", err)
			}
		}
		cr, err := n.proposeSystem(ctx, id, &shalev1.SystemCommand{Op: &shalev1.SystemCommand_PutAuth{PutAuth: &shalev1.PutAuth{
			State: next, ExpectedRevision: cur.GetRevision(),
		}}})
		if err != nil {
			if cr != nil && codes.Code(cr.GetErrorCode()) == codes.Aborted {
				if attempt < authEditAttempts {
					// Another change, or one this new leader has not
					// applied yet, came first: read again.
					time.Sleep(time.Duration(attempt) * 10 * time.Millisecond)
					continue
				}
				return 0, status.Error(codes.Aborted, "the auth state kept changing concurrently; retry")
			}
			if cr != nil {
				return 0, status.Error(codes.Code(cr.GetErrorCode()), cr.GetErrorMessage())
			}
			if _, ok := status.FromError(err); ok {
				return 0, err
			}
			return 0, status.Error(codes.Unavailable, err.Error())
		}
		// The shard may have answered with the result of an earlier
		// application of reqID (a retry), not of next: the stored state
		// is the truth.
		return n.reloadAuth(sh)
	}
}

// reloadAuth reads the system shard's auth state into this node's view and
// returns its revision.
func (n *Node) reloadAuth(sh *shard.Shard) (uint64, error) {
	st, err := sh.AuthState()
	if err != nil {
		return 0, status.Errorf(codes.Internal, "read the auth state: %v", err)
	}
	n.setAuth(auth.NewStore(st))
	return st.GetRevision(), nil
}

// errAuthNotLoaded refuses requests a node cannot check yet.
var errAuthNotLoaded = status.Error(codes.Unavailable, "this node has not loaded the cluster's auth state yet (the system shard has no reachable leader); retry")

// errAuthNeedsTLS refuses requests to a plaintext node of a cluster whose
// auth is enabled.
var errAuthNeedsTLS = status.Error(codes.FailedPrecondition, "auth is enabled in this cluster but this node runs without TLS: restart it with its --cert-file and --peer-* flags")
