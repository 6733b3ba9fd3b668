package client

import (
	"crypto/tls"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/shale-db/shale/security/tlsconfig"
)

// DefaultTLSReloadInterval is how often a client made WithTLSFiles looks
// for changed certificate files (see WithTLSReloadInterval).
const DefaultTLSReloadInterval = 5 * time.Second

// WithTLSReloadInterval sets how often the files of WithTLSFiles are
// re-read. Default DefaultTLSReloadInterval; non-positive keeps it.
func WithTLSReloadInterval(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.tlsReload = d
		}
	}
}

// WithTLS connects to the nodes with TLS configured by cfg (its RootCAs
// verify the nodes' certificates; its Certificates or GetClientCertificate
// authenticate the client when the nodes ask). The configuration is used
// as given for every connection; WithTLSFiles re-reads rotated files.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		o.tlsCreds = credentials.NewTLS(cfg)
		o.tlsFiles = nil
	}
}

// WithTLSFiles connects to the nodes with TLS: caFile (PEM) holds the CAs
// that sign the nodes' certificates (empty: the system's roots), and
// certFile and keyFile (both or neither) the client's certificate, for
// nodes that authenticate clients by certificate. The files are re-read
// every DefaultTLSReloadInterval (WithTLSReloadInterval) while the
// client is open, and new connections
// use what they hold then, so rotated certificates need no restart. New
// fails when a file cannot be read or parsed.
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(o *options) {
		o.tlsFiles = &tlsconfig.Files{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
		o.tlsCreds = nil
	}
}

// transportCredentials returns the credentials for the client's TLS
// settings and, for WithTLSFiles, the Source to keep re-reading; nil
// without TLS.
func (o *options) transportCredentials() (credentials.TransportCredentials, *tlsconfig.Source, error) {
	switch {
	case o.tlsCreds != nil:
		return o.tlsCreds, nil, nil
	case o.tlsFiles != nil:
		src, err := tlsconfig.NewSource(*o.tlsFiles, o.logger)
		if err != nil {
			return nil, nil, invalidArgf("TLS files: %v", err)
		}
		return tlsconfig.ClientCredentials(src), src, nil
	}
	return nil, nil, nil
}

// securityRefusal reports whether err is, for every node it names, a
// refusal that retrying cannot cure: a TLS handshake that failed (unknown
// CA, expired or misnamed certificate, a client certificate the node
// refused, TLS against a plaintext port) or a plaintext call to a TLS
// port.
func securityRefusal(err error) bool {
	return forEveryNode(err, func(st *status.Status) bool {
		switch st.Code() {
		case codes.Unauthenticated:
			return true
		case codes.Unavailable:
			msg := st.Message()
			return strings.Contains(msg, "authentication handshake failed") ||
				strings.Contains(msg, "tls: ") || strings.Contains(msg, "x509: ")
		}
		return false
	})
}

// connectionRefused reports whether err is, for every node it names, a
// connection the node's machine refused: nothing listens at the address.
func connectionRefused(err error) bool {
	return forEveryNode(err, func(st *status.Status) bool {
		return st.Code() == codes.Unavailable && strings.Contains(st.Message(), "connection refused")
	})
}

// forEveryNode reports whether pred holds for the status of every error
// joined in err (one per node tried, see fetchRouting), looking through
// wrapping; false for nil, an empty join, or an error without a status.
func forEveryNode(err error, pred func(*status.Status) bool) bool {
	if err == nil {
		return false
	}
	if m, ok := err.(interface{ Unwrap() []error }); ok {
		errs := m.Unwrap()
		if len(errs) == 0 {
			return false
		}
		for _, e := range errs {
			if !forEveryNode(e, pred) {
				return false
			}
		}
		return true
	}
	// The status of this error itself: status.FromError would look through
	// a wrapped join and answer for its first node only.
	if s, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return pred(s.GRPCStatus())
	}
	if u := errors.Unwrap(err); u != nil {
		return forEveryNode(u, pred)
	}
	return false
}
