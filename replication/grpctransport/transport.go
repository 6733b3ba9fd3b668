// Package grpctransport implements replication.Transport over gRPC (service
// shale.v1.Raft).
//
// # Raft messages
//
// A Transport keeps one outbound Raft.SendMessages stream per peer node, on a
// connection of its own, owned by one goroutine per peer. Send never blocks:
// it puts the batch on the peer's bounded queue, or drops it (and counts the
// drop) when the queue is full or the transport is closed; Raft retransmits
// whatever matters. The peer goroutine drains the queue and coalesces
// everything waiting into one RaftMessageBatch per stream Send (up to
// Options.MaxBatchBytes), so a slow link carries fewer, larger messages
// instead of a growing backlog.
//
// When the stream or the connection breaks, the peer goroutine reconnects
// with jittered exponential backoff (Options.BackoffInitial up to
// Options.BackoffMax), calling Options.Resolve on every attempt so that a
// node's new address is picked up. Batches queued while a connection attempt
// fails are discarded (counted as dropped): Raft messages that old are stale.
// Reachable(node) reports whether the stream is up, or was recently (a grace
// of Options.ReachableGrace after the last successful send).
//
// The server side (Register) checks every batch's cluster ID and destination
// node and hands the batch to the replication.Handler; a batch for another
// cluster or another node ends the stream with FailedPrecondition.
//
// # Snapshots
//
// SendSnapshot dials a separate connection for each snapshot, so that a
// large, rate-limited snapshot never queues Raft heartbeats behind it in the
// same HTTP/2 flow-control window, and streams the checkpoint with
// snapshot.Send. The server receives it with snapshot.Receive into
// Options.SnapshotStagingDir and passes the verified directory to
// Handler.HandleSnapshot; the sender's SendSnapshot returns once the handler
// has installed or refused it.
package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/shale-db/shale/proto/codec"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
	"github.com/shale-db/shale/replication"
	"github.com/shale-db/shale/replication/snapshot"
)

// Defaults of Options.
const (
	// DefaultQueueLen is the default Options.QueueLen (batches per peer).
	DefaultQueueLen = 4096
	// DefaultBackoffInitial is the default Options.BackoffInitial.
	DefaultBackoffInitial = 50 * time.Millisecond
	// DefaultBackoffMax is the default Options.BackoffMax.
	DefaultBackoffMax = 2 * time.Second
	// DefaultReachableGrace is the default Options.ReachableGrace.
	DefaultReachableGrace = time.Second
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout are the defaults of
	// Options.KeepaliveTime and KeepaliveTimeout (10 s is the shortest
	// interval gRPC allows).
	DefaultKeepaliveTime    = 10 * time.Second
	DefaultKeepaliveTimeout = 5 * time.Second
	// DefaultSnapshotAnswerTimeout is the default
	// Options.SnapshotAnswerTimeout.
	DefaultSnapshotAnswerTimeout = time.Minute
	// DefaultMaxBatchBytes is the default Options.MaxBatchBytes.
	DefaultMaxBatchBytes = 2 << 20
	// DefaultInitialWindowSize is the default Options.InitialWindowSize.
	DefaultInitialWindowSize = 2 << 20
	// DefaultInitialConnWindowSize is the default
	// Options.InitialConnWindowSize.
	DefaultInitialConnWindowSize = 16 << 20
	// MinWindowSize is the smallest flow-control window gRPC accepts
	// (HTTP/2's initial 64 KiB less one byte); smaller values are raised to it.
	MinWindowSize = 65535
	// LegacyRetry is how long SendSnapshot keeps sending the ordered format
	// to a node that answered Unimplemented to the interleaved one, before
	// it tries the interleaved format again (the node may have been
	// upgraded).
	LegacyRetry = 10 * time.Minute
	// SnapshotFormatHeader is the response header a receiver of
	// Raft.StreamSnapshot sends before it reads the stream.
	SnapshotFormatHeader = "shale-snapshot-format"
	// snapshotWriteBuffer is the write buffer of a snapshot's connection:
	// the bytes gRPC gathers into one write(2) (its default is 32 KiB).
	snapshotWriteBuffer = 1 << 20
)

