package server

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shale-db/shale/internal/netfault"
	"github.com/shale-db/shale/replication/grpctransport"
)

// TestPeerConnectionReplacedWhenSilent: a node's own connection to a peer
// (registry lookups, forwarding, heartbeats) that goes silent without an
// error is found dead and redialed within seconds. Before, every call on
// it timed out for many minutes: a node whose connections a network
// disconnect had silenced never learned a new node's address (chaos/README
// bug 8).
func TestPeerConnectionReplacedWhenSilent(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpctransport.ServerOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	relay := netfault.NewRelay(t, lis.Addr().String())

	cc, err := (&Node{}).dialPeer(relay.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err != nil {
		t.Fatal(err)
	}
	relay.Silence()
	start := time.Now()
	deadline := start.Add(grpctransport.DefaultKeepaliveTime + grpctransport.DefaultKeepaliveTimeout + 10*time.Second)
	for check() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("calls on the silenced connection still failed after %v", time.Since(start))
		}
	}
	t.Logf("calls succeed again %v after the connection went silent", time.Since(start).Round(time.Second))
}
