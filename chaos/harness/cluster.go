// Package harness runs Shale clusters in Docker containers for fault
// tests: every node is a container of the Shale image with its own named
// volume, on two networks — a peer network the nodes talk to each other
// over (through the harness's link proxy, so links can be cut one way or
// slowed down) and a client network the test's clients use, so that a
// partition of the peers never cuts the test off from the nodes it
// observes. It drives faults through the Docker API: kill -9 and restart
// on the same volume, graceful stop, pause, network disconnect.
//
// testcontainers-go creates the containers; set
// TESTCONTAINERS_RYUK_DISABLED=true (there is no registry to pull Ryuk
// from): the Cluster removes its own containers, networks and volumes on
// Close.
package harness

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/network"
	mobyclient "github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcnetwork "github.com/testcontainers/testcontainers-go/network"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shale-db/shale/client"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Port is the gRPC port of every node (clients and peers).
const Port = 7001

// Options configure a Cluster.
type Options struct {
	// Nodes is the number of founding nodes (default 3).
	Nodes int
	// Image is the Shale image (default: EnsureImage's).
	Image string
	// Name prefixes the Docker objects (default "shale-chaos-" and a
	// random suffix).
	Name string
	// Args are extra shale-server arguments for every node.
	Args []string
	// Env are extra environment variables for every node.
	Env map[string]string
	// LogDir, when set, receives every container's log on Close
	// (<name>.log).
	LogDir string
	// Logger logs what the harness does (default: discard).
	Logger *slog.Logger
	// DiskBytes, when positive, gives every node a disk of that size (a
	// tmpfs volume kept across restarts) that FillDisk can fill; else each
	// node's volume is on the Docker host's disk.
	DiskBytes int64
	// Insecure runs the cluster in plaintext, without auth (for
	// debugging). By default every node serves mutual TLS to clients and
	// peers with certificates of a CA made for the cluster (client
	// certificates required), and auth is on: Client connects as the
	// workload user, AdminClient as root.
	Insecure bool
}

// Node is one node of a Cluster.
type Node struct {
	// ID is the node's ID; Host its advertised host name on the peer
	// network ("n1"); Name its container's name.
	ID         uint64
	Host, Name string

	container testcontainers.Container
	volume    string
	clientIP  netip.Addr
	peerIP    netip.Addr
	// holder is the container keeping a small disk (Options.DiskBytes)
	// mounted; ballast counts the files FillDisk wrote on it.
	holder  string
	ballast int
}

