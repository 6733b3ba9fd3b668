package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/shale-db/shale/internal/freeport"
)

// The etcd peer: a cluster of etcd members, each a separate OS process
// running this very binary's hidden EtcdMemberCommand subcommand, which
// embeds go.etcd.io/etcd/server/v3 with etcd's default settings (fsync on,
// default snapshot count, heartbeat and election timeouts, no
// auto-compaction, 2 GiB backend quota). Clients use go.etcd.io/etcd/client/v3
// with every member as an endpoint (the client balances requests over them
// round robin); Get is etcd's default, linearizable, read.

func init() { Register("etcd", startEtcd) }

// EtcdMemberCommand is the name of the hidden subcommand of shale-bench that
// runs one etcd member (RunEtcdMember). The etcd peer starts its members as
// os.Executable() EtcdMemberCommand MemberConfig.Args()...
const EtcdMemberCommand = "etcd-member"

// MemberConfig is one etcd member's command line.
type MemberConfig struct {
	// Name is the member's name, unique in the cluster.
	Name string
	// DataDir is etcd's data directory (WAL, snapshots, bbolt backend).
	DataDir string
	// ListenPeer and ListenClient are the member's peer and client URLs
	// (also advertised), e.g. http://127.0.0.1:2380.
	ListenPeer, ListenClient string
	// InitialCluster is etcd's --initial-cluster: name=peerURL,...
	InitialCluster string
	// Token is etcd's --initial-cluster-token.
	Token string
	// LogFile receives etcd's log.
	LogFile string
}

// Args returns the member's flags, as parsed by shale-bench etcd-member.
func (m MemberConfig) Args() []string {
	return []string{
		"--name", m.Name,
		"--data-dir", m.DataDir,
		"--listen-peer", m.ListenPeer,
		"--listen-client", m.ListenClient,
		"--initial-cluster", m.InitialCluster,
		"--initial-cluster-token", m.Token,
		"--log-file", m.LogFile,
	}
}

