package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	shaleclient "github.com/shale-db/shale/client"
)

// runCluster is the cluster of one benchmark run, in its own directory:
// the directory is removed when the run ends well and kept, with the
// servers' logs, when it fails.
type runCluster struct {
	dir    string
	keep   bool
	nodes  *ShaleNodes
	failed bool
}

// startRunCluster starts members shale-server nodes in dir as a new
// cluster with the given --initial-splits (StartShaleNodes). keep keeps
// dir even when the run ends well.
func startRunCluster(ctx context.Context, dir string, members int, splits string, keep bool, log io.Writer) (*runCluster, error) {
	nodes, err := StartShaleNodes(ctx, dir, members, splits, log)
	if err != nil {
		return nil, fmt.Errorf("start: %w (data and logs kept in %s)", err, dir)
	}
	return &runCluster{dir: dir, keep: keep, nodes: nodes}, nil
}

// fail marks the run failed, so that stop keeps its directory, and returns
// err saying where that directory is.
func (c *runCluster) fail(err error) error {
	c.failed = true
	return fmt.Errorf("%w (data and logs kept in %s)", err, c.dir)
}

// stop stops the nodes and then removes the directory, unless the run
// failed (a node that had to be killed or exited with an error fails it:
// the error is returned) or the directory is to be kept.
func (c *runCluster) stop() error {
	err := c.nodes.Stop()
	if err != nil {
		c.failed = true
		err = fmt.Errorf("stop: %w", err)
	}
	if !c.failed && !c.keep {
		_ = os.RemoveAll(c.dir)
	}
	return err
}

// connect opens a client to every node and waits until wantShards shards
// have a leader, all within timeout; a failure fails the run.
func (c *runCluster) connect(ctx context.Context, timeout time.Duration, wantShards int, log io.Writer) (*shaleclient.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := c.nodes.NewClient(ctx, log)
	if err != nil {
		return nil, c.fail(fmt.Errorf("connect: %w", err))
	}
	if _, err := c.nodes.WaitReady(ctx, cli, wantShards); err != nil {
		cli.Close()
		return nil, c.fail(err)
	}
	return cli, nil
}

// freshRunDir finds the shale-server binary (building it if need be), then
// empties or creates the directory name under parent and returns its
// absolute path.
func freshRunDir(parent, name string, log io.Writer) (string, error) {
	if _, err := ShaleServerBinary(log); err != nil {
		return "", err
	}
	dir, err := filepath.Abs(filepath.Join(parent, name))
	if err == nil {
		err = os.RemoveAll(dir)
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	return dir, err
}

// diskTest measures the disk's sequential write speed in dir
// (DiskWriteSpeed of size bytes), logging under prefix, and returns it in
// MB/s rounded to 0.1.
func diskTest(dir string, size int64, seed uint64, prefix string, log io.Writer) (float64, error) {
	logLine(log, "%s: disk: writing %d MiB sequentially in %s (1 MiB writes, then fsync)", prefix, size>>20, dir)
	mbps, err := DiskWriteSpeed(filepath.Join(dir, "disk-test"), size, seed)
	if err != nil {
		return 0, fmt.Errorf("disk write test: %w", err)
	}
	logLine(log, "%s: disk: %.1f MB/s", prefix, mbps)
	return round(mbps, 1), nil
}