// Cluster is a running containerised cluster.
type Cluster struct {
	opts      Options
	log       *slog.Logger
	docker    *testcontainers.DockerClient
	peerNet   *testcontainers.DockerNetwork
	clientNet *testcontainers.DockerNetwork
	proxy     *linkProxy

	mu    sync.Mutex
	nodes map[uint64]*Node
	// hosts counts the hosts named so far (n1, n2, ...): a joining node
	// gets the next name, whatever ID the cluster gives it.
	hosts int
	// baseArgs are every node's arguments but --advertise.
	baseArgs []string
	// sec is the CA, client certificates and passwords of a secured
	// cluster; nil with Options.Insecure.
	sec *security
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start creates the networks, volumes and containers of a new cluster,
// starts every node, and waits until each serves gRPC. On error it removes
// what it created.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Name == "" {
		opts.Name = "shale-chaos-" + randomSuffix()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Image == "" {
		if opts.Image, err = EnsureImage(ctx); err != nil {
			return nil, err
		}
	}
	c := &Cluster{opts: opts, log: opts.Logger, nodes: map[uint64]*Node{}}
	defer func() {
		if err != nil {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	if c.docker, err = testcontainers.NewDockerClientWithOpts(ctx); err != nil {
		return nil, fmt.Errorf("harness: docker client: %w", err)
	}
	if c.peerNet, err = tcnetwork.New(ctx, tcnetwork.WithDriver("bridge")); err != nil {
		return nil, fmt.Errorf("harness: create the peer network: %w", err)
	}
	if c.clientNet, err = tcnetwork.New(ctx, tcnetwork.WithDriver("bridge")); err != nil {
		return nil, fmt.Errorf("harness: create the client network: %w", err)
	}
	ins, err := c.docker.NetworkInspect(ctx, c.peerNet.ID, mobyclient.NetworkInspectOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: inspect the peer network: %w", err)
	}
	if len(ins.Network.IPAM.Config) == 0 || !ins.Network.IPAM.Config[0].Gateway.IsValid() {
		return nil, errors.New("harness: the peer network has no gateway address")
	}
	gw := ins.Network.IPAM.Config[0].Gateway
	if !opts.Insecure {
		if c.sec, err = newSecurity(opts.Name); err != nil {
			return nil, err
		}
	}
	if c.proxy, err = newLinkProxy(netip.AddrPortFrom(gw, 0).String(), c.log); err != nil {
		return nil, err
	}
	var initial []string
	for id := uint64(1); id <= uint64(opts.Nodes); id++ {
		initial = append(initial, fmt.Sprintf("%d=n%d:%d", id, id, Port))
	}
	// As in the Kubernetes StatefulSet: every node gets the same settings;
	// a node whose address is in the initial cluster founds it under that
	// ID, any other joins.
	c.baseArgs = append([]string{
		"--initial-cluster=" + strings.Join(initial, ","),
		"--join=n1:" + fmt.Sprint(Port),
		"--cluster-name=" + opts.Name,
	}, opts.Args...)
	if c.sec != nil {
		c.baseArgs = append(tlsArgs(), c.baseArgs...)
	}
	c.hosts = opts.Nodes
	var (
		wg   sync.WaitGroup
		errs = make(chan error, opts.Nodes)
	)
	for id := uint64(1); id <= uint64(opts.Nodes); id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.create(ctx, fmt.Sprintf("n%d", id), id); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	if err != nil {
		return nil, err
	}
	if c.sec != nil {
		if err := c.enableAuth(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// create makes the volume and container of the node advertising host,
// starts it, waits until it serves, and returns its ID: id for a founding
// node, the one the cluster gave it for a joining node (id 0).
func (c *Cluster) create(ctx context.Context, host string, id uint64) (uint64, error) {
	n := &Node{ID: id, Host: host, Name: fmt.Sprintf("%s-%s", c.opts.Name, host), volume: fmt.Sprintf("%s-%s-data", c.opts.Name, host)}
	args := append([]string{fmt.Sprintf("--advertise=%s:%d", host, Port)}, c.baseArgs...)
	if id == 0 {
		// A joining node asks a node still in the cluster: n1, in every
		// node's settings, may have been removed (the last --join wins).
		if ids := c.NodeIDs(); len(ids) > 0 {
			args = append(args, fmt.Sprintf("--join=%s:%d", c.hostOf(ids[0]), Port))
		}
	}
	env := map[string]string{
		// Peer traffic goes through the link proxy (gRPC honours
		// HTTPS_PROXY for plaintext connections too; loopback is exempt).
		"HTTPS_PROXY":     "http://" + c.proxy.Addr(),
		"SHALE_LOG_LEVEL": "info",
		// SetClockOffset writes the file; until then the clock is right.
		"SHALE_TESTING_CLOCK_OFFSET_FILE": clockOffsetFile,
		// SetDiskLatency writes this one; until then the disk is fast.
		"SHALE_TESTING_DISK_LATENCY_FILE": diskLatencyFile,
	}
	for k, v := range c.opts.Env {
		env[k] = v
	}
	if c.opts.DiskBytes > 0 {
		if err := c.createDisk(ctx, n, c.opts.DiskBytes); err != nil {
			_ = c.removeHolder(context.WithoutCancel(ctx), n)
			return 0, err
		}
	}
	req := testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:          c.opts.Image,
			Name:           n.Name,
			Cmd:            args,
			Env:            env,
			Networks:       []string{c.peerNet.Name, c.clientNet.Name},
			NetworkAliases: map[string][]string{c.peerNet.Name: {n.Host}},
			Mounts:         testcontainers.Mounts(testcontainers.VolumeMount(n.volume, "/var/lib/shale")),
			Labels:         map[string]string{"shale-chaos": c.opts.Name},
		},
		Started: false,
	}
	ctr, err := testcontainers.GenericContainer(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("harness: create node %s: %w", host, err)
	}
	n.container = ctr
	if c.sec != nil {
		if err := c.installCertificates(ctx, n); err != nil {
			_ = testcontainers.TerminateContainer(ctr, testcontainers.StopTimeout(0))
			_ = c.removeHolder(context.WithoutCancel(ctx), n)
			_, _ = c.docker.VolumeRemove(context.WithoutCancel(ctx), n.volume, mobyclient.VolumeRemoveOptions{Force: true})
			return 0, err
		}
	}
	if id != 0 {
		c.mu.Lock()
		c.nodes[id] = n
		c.mu.Unlock()
		return id, c.Start(ctx, id)
	}
	// A joining node: start it, then ask it which ID it got.
	if err := c.startNode(ctx, n); err != nil {
		_ = testcontainers.TerminateContainer(ctr, testcontainers.StopTimeout(0))
		_ = c.removeHolder(context.WithoutCancel(ctx), n)
		_, _ = c.docker.VolumeRemove(context.WithoutCancel(ctx), n.volume, mobyclient.VolumeRemoveOptions{Force: true})
		return 0, err
	}
	info, err := c.nodeInfo(ctx, n)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	n.ID = info.GetNode().GetNodeId()
	c.nodes[n.ID] = n
	c.mu.Unlock()
	return n.ID, nil
}

// NodeInfo asks node id itself for its status and every replica's view
// of its shard (leader, term, indexes, quiesced, stopped).
func (c *Cluster) NodeInfo(ctx context.Context, id uint64) (*shalev1.NodeInfoResponse, error) {
	n := c.Node(id)
	if n == nil {
		return nil, fmt.Errorf("harness: no node %d", id)
	}
	return c.nodeInfo(ctx, n)
}

func (c *Cluster) nodeInfo(ctx context.Context, n *Node) (*shalev1.NodeInfoResponse, error) {
	c.mu.Lock()
	ip := n.clientIP
	c.mu.Unlock()
	if !ip.IsValid() {
		return nil, fmt.Errorf("harness: node %s has no client network address", n.Host)
	}
	cc, err := grpc.NewClient(netip.AddrPortFrom(ip, Port).String(), c.nodeDialOption(n))
	if err != nil {
		return nil, fmt.Errorf("harness: node %s: %w", n.Host, err)
	}
	defer cc.Close()
	info, err := shalev1.NewAdminClient(cc).NodeInfo(ctx, &shalev1.NodeInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("harness: node %s: node info: %w", n.Host, err)
	}
	return info, nil
}

// Node returns node id, or nil.
func (c *Cluster) Node(id uint64) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// NodeIDs returns the IDs of the cluster's nodes, sorted.
func (c *Cluster) NodeIDs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]uint64, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// ClientAddr is node id's gRPC address on the client network.
func (c *Cluster) ClientAddr(id uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	if n == nil || !n.clientIP.IsValid() {
		return ""
	}
	return netip.AddrPortFrom(n.clientIP, Port).String()
}

// translate maps an address the cluster reports ("n2:7001") to the node's
// address on the client network; other addresses pass unchanged.
func (c *Cluster) translate(addr string) string {
	host, _, ok := strings.Cut(addr, ":")
	if !ok {
		return addr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Host == host && n.clientIP.IsValid() {
			return netip.AddrPortFrom(n.clientIP, Port).String()
		}
	}
	return addr
}

// Client returns a Go SDK client of the cluster, reaching every node on the
// client network. The caller closes it. On a secured cluster it connects
// with TLS, presenting the workload user's client certificate, and logs in
// as the workload user (client.WithCredentials): it may read and write
// every key, and make no admin call (see AdminClient).
//
// The client dials the nodes by their advertised names ("n2:7001"), and
// every connection attempt looks up the node's current address on the
// client network: a restarted container may have a new one.
func (c *Cluster) Client(ctx context.Context, opts ...client.Option) (*client.Client, error) {
	if c.sec == nil {
		return c.newClient(ctx, nil, opts...)
	}
	return c.newClient(ctx, c.sec.userTLS, append([]client.Option{client.WithCredentials(WorkloadUser, c.sec.userPassword)}, opts...)...)
}

// AdminClient is Client logged in as root, for admin calls (adding,
// draining and removing nodes, placement, replica checksums). On an
// insecure cluster it is the same as Client.
func (c *Cluster) AdminClient(ctx context.Context, opts ...client.Option) (*client.Client, error) {
	if c.sec == nil {
		return c.newClient(ctx, nil, opts...)
	}
	return c.newClient(ctx, c.sec.rootTLS, append([]client.Option{client.WithCredentials(RootUser, c.sec.rootPassword)}, opts...)...)
}

// newClient makes an SDK client with TLS configuration tlsCfg (nil:
// plaintext).
func (c *Cluster) newClient(ctx context.Context, tlsCfg *tls.Config, opts ...client.Option) (*client.Client, error) {
	var eps []string
	for _, id := range c.NodeIDs() {
		if n := c.Node(id); n != nil {
			eps = append(eps, fmt.Sprintf("%s:%d", n.Host, Port))
		}
	}
	var d net.Dialer
	// The node's certificate is checked for the name dialed ("n2"), not
	// the address the dialer reaches it at.
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", c.translate(addr))
	})
	base := []client.Option{
		client.WithAddressMap(func(addr string) string { return "passthrough:///" + addr }),
		client.WithDialOptions(dialer),
	}
	if tlsCfg != nil {
		base = append(base, client.WithTLS(tlsCfg))
	}
	opts = append(base, opts...)
	return client.New(ctx, eps, opts...)
}

