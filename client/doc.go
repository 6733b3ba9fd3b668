// Package client is the Go SDK for Shale, the distributed, replicated,
// range-sharded key-value database.
//
// A Client connects to a cluster through any of its nodes, learns the shard
// layout (Admin.GetRouting) and from then on sends every request straight to
// the shard that owns its key, at that shard's leader. It follows leader
// changes, shard splits and node failures on its own:
//
//   - NotLeader with a leader hint: the hint is remembered and the request is
//     resent there at once; without a hint another replica is tried after a
//     backoff.
//   - EpochMismatch, KeyOutsideShard, ShardNotFound: the routing is refreshed
//     (one Admin.GetRouting shared by every concurrent caller; the current
//     descriptor an EpochMismatch carries is applied directly) and the
//     request is resent.
//   - Unavailable, a per-attempt timeout or a connection failure: the next
//     replica is tried after an exponential backoff with full jitter.
//   - ResourceExhausted: the request is retried after a backoff, unless it
//     is gRPC's "message larger than max" (a value or batch over a node's
//     limit): that is ErrInvalidArgument, returned at once.
//   - InvalidArgument and every other error: returned at once.
//
// Retries stop at the caller's context deadline (the client applies a
// default per-call timeout, WithDefaultTimeout, when the context has none)
// or after WithMaxAttempts attempts; the error is then one that
// errors.Is(err, ErrUnavailable), wrapping the last error seen.
//
// Transport: one gRPC connection per node, shared by every caller; a
// connection's KV requests travel over one KV.Calls stream, so that the
// requests made at the same time leave in one message and their responses
// come back together (a node without KV.Calls gets unary calls;
// WithUnaryCalls makes every request a unary call). Unless WithDialOptions
// is given, the KV.Calls stream goes over a connection of its own to the
// node, on which the client speaks HTTP/2 itself: the goroutine that sends
// writes to the socket, and the stream's receiver reads from it, with no
// goroutines of gRPC's transport in between. Once it has the routing
// table, the client connects to every node it names, in the background,
// and opens each one's stream, so that the first request a node serves
// (the leader of a split's new shard, say) does not wait for a dial.
//
// Security: WithTLSFiles (or WithTLS) connects with TLS, re-reading the
// files so that rotated certificates need no restart; a refused handshake
// fails New at once with the cause. WithCredentials logs in
// (Auth.Authenticate), sends the token with every call, and renews it
// before it expires; Unauthenticated and PermissionDenied are returned as
// ErrUnauthenticated and ErrPermissionDenied and never retried.
//
// Every write carries a 12-byte random request ID, generated once per
// logical call and reused on every retry, so the server applies a retried
// write at most once. A write that fails after an attempt may have applied
// (the reply was lost, the deadline or a cancellation cut it short, the
// node answered Unavailable or Internal after proposing it) returns an
// error matching ErrOutcomeUnknown; any other write error means the write
// did not apply. WithRequestID gives a write the application's own ID, so
// that the application can send it again after an unknown outcome (or
// after its own restart) and have it apply once.
//
// Scan walks the shards of a range in order (forward or reverse), one page at
// a time, following the server's continuation tokens; MultiGet and
// DeleteRange split their keys per shard. Batch and Txn are atomic and must
// stay within one shard: the client checks this against its routing before
// sending, and returns a *CrossShardError (which errors.Is ErrInvalidArgument)
// when they do not.
//
// Errors keep the gRPC status they came from as a wrapped cause, so
// status.FromError and status.Code work on them. A Client is safe for
// concurrent use by multiple goroutines.
package client
