package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// linkProxy carries the nodes' peer traffic. Every node container has
// HTTPS_PROXY pointing at it, so each gRPC connection a node opens to a
// peer arrives here as an HTTP CONNECT naming the peer ("n2:7001"); the
// proxy knows the dialing node by its source address. That makes every
// directed link (from, to) a thing the harness can cut (new connections are
// refused and open ones closed) or slow down (bytes are held for a delay),
// which network disconnects cannot do: one-way cuts, partial partitions
// (ring, bridge) and per-link latency.
type linkProxy struct {
	log *slog.Logger
	lis net.Listener

	// Nodes are named by their advertised host ("n1"), which the harness
	// knows before the cluster gives a joining node its ID.
	mu      sync.Mutex
	byIP    map[netip.Addr]string // peer-network address → host
	addrOf  map[string]string     // host → peer-network ip:port to dial
	blocked map[link]bool         // directed links cut
	delay   map[link]time.Duration
	conns   map[link]map[*proxiedConn]struct{}
	opened  map[link]int // connections carried per link, ever
	closed  bool
	wg      sync.WaitGroup
}

// link is a directed peer link between two hosts.
type link struct{ from, to string }

type proxiedConn struct {
	a, b net.Conn
	once sync.Once
}

func (c *proxiedConn) close() {
	c.once.Do(func() {
		_ = c.a.Close()
		_ = c.b.Close()
	})
}

// newLinkProxy listens on addr (the peer network's gateway, port 0).
func newLinkProxy(addr string, log *slog.Logger) (*linkProxy, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("link proxy: listen on %s: %w", addr, err)
	}
	p := &linkProxy{
		log: log, lis: lis,
		byIP: map[netip.Addr]string{}, addrOf: map[string]string{},
		blocked: map[link]bool{}, delay: map[link]time.Duration{},
		conns:  map[link]map[*proxiedConn]struct{}{},
		opened: map[link]int{},
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *linkProxy) Addr() string { return p.lis.Addr().String() }

// setNode records where the node advertising host is on the peer network
// (after every start: a restarted container may get a new address).
func (p *linkProxy) setNode(host string, ip netip.Addr, port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a, h := range p.byIP {
		if h == host {
			delete(p.byIP, a)
		}
	}
	p.byIP[ip] = host
	p.addrOf[host] = net.JoinHostPort(ip.String(), fmt.Sprint(port))
}

// removeNode forgets a node taken out of the cluster.
func (p *linkProxy) removeNode(host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a, h := range p.byIP {
		if h == host {
			delete(p.byIP, a)
		}
	}
	delete(p.addrOf, host)
}

// cut blocks the directed link from → to and closes its open connections.
func (p *linkProxy) cut(from, to string) {
	p.mu.Lock()
	p.blocked[link{from, to}] = true
	var open []*proxiedConn
	for c := range p.conns[link{from, to}] {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close()
	}
}

// setDelay holds every byte on the link from → to for d (0: none).
func (p *linkProxy) setDelay(from, to string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d <= 0 {
		delete(p.delay, link{from, to})
		return
	}
	p.delay[link{from, to}] = d
}

// heal removes every cut and delay.
func (p *linkProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = map[link]bool{}
	p.delay = map[link]time.Duration{}
}

// openedCount returns how many connections the proxy carried on each link.
func (p *linkProxy) openedCount() map[link]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[link]int, len(p.opened))
	for l, n := range p.opened {
		out[l] = n
	}
	return out
}

// cuts lists the blocked links.
func (p *linkProxy) cuts() []link {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []link
	for l := range p.blocked {
		out = append(out, l)
	}
	return out
}

func (p *linkProxy) close() {
	p.mu.Lock()
	p.closed = true
	var open []*proxiedConn
	for _, m := range p.conns {
		for c := range m {
			open = append(open, c)
		}
	}
	p.mu.Unlock()
	_ = p.lis.Close()
	for _, c := range open {
		c.close()
	}
	p.wg.Wait()
}

func (p *linkProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// handle serves one CONNECT from a node.
func (p *linkProxy) handle(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		_ = c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	refuse := func(code int, why string) {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\n\r\n", code, why)
		_ = c.Close()
	}
	if req.Method != http.MethodConnect {
		refuse(http.StatusMethodNotAllowed, "CONNECT only")
		return
	}
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	host, _, err := net.SplitHostPort(req.Host)
	if err != nil {
		refuse(http.StatusBadRequest, "bad target")
		return
	}
	p.mu.Lock()
	from, okFrom := p.byIP[src.Addr().Unmap()]
	to := host
	if ip, err := netip.ParseAddr(host); err == nil {
		to = p.byIP[ip]
	}
	target, okTo := p.addrOf[to]
	l := link{from, to}
	blocked := p.blocked[l] && from != to
	closed := p.closed
	p.mu.Unlock()
	switch {
	case closed:
		refuse(http.StatusServiceUnavailable, "closing")
		return
	case !okFrom || !okTo:
		p.log.Debug("link proxy: unknown endpoint", "from", c.RemoteAddr(), "to", req.Host)
		refuse(http.StatusBadGateway, "unknown node")
		return
	case blocked:
		refuse(http.StatusServiceUnavailable, "link cut")
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	up, err := d.DialContext(context.Background(), "tcp", target)
	if err != nil {
		refuse(http.StatusBadGateway, "dial failed")
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		_ = c.Close()
		_ = up.Close()
		return
	}
	pc := &proxiedConn{a: c, b: up}
	p.mu.Lock()
	if p.blocked[l] || p.closed { // cut while dialing
		p.mu.Unlock()
		pc.close()
		return
	}
	if p.conns[l] == nil {
		p.conns[l] = map[*proxiedConn]struct{}{}
	}
	p.conns[l][pc] = struct{}{}
	p.opened[l]++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns[l], pc)
		p.mu.Unlock()
		pc.close()
	}()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, br, l); done <- struct{}{} }()             // from → to
	go func() { p.pipe(c, up, link{to, from}); done <- struct{}{} }() // replies, to → from
	<-done
}

// pipe copies src to dst, holding every chunk for the link's delay (read
// when the chunk arrives, so a delay change applies to new bytes).
func (p *linkProxy) pipe(dst io.Writer, src io.Reader, l link) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 256)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				d := p.delay[l]
				p.mu.Unlock()
				q <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if wait := time.Until(c.at); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.b); err != nil {
			for range q { // drain until the reader sees the close
			}
			return
		}
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