// ErrClosed is returned by SendSnapshot after Close.
var ErrClosed = errors.New("grpctransport: transport closed")

// Options configure a Transport. NodeID, ClusterID and Resolve are required.
type Options struct {
	// NodeID is this node's ID: it is stamped on outgoing batches and
	// snapshot headers as the sender, and incoming ones must be addressed
	// to it.
	NodeID uint64
	// ClusterID is stamped on outgoing batches and snapshot headers;
	// incoming ones carrying another cluster ID are rejected.
	ClusterID string
	// Resolve returns the gRPC address (host:port) of a node. It is called
	// on every connection attempt (and for every snapshot), so address
	// changes are picked up on the next reconnect. Required.
	Resolve func(nodeID uint64) (string, error)
	// DialOptions are used for every outbound connection. Default (nil):
	// insecure transport credentials. When set they must include the
	// credentials. They are applied after the transport's own
	// grpc.WithConnectParams (a 5s minimum connect timeout) and window
	// sizes, so they can override them; keepalive parameters also go here (and need a matching
	// server enforcement policy).
	DialOptions []grpc.DialOption
	// SnapshotLimiter paces outgoing snapshot bytes; share one Limiter
	// between everything that sends snapshots from the node. Default (nil):
	// unlimited.
	SnapshotLimiter *snapshot.Limiter
	// SnapshotChunkSize is the snapshot chunk size. Default (0):
	// snapshot.DefaultChunkSize (1 MiB).
	SnapshotChunkSize int
	// SnapshotParallel is the number of files an interleaved snapshot
	// streams at once. Default (0): snapshot.DefaultParallel (4).
	SnapshotParallel int
	// SnapshotStagingDir is where incoming snapshots are received (one new
	// directory each) before Handler.HandleSnapshot takes them; put it on
	// the same filesystem as the data so the handler can rename the
	// directory into place. Default: "shale-snapshot-staging" under
	// os.TempDir().
	SnapshotStagingDir string
	// SnapshotAnswerTimeout bounds the wait for the receiver's answer once
	// a snapshot's last chunk is sent (it answers when it has installed
	// the snapshot or refused it); a send with no answer by then fails, and
	// Raft sends a new snapshot later. Default: DefaultSnapshotAnswerTimeout.
	SnapshotAnswerTimeout time.Duration
	// Logger receives the transport's logs. Default: slog.Default().
	Logger *slog.Logger
	// QueueLen is the number of batches queued per peer before Send drops.
	// Default: DefaultQueueLen (4096).
	QueueLen int
	// BackoffInitial and BackoffMax bound the jittered exponential delay
	// between reconnect attempts to a peer. Defaults: DefaultBackoffInitial
	// (50ms) and DefaultBackoffMax (2s).
	BackoffInitial, BackoffMax time.Duration
	// KeepaliveTime and KeepaliveTimeout detect a dead connection to a
	// peer: after KeepaliveTime with nothing received on it, the transport
	// pings the peer, and closes the connection (then reconnects, resolving
	// the address again) when no answer comes within KeepaliveTimeout.
	// Without them, a connection to an address that went silent (a peer
	// restarted on a new address, a dropped route) takes no error and
	// swallows the messages sent on it until TCP gives up, many minutes
	// later. Defaults: DefaultKeepaliveTime (10s) and
	// DefaultKeepaliveTimeout (5s); a negative KeepaliveTime turns pings
	// off. The peers' gRPC servers must allow the pings (ServerOptions).
	KeepaliveTime, KeepaliveTimeout time.Duration
	// ReachableGrace is how long Reachable stays true after the last
	// successful send once the stream is down. Default:
	// DefaultReachableGrace (1s).
	ReachableGrace time.Duration
	// MaxBatchBytes caps the encoded size of a coalesced batch: queued
	// batches are merged only while the result stays under it (a single
	// larger batch is still sent, alone). Keep it below the receiving gRPC
	// server's maximum message size (4 MiB by default). Default:
	// DefaultMaxBatchBytes (2 MiB).
	MaxBatchBytes int
	// InitialWindowSize and InitialConnWindowSize are the HTTP/2
	// flow-control windows, per stream and per connection, that outbound
	// connections grant their peer. Fixed windows turn off gRPC's
	// bandwidth-delay-product estimator, which answers every burst of
	// received data with a PING round trip: for Raft traffic (a small batch
	// per cycle) that doubled the frames on the wire. Values below
	// MinWindowSize are raised to it. Defaults: DefaultInitialWindowSize
	// (2 MiB) and DefaultInitialConnWindowSize (16 MiB). Serve the Raft
	// service from a gRPC server with matching grpc.InitialWindowSize and
	// grpc.InitialConnWindowSize options (shale-server does).
	InitialWindowSize, InitialConnWindowSize int32
}

