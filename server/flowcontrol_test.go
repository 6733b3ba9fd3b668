package server_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// TestNoFlowControlPings checks that neither the SDK nor the server starts
// HTTP/2 PINGs during ordinary traffic. gRPC's bandwidth estimator, on
// unless the flow-control windows are fixed, answers each burst of received
// data with a PING round trip; on small requests that doubled the frames
// and cost 12–22% of the servers' CPU per put (docs/BENCHMARKS.md).
func TestNoFlowControlPings(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("m")}})
	t.Run("sdk", func(t *testing.T) {
		var d pingCountingDialer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cl, err := client.New(ctx, c.Endpoints(), client.WithDialOptions(
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(d.dial),
		))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for i := range 60 {
			k := []byte(fmt.Sprintf("%c-%03d", 'a'+i%26, i))
			if _, err := cl.Put(ctx, k, make([]byte, 256)); err != nil {
				t.Fatalf("put %s: %v", k, err)
			}
			if _, err := cl.Get(ctx, k); err != nil {
				t.Fatalf("get %s: %v", k, err)
			}
		}
		if fromClient, fromServer := d.counts(); fromClient != 0 || fromServer != 0 {
			t.Fatalf("PINGs started: %d by the client, %d by the servers; want none", fromClient, fromServer)
		}
	})
	t.Run("control", func(t *testing.T) {
		// A plain gRPC client, with gRPC's dynamic windows, does ping: the
		// counter sees PINGs when there are some.
		var d pingCountingDialer
		conn, err := grpc.NewClient(c.Endpoints()[0],
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(d.dial))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hc := healthpb.NewHealthClient(conn)
		for range 60 {
			if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		if fromClient, _ := d.counts(); fromClient == 0 {
			t.Fatal("a client with gRPC's dynamic windows sent no PING: the frame counter is broken")
		}
	})
}

// pingCountingDialer dials TCP and counts the non-ACK HTTP/2 PING frames
// written and read on every connection it made.
type pingCountingDialer struct {
	mu          sync.Mutex
	wrote, read []*h2FrameScanner
	dialer      net.Dialer
}

func (d *pingCountingDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := d.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	w := &h2FrameScanner{skip: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")}
	r := &h2FrameScanner{}
	d.mu.Lock()
	d.wrote, d.read = append(d.wrote, w), append(d.read, r)
	d.mu.Unlock()
	return &scannedConn{Conn: conn, w: w, r: r}, nil
}

func (d *pingCountingDialer) counts() (fromClient, fromServer int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.wrote {
		fromClient += s.pings()
	}
	for _, s := range d.read {
		fromServer += s.pings()
	}
	return fromClient, fromServer
}

type scannedConn struct {
	net.Conn
	w, r *h2FrameScanner
}

func (c *scannedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.w.feed(p[:n])
	return n, err
}

func (c *scannedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.feed(p[:n])
	return n, err
}

// h2FrameScanner follows the frames of one direction of an HTTP/2
// connection (after skip bytes of preface) and counts PINGs that are not
// acknowledgements.
type h2FrameScanner struct {
	mu     sync.Mutex
	skip   int    // bytes still to skip (preface, then frame payloads)
	header []byte // partial 9-byte frame header
	nPings int
}

func (s *h2FrameScanner) feed(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(p) > 0 {
		if s.skip > 0 {
			n := min(s.skip, len(p))
			s.skip -= n
			p = p[n:]
			continue
		}
		n := min(9-len(s.header), len(p))
		s.header = append(s.header, p[:n]...)
		p = p[n:]
		if len(s.header) < 9 {
			continue
		}
		length := int(s.header[0])<<16 | int(s.header[1])<<8 | int(s.header[2])
		const typePing, flagAck = 0x6, 0x1
		if s.header[3] == typePing && s.header[4]&flagAck == 0 {
			s.nPings++
		}
		s.header = s.header[:0]
		s.skip = length
	}
}

func (s *h2FrameScanner) pings() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nPings
}

// TestWindowSizeValidated checks that a flow-control window gRPC would
// ignore is refused at start, naming the setting.
func TestWindowSizeValidated(t *testing.T) {
	for _, cfg := range []server.Config{
		{GRPCWindowBytes: 1000},
		{GRPCConnWindowBytes: 65534},
	} {
		cfg.DataDir = t.TempDir()
		cfg.NodeID = 1
		cfg.ListenAddr = "127.0.0.1:0"
		cfg.InitialCluster = map[uint64]string{1: "127.0.0.1:0"}
		n, err := server.Start(context.Background(), cfg)
		if err == nil {
			n.Stop()
			t.Fatalf("window sizes %d/%d accepted", cfg.GRPCWindowBytes, cfg.GRPCConnWindowBytes)
		}
		if !strings.Contains(err.Error(), "window sizes must be at least 65535") {
			t.Errorf("window sizes %d/%d: err = %v, want one naming the window sizes", cfg.GRPCWindowBytes, cfg.GRPCConnWindowBytes, err)
		}
	}
}