// Start starts node id's stopped (or killed) container on its volume,
// learns its new addresses, and waits until it serves gRPC.
func (c *Cluster) Start(ctx context.Context, id uint64) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("harness: no node %d", id)
	}
	return c.startNode(ctx, n)
}

func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	if _, err := c.docker.ContainerStart(ctx, n.container.GetContainerID(), mobyclient.ContainerStartOptions{}); err != nil {
		return fmt.Errorf("harness: start node %s: %w", n.Host, err)
	}
	if err := c.refreshAddrs(ctx, n); err != nil {
		return err
	}
	return c.waitServing(ctx, n, time.Minute)
}

// AddNode starts a new node that joins the running cluster (as a pod
// beyond the initial cluster does) and returns the ID the cluster gave it.
func (c *Cluster) AddNode(ctx context.Context) (uint64, error) {
	c.mu.Lock()
	c.hosts++
	host := fmt.Sprintf("n%d", c.hosts)
	c.mu.Unlock()
	return c.create(ctx, host, 0)
}

// RemoveNode takes node id out of the cluster the way an operator does:
// decommission (its replicas and leaderships move away), wait until it is
// drained, remove it from the registry, then delete its container and
// volume. cl is a client of the cluster allowed admin calls
// (AdminClient).
func (c *Cluster) RemoveNode(ctx context.Context, cl *client.Client, id uint64) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("harness: no node %d", id)
	}
	if err := cl.DecommissionNode(ctx, id); err != nil {
		return fmt.Errorf("harness: decommission node %d: %w", id, err)
	}
	// Drained as "shalectl node status" says it: no replica of the node in
	// the shard directory (counting learners not created on it yet) and no
	// leadership, seen twice in a row (the directory trails by a second).
	for zero := 0; zero < 2; {
		st, err := cl.PlacementStatus(ctx)
		drained := false
		if err == nil {
			for _, np := range st.GetNodes() {
				if np.GetNode().GetNodeId() == id && np.GetReplicas() == 0 && np.GetLeaders() == 0 {
					drained = true
				}
			}
		}
		if drained {
			zero++
		} else {
			zero = 0
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: node %d not drained: %w (last: %v)", id, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err := cl.RemoveNode(ctx, id); err != nil {
		return fmt.Errorf("harness: remove node %d: %w", id, err)
	}
	c.mu.Lock()
	delete(c.nodes, id)
	c.mu.Unlock()
	c.proxy.removeNode(n.Host)
	if err := testcontainers.TerminateContainer(n.container, testcontainers.StopTimeout(10*time.Second)); err != nil {
		return fmt.Errorf("harness: delete node %d's container: %w", id, err)
	}
	if err := c.removeHolder(ctx, n); err != nil {
		return err
	}
	if _, err := c.docker.VolumeRemove(ctx, n.volume, mobyclient.VolumeRemoveOptions{Force: true}); err != nil {
		return fmt.Errorf("harness: delete node %d's volume: %w", id, err)
	}
	return nil
}