// Stats are the transport's cumulative counters since New.
type Stats struct {
	// BatchesSent and MessagesSent count stream sends (coalesced batches)
	// and the Raft messages in them.
	BatchesSent, MessagesSent int64
	// BatchesCoalesced counts queued batches that were merged into another
	// one instead of being sent on their own.
	BatchesCoalesced int64
	// BatchesDropped and MessagesDropped count batches (as given to Send)
	// that were not sent: queue full, transport closed, no destination,
	// discarded while the peer could not be reached, or lost with a broken
	// stream.
	BatchesDropped, MessagesDropped int64
	// Connects counts outbound message streams established; Reconnects
	// counts those that replaced a broken stream or followed a failed
	// attempt; ConnectFailures counts failed attempts.
	Connects, Reconnects, ConnectFailures int64
	// BatchesReceived and MessagesReceived count batches delivered to the
	// Handler and the messages in them; BatchesRejected counts incoming
	// batches refused for a wrong cluster or node ID.
	BatchesReceived, MessagesReceived, BatchesRejected int64
	// SnapshotsSent counts snapshots the receiver applied; SnapshotsFailed
	// counts SendSnapshot calls that returned an error; SnapshotBytesSent
	// counts file bytes put on snapshot streams (including failed ones).
	SnapshotsSent, SnapshotsFailed, SnapshotBytesSent int64
	// SnapshotsReceived counts snapshots received, verified and installed
	// by the Handler, SnapshotBytesReceived their file bytes;
	// SnapshotsRejected counts incoming snapshots that failed (corrupt,
	// wrong cluster or node, or refused by the Handler).
	SnapshotsReceived, SnapshotBytesReceived, SnapshotsRejected int64
}

type counters struct {
	batchesSent, messagesSent, batchesCoalesced      atomic.Int64
	batchesDropped, messagesDropped                  atomic.Int64
	connects, reconnects, connectFailures            atomic.Int64
	batchesReceived, messagesReceived, batchRejected atomic.Int64
	snapSent, snapFailed, snapBytesSent              atomic.Int64
	snapReceived, snapBytesReceived, snapRejected    atomic.Int64
}

// Transport is a replication.Transport over gRPC. Create it with New, serve
// its Raft service with Register, and stop it with Close. All methods are
// safe for concurrent use.
type Transport struct {
	opts             Options
	log              *slog.Logger
	dialOpts         []grpc.DialOption
	snapshotDialOpts []grpc.DialOption // added for a snapshot's connection

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	peers  map[uint64]*peer
	legacy map[uint64]time.Time // nodes that refused interleaved snapshots, when
	wg     sync.WaitGroup       // every goroutine and call Close waits for

	c counters

	// Test hooks, set before use.
	testBeforeSend   func(to uint64, b *shalev1.RaftMessageBatch) // before each stream Send
	testCorruptChunk func(c *shalev1.SnapshotChunk)               // on each outgoing snapshot chunk
}

