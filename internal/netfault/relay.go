// Package netfault provides network faults for tests: a TCP relay whose
// connections can be silenced, the way a connection to a peer that moved
// to another address (a restarted pod, a dropped route) goes silent: no
// error, no answer.
package netfault

import (
	"net"
	"sync"
	"testing"
)

// Relay forwards the TCP connections it accepts to a backend address. Its
// existing connections can be silenced (Silence); new ones are forwarded
// as before.
type Relay struct {
	lis     net.Listener
	backend string

	mu     sync.Mutex
	conns  []net.Conn
	silent map[net.Conn]bool
	wg     sync.WaitGroup
}

// NewRelay starts a relay on a loopback port in front of backend; it is
// closed, with its connections, when the test ends.
func NewRelay(t testing.TB, backend string) *Relay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{lis: lis, backend: backend, silent: map[net.Conn]bool{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

// Addr is the relay's address.
func (r *Relay) Addr() string { return r.lis.Addr().String() }

// Silence makes every connection accepted so far carry nothing more,
// either way, while staying open.
func (r *Relay) Silence() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		r.silent[c] = true
	}
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.lis.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.backend)
		if err != nil {
			_ = in.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, in, out)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(out, in)
		go r.pipe(in, out)
	}
}

func (r *Relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			_ = dst.Close()
			return
		}
		r.mu.Lock()
		silent := r.silent[src]
		r.mu.Unlock()
		if silent {
			continue // read and dropped: the sender sees no error
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_ = src.Close()
			return
		}
	}
}

func (r *Relay) close() {
	_ = r.lis.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