// hostOf is node id's advertised host ("" if unknown).
func (c *Cluster) hostOf(id uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[id]; n != nil {
		return n.Host
	}
	return ""
}

// idOf is the ID of the node advertising host (0 if unknown).
func (c *Cluster) idOf(host string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.nodes {
		if n.Host == host {
			return id
		}
	}
	return 0
}

// refreshAddrs reads the node's addresses on both networks.
func (c *Cluster) refreshAddrs(ctx context.Context, n *Node) error {
	ins, err := c.docker.ContainerInspect(ctx, n.container.GetContainerID(), mobyclient.ContainerInspectOptions{})
	if err != nil {
		return fmt.Errorf("harness: inspect node %d: %w", n.ID, err)
	}
	var peerIP, clientIP netip.Addr
	if ins.Container.NetworkSettings != nil {
		if ep := ins.Container.NetworkSettings.Networks[c.peerNet.Name]; ep != nil {
			peerIP = ep.IPAddress
		}
		if ep := ins.Container.NetworkSettings.Networks[c.clientNet.Name]; ep != nil {
			clientIP = ep.IPAddress
		}
	}
	c.mu.Lock()
	n.peerIP, n.clientIP = peerIP, clientIP
	c.mu.Unlock()
	if peerIP.IsValid() {
		c.proxy.setNode(n.Host, peerIP, Port)
	}
	return nil
}