var _ replication.Transport = (*Transport)(nil)

// New returns a Transport with opts (defaults filled in). It starts nothing
// until the first Send; Register serves incoming traffic.
func New(opts Options) *Transport {
	if opts.QueueLen <= 0 {
		opts.QueueLen = DefaultQueueLen
	}
	if opts.BackoffInitial <= 0 {
		opts.BackoffInitial = DefaultBackoffInitial
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	if opts.BackoffMax < opts.BackoffInitial {
		opts.BackoffMax = opts.BackoffInitial
	}
	if opts.ReachableGrace <= 0 {
		opts.ReachableGrace = DefaultReachableGrace
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if opts.InitialWindowSize <= 0 {
		opts.InitialWindowSize = DefaultInitialWindowSize
	}
	if opts.InitialConnWindowSize <= 0 {
		opts.InitialConnWindowSize = DefaultInitialConnWindowSize
	}
	opts.InitialWindowSize = max(opts.InitialWindowSize, MinWindowSize)
	opts.InitialConnWindowSize = max(opts.InitialConnWindowSize, MinWindowSize)
	if opts.SnapshotStagingDir == "" {
		opts.SnapshotStagingDir = filepath.Join(os.TempDir(), "shale-snapshot-staging")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.SnapshotAnswerTimeout <= 0 {
		opts.SnapshotAnswerTimeout = DefaultSnapshotAnswerTimeout
	}
	if opts.KeepaliveTime == 0 {
		opts.KeepaliveTime = DefaultKeepaliveTime
	}
	if opts.KeepaliveTimeout <= 0 {
		opts.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	dialOpts := []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second}),
		// Batches are encoded by the generated methods, not by
		// protobuf's reflection.
		codec.DialOption(),
		grpc.WithInitialWindowSize(opts.InitialWindowSize),
		grpc.WithInitialConnWindowSize(opts.InitialConnWindowSize),
	}
	if opts.KeepaliveTime > 0 {
		dialOpts = append(dialOpts, keepaliveDialOption(opts.KeepaliveTime, opts.KeepaliveTimeout))
	}
	if len(opts.DialOptions) == 0 {
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		dialOpts = append(dialOpts, opts.DialOptions...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Transport{
		opts:             opts,
		log:              opts.Logger.With("component", "grpctransport", "node", opts.NodeID),
		dialOpts:         dialOpts,
		snapshotDialOpts: []grpc.DialOption{grpc.WithWriteBufferSize(snapshotWriteBuffer)},
		ctx:              ctx,
		cancel:           cancel,
		peers:            make(map[uint64]*peer),
	}
}

// KeepaliveDialOption makes a client connection to a node ping it after
// DefaultKeepaliveTime with nothing received, and close the connection
// (to be redialed) when no answer comes within DefaultKeepaliveTimeout. A
// node's other connections to its peers (administration, forwarding) use
// it as the transport does: a connection to an address gone silent would
// otherwise fail every call on it until TCP gives up, many minutes later.
func KeepaliveDialOption() grpc.DialOption {
	return keepaliveDialOption(DefaultKeepaliveTime, DefaultKeepaliveTimeout)
}

func keepaliveDialOption(t, timeout time.Duration) grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: t, Timeout: timeout, PermitWithoutStream: true})
}

// ServerOptions are the options a gRPC server serving Register needs: it
// accepts the peers' keepalive pings (Options.KeepaliveTime), which gRPC's
// default policy answers by closing the connection as abusive, and it
// encodes and decodes with codec.Codec, which the snapshot receiver's
// chunks need (snapshot.ReceivedChunk).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime:             DefaultKeepaliveTime / 2,
		PermitWithoutStream: true,
	}), codec.ServerOption()}
}

// enter registers a goroutine or call that Close must wait for; it returns
// false once the transport is closed.
func (t *Transport) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

