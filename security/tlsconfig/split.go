package tlsconfig

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// recordTypeHandshake is the first byte of every TLS connection (a
// ClientHello record).
const recordTypeHandshake = 0x16

// firstByteTimeout bounds how long a new connection may stay silent before
// it is closed unsorted.
const firstByteTimeout = 10 * time.Second

// SplitListener sorts the connections lis accepts by their first byte:
// TLS handshakes go to tlsL, everything else (a plaintext client) to
// plainL, so that the node can answer a plaintext client with an error
// that says TLS is required. Closing both, or lis, closes lis. log
// receives a line per plaintext connection (nil: discard).
func SplitListener(lis net.Listener, log *slog.Logger) (tlsL, plainL net.Listener) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sp := &splitter{lis: lis, log: log, done: make(chan struct{})}
	sp.tls = &subListener{sp: sp, conns: make(chan net.Conn), closed: make(chan struct{})}
	sp.plain = &subListener{sp: sp, conns: make(chan net.Conn), closed: make(chan struct{})}
	go sp.acceptLoop()
	return sp.tls, sp.plain
}

type splitter struct {
	lis        net.Listener
	log        *slog.Logger
	tls, plain *subListener

	mu   sync.Mutex
	err  error // the accept error that ended the loop
	done chan struct{}
	once sync.Once
}

func (sp *splitter) acceptLoop() {
	for {
		c, err := sp.lis.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			sp.mu.Lock()
			sp.err = err
			sp.mu.Unlock()
			sp.once.Do(func() { close(sp.done) })
			return
		}
		go sp.sort(c)
	}
}

func (sp *splitter) sort(c net.Conn) {
	var b [1]byte
	_ = c.SetReadDeadline(time.Now().Add(firstByteTimeout))
	n, err := c.Read(b[:])
	_ = c.SetReadDeadline(time.Time{})
	if err != nil || n == 0 {
		c.Close()
		return
	}
	to := sp.tls
	if b[0] != recordTypeHandshake {
		to = sp.plain
		sp.log.Warn("plaintext connection to a TLS port; answering that TLS is required", "remote", c.RemoteAddr().String())
	}
	pc := &prefixConn{Conn: c, first: b[0], pending: true}
	select {
	case to.conns <- pc:
	case <-to.closed:
		c.Close()
	case <-sp.done:
		c.Close()
	}
}

// closeIfBoth closes the shared listener once both halves are closed.
func (sp *splitter) closeIfBoth() {
	select {
	case <-sp.tls.closed:
	default:
		return
	}
	select {
	case <-sp.plain.closed:
	default:
		return
	}
	sp.lis.Close()
}

type subListener struct {
	sp     *splitter
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.sp.done:
		l.sp.mu.Lock()
		defer l.sp.mu.Unlock()
		return nil, l.sp.err
	}
}

func (l *subListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.sp.closeIfBoth()
	})
	return nil
}

func (l *subListener) Addr() net.Addr { return l.sp.lis.Addr() }

// prefixConn gives back the byte read to sort the connection.
type prefixConn struct {
	net.Conn
	mu      sync.Mutex
	first   byte
	pending bool
}

func (c *prefixConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.pending && len(p) > 0 {
		c.pending = false
		p[0] = c.first
		c.mu.Unlock()
		return 1, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}