// waitServing polls node n's gRPC health until it reports SERVING.
func (c *Cluster) waitServing(ctx context.Context, n *Node, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c.mu.Lock()
	ip := n.clientIP
	c.mu.Unlock()
	if !ip.IsValid() {
		return fmt.Errorf("harness: node %s has no client network address", n.Host)
	}
	addr := netip.AddrPortFrom(ip, Port).String()
	cc, err := grpc.NewClient(addr, c.nodeDialOption(n))
	if err != nil {
		return fmt.Errorf("harness: node %s: %w", n.Host, err)
	}
	defer cc.Close()
	var last error
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		resp, err := healthpb.NewHealthClient(cc).Check(actx, &healthpb.HealthCheckRequest{})
		acancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("health %s", resp.GetStatus())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: node %s not serving after %v: %w (log tail: %s)", n.Host, timeout, last, c.nodeLogTail(n, 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logTail returns the last lines of node id's container log.
func (c *Cluster) logTail(id uint64, lines int) string {
	n := c.Node(id)
	if n == nil {
		return fmt.Sprintf("no node %d", id)
	}
	return c.nodeLogTail(n, lines)
}

func (c *Cluster) nodeLogTail(n *Node, lines int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := n.container.Logs(ctx)
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Logs returns node id's container log (stdout and stderr, every run).
func (c *Cluster) Logs(ctx context.Context, id uint64) ([]byte, error) {
	n := c.Node(id)
	if n == nil {
		return nil, fmt.Errorf("harness: no node %d", id)
	}
	r, err := n.container.Logs(ctx)
	if err != nil {
		return nil, fmt.Errorf("harness: logs of node %d: %w", id, err)
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Close saves the logs (Options.LogDir) and removes the cluster's
// containers, volumes and networks.
func (c *Cluster) Close(ctx context.Context) error {
	var errs []error
	for _, id := range c.NodeIDs() {
		n := c.Node(id)
		if c.opts.LogDir != "" {
			if b, err := c.Logs(ctx, id); err == nil {
				if err := os.MkdirAll(c.opts.LogDir, 0o755); err == nil {
					_ = os.WriteFile(filepath.Join(c.opts.LogDir, n.Name+".log"), b, 0o644)
				}
			}
		}
		// Unpause first: a paused container cannot be removed.
		_, _ = c.docker.ContainerUnpause(ctx, n.container.GetContainerID(), mobyclient.ContainerUnpauseOptions{})
		if err := testcontainers.TerminateContainer(n.container, testcontainers.StopTimeout(0)); err != nil {
			errs = append(errs, fmt.Errorf("remove node %d: %w", id, err))
		}
		if err := c.removeHolder(ctx, n); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.docker.VolumeRemove(ctx, n.volume, mobyclient.VolumeRemoveOptions{Force: true}); err != nil {
			errs = append(errs, fmt.Errorf("remove node %d's volume: %w", id, err))
		}
	}
	if c.proxy != nil {
		c.proxy.close()
	}
	for _, nw := range []*testcontainers.DockerNetwork{c.peerNet, c.clientNet} {
		if nw != nil {
			if err := nw.Remove(ctx); err != nil {
				errs = append(errs, fmt.Errorf("remove network %s: %w", nw.Name, err))
			}
		}
	}
	if c.docker != nil {
		_ = c.docker.Close()
	}
	return errors.Join(errs...)
}

// peerEndpoint is the settings to reconnect a node to the peer network.
func (c *Cluster) peerEndpoint(n *Node) *network.EndpointSettings {
	return &network.EndpointSettings{Aliases: []string{n.Host}}
}
