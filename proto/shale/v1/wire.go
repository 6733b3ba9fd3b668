package shalev1

// Names of the wire contract that live outside the messages.
const (
	// TargetNodeMetadataKey is the gRPC metadata key a caller sets, on a
	// call meant for one node, to that node's ID (decimal). A node with
	// another ID refuses the call with codes.Unavailable and an ErrorInfo
	// detail of reason ReasonWrongNode: the caller's connection reached an
	// address that now belongs to another node (an IP address reused after
	// a restart), and should be dialed again. Calls without it are served
	// by whichever node receives them.
	TargetNodeMetadataKey = "shale-target-node-id"
	// ErrorDomain is the domain of the google.rpc.ErrorInfo details Shale
	// attaches to errors.
	ErrorDomain = "shale-db.dev"
	// ReasonWrongNode is the ErrorInfo reason of a call refused because it
	// named another node in TargetNodeMetadataKey. Its metadata holds
	// "target_node_id" (the node the call named) and "node_id" (the node
	// that received it).
	ReasonWrongNode = "WRONG_NODE"
	// TraceParentMetadataKey and TraceStateMetadataKey are the gRPC
	// metadata keys of a call's W3C Trace Context (the traceparent and
	// tracestate headers): a node that traces joins the caller's trace
	// with them. A call carried by a KV.Calls stream has them in
	// Call.trace_context instead.
	TraceParentMetadataKey = "traceparent"
	TraceStateMetadataKey  = "tracestate"
	// RequestIDMetadataKey is the gRPC metadata key of a call that changes
	// the auth state: the caller's ID for the change, in hex, 8 to 32
	// bytes, the same in every attempt of one call. The cluster makes a
	// change whose ID it has applied only once (docs/api.md, "Auth changes
	// sent again"); a malformed ID gets InvalidArgument.
	RequestIDMetadataKey = "x-shale-request-id"
)
