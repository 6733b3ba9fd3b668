package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"
)

// profiler is implemented by clusters whose members serve /debug/pprof:
// their addresses, member i+1 at index i.
type profiler interface {
	PprofAddrs() []string
}

// PprofAddrs are the Shale nodes' /debug/pprof addresses.
func (c *shaleCluster) PprofAddrs() []string { return c.nodes.HTTP }

// cellProfile is the CPU profiles of one cell's timed phase (see
// Config.ProfileDir): this process's, and each member's when the cluster
// serves pprof.
type cellProfile struct {
	file    *os.File
	wg      sync.WaitGroup
	cancel  context.CancelFunc
	mu      sync.Mutex
	errs    []error
	skipped bool
}

// startCellProfile starts profiling the timed phase of the cell
// (workload, engine, clients) into cfg.ProfileDir: this process for
// the whole phase, and each member of a cluster that serves pprof for the
// phase's first max(1, duration-1) seconds. It returns nil when no
// profile was asked for.
func startCellProfile(ctx context.Context, cfg *Config, cl Cluster, engine, workload string, clients int) (*cellProfile, error) {
	if cfg.ProfileDir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
		return nil, fmt.Errorf("profile directory: %w", err)
	}
	base := filepath.Join(cfg.ProfileDir, fmt.Sprintf("%s.%s.%d", workload, engine, clients))
	f, err := os.Create(base + ".client.pprof")
	if err != nil {
		return nil, fmt.Errorf("client profile: %w", err)
	}
	p := &cellProfile{file: f}
	if err := pprof.StartCPUProfile(f); err != nil {
		// Another profile (--cpuprofile) is running: only one per process.
		p.skipped = true
		cfg.logf("%s/%s/%d clients: no client profile: %v", workload, engine, clients, err)
	}
	pc, ok := cl.(profiler)
	if !ok {
		return p, nil
	}
	seconds := max(1, int(cfg.Duration/time.Second)-1)
	pctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	for i, addr := range pc.PprofAddrs() {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			path := fmt.Sprintf("%s.node%d.pprof", base, i+1)
			if err := fetchProfile(pctx, addr, "profile", seconds, path); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, err)
				p.mu.Unlock()
			}
		}()
	}
	return p, nil
}

// stop ends the client profile and waits for the members' (which end on
// their own, or when the cell's context ends).
func (p *cellProfile) stop() error {
	if p == nil {
		return nil
	}
	if !p.skipped {
		pprof.StopCPUProfile()
	}
	err := p.file.Close()
	p.wg.Wait()
	if p.cancel != nil {
		p.cancel()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(append(p.errs, err)...)
}
