// Package tlsconfig is the transport security of Shale's nodes and clients:
// TLS configurations built from PEM files that are re-read when they
// change, so certificates and CAs rotate without a restart.
//
// A node serves clients and peers on one gRPC port. A peer (another node)
// marks its connections by offering the ALPN protocol PeerALPN next to
// "h2"; for those the node presents its peer certificate and requires the
// dialer's peer certificate, signed by the peer CA and, when an allow-list
// is set, named on it. Every other connection is a client's: the node
// presents its client-facing certificate and verifies a client certificate
// against the client CA when one is given (or requires one). A connection
// whose certificate proves a peer identity carries it in its gRPC AuthInfo
// (see PeerName), which the node checks before serving node-to-node RPCs.
//
// SplitListener tells TLS connections from plaintext ones on the same
// port, so that a plaintext client is answered with a clear error instead
// of a reset connection.
//
// The package imports nothing of Shale's: the Go SDK uses it for its own
// re-read client certificates.
package tlsconfig