// Send queues b for node b.ToNodeId and returns at once; it never blocks.
// The transport takes ownership of b (the caller must not modify it
// afterwards) and stamps the outgoing batch with this node's cluster and node
// IDs. b is dropped, and counted in Stats.BatchesDropped, when the peer's
// queue is full, when b has no destination, or after Close. Batches to one
// peer are sent in the order Send was called.
func (t *Transport) Send(b *shalev1.RaftMessageBatch) {
	if b == nil {
		return
	}
	if b.ToNodeId == 0 {
		t.drop(b)
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.drop(b)
		return
	}
	p := t.peers[b.ToNodeId]
	if p == nil {
		p = newPeer(t, b.ToNodeId)
		t.peers[b.ToNodeId] = p
		t.wg.Add(1)
		go p.run()
	}
	t.mu.Unlock()
	select {
	case p.queue <- b:
	default:
		t.drop(b)
	}
}

func (t *Transport) drop(b *shalev1.RaftMessageBatch) {
	t.c.batchesDropped.Add(1)
	t.c.messagesDropped.Add(int64(len(b.Messages)))
}

// Reachable reports whether the message stream to nodeID is up, or was up
// and successfully sent within the last Options.ReachableGrace. It is false
// for a node this transport has never sent to.
func (t *Transport) Reachable(nodeID uint64) bool {
	t.mu.Lock()
	p := t.peers[nodeID]
	t.mu.Unlock()
	if p == nil {
		return false
	}
	if p.up.Load() {
		return true
	}
	last := p.lastSend.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < t.opts.ReachableGrace
}

// Stats returns the transport's counters. Each counter is read atomically;
// the set is not one consistent snapshot.
func (t *Transport) Stats() Stats {
	c := &t.c
	return Stats{
		BatchesSent:           c.batchesSent.Load(),
		MessagesSent:          c.messagesSent.Load(),
		BatchesCoalesced:      c.batchesCoalesced.Load(),
		BatchesDropped:        c.batchesDropped.Load(),
		MessagesDropped:       c.messagesDropped.Load(),
		Connects:              c.connects.Load(),
		Reconnects:            c.reconnects.Load(),
		ConnectFailures:       c.connectFailures.Load(),
		BatchesReceived:       c.batchesReceived.Load(),
		MessagesReceived:      c.messagesReceived.Load(),
		BatchesRejected:       c.batchRejected.Load(),
		SnapshotsSent:         c.snapSent.Load(),
		SnapshotsFailed:       c.snapFailed.Load(),
		SnapshotBytesSent:     c.snapBytesSent.Load(),
		SnapshotsReceived:     c.snapReceived.Load(),
		SnapshotBytesReceived: c.snapBytesReceived.Load(),
		SnapshotsRejected:     c.snapRejected.Load(),
	}
}

// Close stops the transport: outbound streams and connections are closed,
// SendSnapshot calls in progress are cancelled, incoming streams served
// through Register end with Unavailable (so a GracefulStop of the server is
// not held up by them), and new ones are refused. Close waits until every
// goroutine of the transport has exited and every call in progress has
// returned. Send after Close drops the batch. Close is idempotent and always
// returns nil. It does not stop the grpc.Server, which belongs to the caller.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	return nil
}

// dial opens a client connection to nodeID's current address.
func (t *Transport) dial(nodeID uint64, extra ...grpc.DialOption) (*grpc.ClientConn, string, error) {
	if t.opts.Resolve == nil {
		return nil, "", errors.New("grpctransport: Options.Resolve is nil")
	}
	addr, err := t.opts.Resolve(nodeID)
	if err != nil {
		return nil, "", fmt.Errorf("resolve node %d: %w", nodeID, err)
	}
	conn, err := grpc.NewClient(addr, append(slices.Clip(t.dialOpts), extra...)...)
	if err != nil {
		return nil, addr, fmt.Errorf("dial node %d at %s: %w", nodeID, addr, err)
	}
	return conn, addr, nil
}

// sleep waits d, or until Close; it returns false on Close.
func (t *Transport) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.ctx.Done():
		return false
	}
}

// jitter returns a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
