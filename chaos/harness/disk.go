package harness

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	mobyclient "github.com/moby/moby/client"
)

// dataDir is where the image keeps a node's data (its volume's mount).
const dataDir = "/var/lib/shale"

// clockOffsetFile is the file each node reads its clock offset from
// (shale-server --testing-clock-offset-file); SetClockOffset writes it.
const clockOffsetFile = "/clock-offset"

// diskLatencyFile is the file each node reads its disk latency from
// (--testing-disk-latency-file, SetDiskLatency).
const diskLatencyFile = "/disk-latency"

// createDisk makes node n's data volume a tmpfs of size bytes (a small
// disk that can be filled) and starts a holder container that mounts it
// and stays paused: Docker unmounts a tmpfs volume, losing its contents,
// when no running container uses it, and the holder keeps the node's data
// across restarts of its container, as a disk would.
func (c *Cluster) createDisk(ctx context.Context, n *Node, size int64) error {
	if _, err := c.docker.VolumeCreate(ctx, mobyclient.VolumeCreateOptions{
		Name:   n.volume,
		Driver: "local",
		DriverOpts: map[string]string{
			"type":   "tmpfs",
			"device": "tmpfs",
			"o":      fmt.Sprintf("size=%d,uid=65532,gid=65532,mode=0700", size),
		},
		Labels: map[string]string{"shale-chaos": c.opts.Name},
	}); err != nil {
		return fmt.Errorf("harness: create the %d-byte disk of node %s: %w", size, n.Host, err)
	}
	res, err := c.docker.ContainerCreate(ctx, mobyclient.ContainerCreateOptions{
		Name: n.Name + "-disk",
		Config: &container.Config{
			Image: c.opts.Image,
			// Any long-running program of the image will do; it is paused
			// as soon as it runs, and has no network.
			Cmd:    []string{"shale-server", "--data-dir=" + dataDir + "/holder", "--node-id=1", "--initial-cluster=1=127.0.0.1:7001", "--log-level=error"},
			Labels: map[string]string{"shale-chaos": c.opts.Name},
		},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: n.volume, Target: "/disk"}},
		},
	})
	if err != nil {
		return fmt.Errorf("harness: create the disk holder of node %s: %w", n.Host, err)
	}
	n.holder = res.ID
	if _, err := c.docker.ContainerStart(ctx, n.holder, mobyclient.ContainerStartOptions{}); err != nil {
		return fmt.Errorf("harness: start the disk holder of node %s: %w", n.Host, err)
	}
	if err := c.pauseContainer(ctx, n.holder); err != nil {
		return fmt.Errorf("harness: pause the disk holder of node %s: %w", n.Host, err)
	}
	return nil
}

// removeHolder deletes node n's disk holder (before its volume).
func (c *Cluster) removeHolder(ctx context.Context, n *Node) error {
	if n.holder == "" {
		return nil
	}
	_, _ = c.docker.ContainerUnpause(ctx, n.holder, mobyclient.ContainerUnpauseOptions{})
	if _, err := c.docker.ContainerRemove(ctx, n.holder, mobyclient.ContainerRemoveOptions{Force: true}); err != nil {
		return fmt.Errorf("harness: remove the disk holder of node %s: %w", n.Host, err)
	}
	n.holder = ""
	return nil
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// copyFiles writes files of zeros (name → size) into dir of node n's
// container; copyFile writes one file with the given content.
func (c *Cluster) copyFiles(ctx context.Context, n *Node, dir string, files map[string]int64) error {
	return c.copyTar(ctx, n, dir, func(tw *tar.Writer) error {
		for name, size := range files {
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: time.Now()}); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, zeros{}, size); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Cluster) copyFile(ctx context.Context, n *Node, dir, name, content string) error {
	return c.copyTar(ctx, n, dir, func(tw *tar.Writer) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), ModTime: time.Now()}); err != nil {
			return err
		}
		_, err := io.WriteString(tw, content)
		return err
	})
}

// copyTar streams the tar archive write produces into dir of node n's
// container, as root, through the Docker API (the image has no shell).
func (c *Cluster) copyTar(ctx context.Context, n *Node, dir string, write func(*tar.Writer) error) error {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := write(tw)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := c.docker.CopyToContainer(ctx, n.container.GetContainerID(), mobyclient.CopyToContainerOptions{DestinationPath: dir, Content: pr})
	_ = pr.CloseWithError(errors.New("copy ended"))
	return err
}

// FillDisk fills node id's disk (Options.DiskBytes) with ballast files
// until not even a 4 KiB file fits (a copy that runs out of space leaves
// what it wrote). The node's writes fail with ENOSPC until FreeDisk.
func (c *Cluster) FillDisk(ctx context.Context, id uint64) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("harness: no node %d", id)
	}
	if n.holder == "" {
		return fmt.Errorf("harness: node %d has no small disk (Options.DiskBytes)", id)
	}
	for chunk := c.opts.DiskBytes; chunk >= 4<<10; {
		name := fmt.Sprintf("ballast-%04d", n.ballast)
		err := c.copyFiles(ctx, n, dataDir, map[string]int64{name: chunk})
		n.ballast++
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !strings.Contains(strings.ToLower(err.Error()), "no space") {
			return fmt.Errorf("harness: fill the disk of node %d: %w", id, err)
		}
		chunk /= 4
	}
	return nil
}

// FreeDisk empties the ballast files FillDisk wrote on node id's disk.
func (c *Cluster) FreeDisk(ctx context.Context, id uint64) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("harness: no node %d", id)
	}
	files := map[string]int64{}
	for i := 0; i < n.ballast; i++ {
		files[fmt.Sprintf("ballast-%04d", i)] = 0
	}
	if len(files) == 0 {
		return nil
	}
	// Overwriting a file with an empty one frees its space (the image has
	// no rm to delete it with).
	if err := c.copyFiles(ctx, n, dataDir, files); err != nil {
		return fmt.Errorf("harness: free the disk of node %d: %w", id, err)
	}
	return nil
}

// SetClockOffset shifts node id's wall clock by d (its shale-server reads
// the offset file every 250 ms); 0 sets it right again.
func (c *Cluster) SetClockOffset(ctx context.Context, id uint64, d time.Duration) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("harness: no node %d", id)
	}
	if err := c.copyFile(ctx, n, "/", strings.TrimPrefix(clockOffsetFile, "/"), d.String()); err != nil {
		return fmt.Errorf("harness: set the clock offset of node %d: %w", id, err)
	}
	return nil
}

// SetDiskLatency makes every write and sync of node id's files take a
// random time between lo and hi (its shale-server reads the latency file
// every 250 ms): a slow disk. 0, 0 makes the disk fast again.
func (c *Cluster) SetDiskLatency(ctx context.Context, id uint64, lo, hi time.Duration) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("harness: no node %d", id)
	}
	content := "0"
	if hi > 0 {
		content = fmt.Sprintf("%v-%v", lo, hi)
	}
	if err := c.copyFile(ctx, n, "/", strings.TrimPrefix(diskLatencyFile, "/"), content); err != nil {
		return fmt.Errorf("harness: set the disk latency of node %d: %w", id, err)
	}
	return nil
}