// RunEtcdMember runs one member of a new etcd cluster with etcd's default
// settings until ctx is done (then it closes the member cleanly and returns
// nil) or the member fails.
func RunEtcdMember(ctx context.Context, m MemberConfig) error {
	peer, err := url.Parse(m.ListenPeer)
	if err != nil {
		return fmt.Errorf("--listen-peer: %w", err)
	}
	client, err := url.Parse(m.ListenClient)
	if err != nil {
		return fmt.Errorf("--listen-client: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.DataDir
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.InitialCluster = m.InitialCluster
	cfg.InitialClusterToken = m.Token
	cfg.ClusterState = embed.ClusterStateFlagNew
	if m.LogFile != "" {
		cfg.LogOutputs = []string{m.LogFile}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd member %s: %w", m.Name, err)
	}
	select {
	case <-ctx.Done():
		e.Close()
		return nil
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd member %s: %w", m.Name, err)
	case <-e.Server.StopNotify():
		e.Close()
		return fmt.Errorf("etcd member %s: server stopped", m.Name)
	}
}

// etcdCluster is a running etcd cluster of member processes.
type etcdCluster struct {
	endpoints []string
	procs     []*childProc
}

// startEtcd starts the members on free ports. The ports are picked by
// binding port 0 and closing the listeners, so another process may take
// one before its member binds it; the start is then retried on new ports.
func startEtcd(ctx context.Context, cfg ClusterConfig) (Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := startEtcdOnce(ctx, cfg)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		cfg.logf("etcd: %v; retrying on other ports", err)
		for i := range cfg.Members {
			if err := os.RemoveAll(filepath.Join(cfg.Dir, fmt.Sprintf("etcd%d", i))); err != nil {
				return nil, err
			}
		}
	}
}

func startEtcdOnce(ctx context.Context, cfg ClusterConfig) (Cluster, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable to start etcd members: %w", err)
	}
	ports, err := freeport.Ports(2 * cfg.Members)
	if err != nil {
		return nil, fmt.Errorf("pick ports: %w", err)
	}
	members := make([]MemberConfig, cfg.Members)
	var initial []string
	for i := range members {
		dir := filepath.Join(cfg.Dir, fmt.Sprintf("etcd%d", i))
		members[i] = MemberConfig{
			Name:         fmt.Sprintf("etcd%d", i),
			DataDir:      filepath.Join(dir, "data"),
			ListenPeer:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			ListenClient: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			Token:        "shale-bench",
			LogFile:      filepath.Join(dir, "etcd.log"),
		}
		initial = append(initial, members[i].Name+"="+members[i].ListenPeer)
	}
	c := &etcdCluster{}
	for i := range members {
		m := &members[i]
		m.InitialCluster = strings.Join(initial, ",")
		c.endpoints = append(c.endpoints, m.ListenClient)
		dir := filepath.Dir(m.DataDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			_ = c.Stop()
			return nil, err
		}
		cmd := exec.Command(exe, append([]string{EtcdMemberCommand}, m.Args()...)...)
		p, err := startChild("etcd member "+m.Name, cmd, filepath.Join(dir, "stderr.log"), "etcd log in "+m.LogFile)
		if err != nil {
			_ = c.Stop()
			return nil, err
		}
		c.procs = append(c.procs, p)
		cfg.logf("etcd: member %s pid %d, client %s, peer %s", m.Name, cmd.Process.Pid, m.ListenClient, m.ListenPeer)
	}
	if err := c.waitHealthy(ctx); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// waitHealthy waits until every member reports the same leader and a
// linearizable read succeeds.
func (c *etcdCluster) waitHealthy(ctx context.Context) error {
	cli, err := c.newClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	var last error
	for {
		for _, p := range c.procs {
			if p.exited() {
				return fmt.Errorf("%s exited during start (%v); %s", p.name, p.waitErr, p.tail())
			}
		}
		if last = c.healthy(ctx, cli); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd cluster not healthy: %w (last check: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *etcdCluster) healthy(ctx context.Context, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var leader uint64
	for _, ep := range c.endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("status of %s: %w", ep, err)
		}
		if st.Leader == 0 {
			return fmt.Errorf("%s has no leader", ep)
		}
		if leader != 0 && st.Leader != leader {
			return fmt.Errorf("members disagree on the leader")
		}
		leader = st.Leader
	}
	_, err := cli.Get(ctx, "shale-bench-health")
	return err
}

func (c *etcdCluster) newClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   c.endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// Name implements Cluster.
func (c *etcdCluster) Name() string { return "etcd" }

// Pids are the member processes' IDs (for the cells' CPU time).
func (c *etcdCluster) Pids() []int {
	out := make([]int, len(c.procs))
	for i, p := range c.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

// Client implements Cluster: a clientv3.Client with every member as an
// endpoint.
func (c *etcdCluster) Client(ctx context.Context) (KV, error) {
	cli, err := c.newClient()
	if err != nil {
		return nil, err
	}
	return etcdKV{cli}, nil
}

// Stop implements Cluster: SIGTERM to the followers, then to the leader
// (each member closes its etcd server cleanly and exits), and SIGKILL to any
// member still running 20 s later. Followers go first because a leader
// that is told to stop transfers its leadership, which waits out a timeout
// (about 7 s) when the chosen follower is stopping too.
func (c *etcdCluster) Stop() error {
	// The followers first, so the leader does not step down and hold an
	// election while they go.
	leader := c.leaderIndex()
	var followers, last []*childProc
	for i, p := range c.procs {
		if i == leader {
			last = append(last, p)
		} else {
			followers = append(followers, p)
		}
	}
	errs := append(stopChildren(followers), stopChildren(last)...)
	c.procs = nil
	return errors.Join(errs...)
}

// leaderIndex is the index in procs of the current leader, or -1.
func (c *etcdCluster) leaderIndex() int {
	if len(c.endpoints) == 0 {
		return -1
	}
	cli, err := c.newClient()
	if err != nil {
		return -1
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i, ep := range c.endpoints {
		if i >= len(c.procs) || c.procs[i].exited() {
			continue
		}
		st, err := cli.Status(ctx, ep)
		if err == nil && st.Header != nil && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// etcdKV is the KV of one clientv3 connection.
type etcdKV struct{ cli *clientv3.Client }

// Put implements KV.
func (kv etcdKV) Put(ctx context.Context, key, value []byte) error {
	_, err := kv.cli.Put(ctx, string(key), string(value))
	return err
}

// Get implements KV with etcd's default, linearizable, read.
func (kv etcdKV) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	resp, err := kv.cli.Get(ctx, string(key))
	if err != nil {
		return nil, false, err
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

// Scan is a linearizable range read from start to the end of the key space
// with a limit. etcd counts every key in the range for the response's
// Count even when the limit cuts the returned keys short, so its cost grows
// with the number of keys after start.
func (kv etcdKV) Scan(ctx context.Context, start []byte, limit int) (int, error) {
	resp, err := kv.cli.Get(ctx, string(start), clientv3.WithFromKey(), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

// Close implements KV.
func (kv etcdKV) Close() error { return kv.cli.Close() }
