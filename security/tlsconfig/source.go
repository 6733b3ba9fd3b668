package tlsconfig

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Files names the PEM files of one side of a TLS configuration: a
// certificate with its key (either both or neither), and a bundle of CA
// certificates trusted to sign the other end's certificate (optional).
type Files struct {
	CertFile, KeyFile, CAFile string
}

// Source is TLS material read from Files: a certificate and key pair and a
// pool of trusted CAs. Reload re-reads the files and, when their contents
// changed and the new material is valid, makes it current: connections
// made afterwards use it at once, connections already made are left as
// they are. Invalid new material (a certificate whose key is not written
// yet, a broken PEM file) is reported and the old material kept. A Source
// is safe for concurrent use.
type Source struct {
	files Files
	log   *slog.Logger

	cur atomic.Pointer[material]

	mu sync.Mutex // serializes Reload
	// refused is the content of the last material refused, so that a
	// broken file is logged once, not on every poll.
	refused [3][]byte
}

// material is one consistent reading of a Source's files.
type material struct {
	raw  [3][]byte // cert, key and CA file contents as read
	cert *tls.Certificate
	pool *x509.CertPool
	cas  []*x509.Certificate
}

// NewSource reads files and returns a Source holding them. It fails, naming
// the file, when a file cannot be read or parsed, or when the key does not
// belong to the certificate. log receives reload reports (nil: discard).
func NewSource(files Files, log *slog.Logger) (*Source, error) {
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, errors.New("tlsconfig: a certificate and its key go together")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, log: log}
	raw, err := s.read()
	if err != nil {
		return nil, err
	}
	m, err := s.parse(raw)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

// Files returns the files the Source reads.
func (s *Source) Files() Files { return s.files }

// Certificate returns the current certificate and key, or nil when the
// Source has none.
func (s *Source) Certificate() *tls.Certificate { return s.cur.Load().cert }

// Pool returns the current trusted CAs, or nil when the Source has no CA
// file. The pool must not be modified.
func (s *Source) Pool() *x509.CertPool { return s.cur.Load().pool }

// Reload re-reads the files. It returns whether the current material
// changed; an error means the files could not be read or hold invalid
// material, and the previous material stays current.
func (s *Source) Reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, err := s.read()
	if err != nil {
		return false, err
	}
	old := s.cur.Load()
	if equalRaw(old.raw, raw) {
		return false, nil
	}
	m, err := s.parse(raw)
	if err != nil {
		if !equalRaw(s.refused, raw) {
			s.refused = raw
			s.log.Warn("TLS files changed but are not usable; keeping the previous certificates", "err", err)
		}
		return false, err
	}
	s.cur.Store(m)
	s.refused = [3][]byte{}
	attrs := []any{"cert", s.files.CertFile, "ca", s.files.CAFile}
	if m.cert != nil && m.cert.Leaf != nil {
		attrs = append(attrs, "subject", m.cert.Leaf.Subject.CommonName, "not_after", m.cert.Leaf.NotAfter.Format(time.RFC3339))
	}
	s.log.Info("TLS certificates reloaded", attrs...)
	return true, nil
}

// Watch calls Reload every interval until ctx ends. Files that cannot be
// used are logged (once per content) and the previous material kept.
func (s *Source) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = s.Reload()
		}
	}
}

func equalRaw(a, b [3][]byte) bool {
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func (s *Source) read() ([3][]byte, error) {
	var raw [3][]byte
	for i, name := range []string{s.files.CertFile, s.files.KeyFile, s.files.CAFile} {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return raw, fmt.Errorf("tlsconfig: %w", err)
		}
		raw[i] = b
	}
	return raw, nil
}

func (s *Source) parse(raw [3][]byte) (*material, error) {
	m := &material{raw: raw}
	if s.files.CertFile != "" {
		c, err := tls.X509KeyPair(raw[0], raw[1])
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: certificate %s with key %s: %w", s.files.CertFile, s.files.KeyFile, err)
		}
		m.cert = &c
	}
	if s.files.CAFile != "" {
		cas, err := ParseCertificates(raw[2])
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: CA file %s: %w", s.files.CAFile, err)
		}
		m.cas = cas
		m.pool = x509.NewCertPool()
		for _, c := range cas {
			m.pool.AddCert(c)
		}
	}
	return m, nil
}

// ParseCertificates parses every CERTIFICATE block of a PEM bundle. It
// fails on a bundle with no certificate, a block it cannot parse, or bytes
// that are not PEM.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("trailing data that is not PEM")
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}
