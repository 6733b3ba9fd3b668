package server

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/security/tlsconfig"
)

// plaintextRefusal is what a plaintext client of a TLS port is told, on
// every call.
const plaintextRefusal = "this node requires TLS: connect with TLS and trust its CA (shalectl --cacert FILE; client.WithTLSFiles in the Go SDK)"

// newPlaintextRefuser is the plaintext half of a TLS port: it answers
// health checks with the node's health (they carry no data, and
// Kubernetes' gRPC probes cannot speak TLS) and every other call with
// Unauthenticated and plaintextRefusal (not Unavailable: no retry of the
// same call can succeed).
func newPlaintextRefuser(h healthpb.HealthServer) *grpc.Server {
	s := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return status.Error(codes.Unauthenticated, plaintextRefusal)
	}))
	healthpb.RegisterHealthServer(s, h)
	return s
}

// peerOnlyMethods are the RPCs only other nodes make: the Raft transport
// (messages and snapshots) and the reports nodes send the placement
// leader. Under TLS they need a node certificate (tlsconfig.PeerName).
var peerOnlyMethods = []string{
	"/shale.v1.Raft/",
	"/shale.v1.Admin/Heartbeat",
	"/shale.v1.Admin/ReportShards",
	"/shale.v1.Admin/GetAuthState",
}

// isPeerOnly reports whether method is one of peerOnlyMethods.
func isPeerOnly(method string) bool {
	for _, m := range peerOnlyMethods {
		if strings.HasPrefix(method, m) {
			return true
		}
	}
	return false
}

// checkPeerOnly refuses a node-to-node RPC (isPeerOnly) from a caller that
// did not connect with a node certificate, when the node runs TLS.
func (n *Node) checkPeerOnly(ctx context.Context, method string) error {
	if n.tls == nil {
		return nil
	}
	if _, ok := tlsconfig.PeerName(ctx); !ok {
		n.log.Warn("node-to-node call refused: the caller has no node certificate", "method", method)
		return status.Errorf(codes.PermissionDenied, "%s is for nodes only: connect with a node certificate signed by the peer CA (--peer-cert-file)", method)
	}
	return nil
}

// stopContext is a context that ends when the node stops.
func (n *Node) stopContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-n.stop
		cancel()
	}()
	return ctx
}

// ReloadTLS re-reads the node's certificate and CA files now (shale-server
// calls it on SIGHUP; the node also looks for changes every few seconds).
// With files that cannot be used, it reports why and keeps the previous
// ones. A plaintext node has nothing to reload.
func (n *Node) ReloadTLS() error {
	if n.tls == nil {
		return nil
	}
	return n.tls.Reload()
}

// TLSEnabled reports whether the node serves TLS.
func (n *Node) TLSEnabled() bool { return n.tls != nil }
