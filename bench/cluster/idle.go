package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	shaleclient "github.com/shale-db/shale/client"
)

// IdleConfig is one run of the idle-cost benchmark: for every entry of
// Shards, a fresh cluster of Members shale-server processes with that many
// user shards, left idle, and the CPU time each process uses over Window.
type IdleConfig struct {
	// Shards are the user-shard counts to measure, in order (e.g. 1000
	// and the 1-shard baseline).
	Shards []int
	// Members is the number of nodes (3).
	Members int
	// Settle is how long the cluster is left alone after every shard has
	// a leader, before the measurement.
	Settle time.Duration
	// Window is the length of the measurement.
	Window time.Duration
	// Dir is the parent of the per-case cluster directories.
	Dir string
	// Keep leaves the cluster directories in place.
	Keep bool
	// Log receives progress messages (nil: none).
	Log io.Writer
}

func (c *IdleConfig) logf(format string, args ...any) { logLine(c.Log, format, args...) }

// IdleResult is the idle cost of one cluster.
type IdleResult struct {
	// Shards is the number of user shards (the system shard comes on top).
	Shards int `json:"shards"`
	// Nodes is the number of shale-server processes.
	Nodes int `json:"nodes"`
	// ServerArgs are the extra shale-server flags (ShaleOptions.ExtraArgs).
	ServerArgs string `json:"server_args"`
	// StartSeconds is the time from starting the processes to every shard
	// having a leader.
	StartSeconds float64 `json:"start_s"`
	// SettleSeconds and WindowSeconds are the settle period and the
	// measured window.
	SettleSeconds float64 `json:"settle_s"`
	WindowSeconds float64 `json:"window_s"`
	// CPUPercent is each node's CPU time (user + system) over the window
	// as a percentage of one core; CPUPercentTotal is their sum.
	CPUPercent      []float64 `json:"cpu_pct"`
	CPUPercentTotal float64   `json:"cpu_pct_total"`
	// RSSMB is each node's resident set at the end of the window, MB.
	RSSMB []float64 `json:"rss_mb"`
	// Quiesced is, per node, how many of its replicas reported themselves
	// quiesced (shale_shard_quiesced) at the end of the window, and
	// Replicas how many replicas it hosts; -1 when /metrics could not be
	// read.
	Quiesced []int `json:"quiesced"`
	Replicas []int `json:"replicas"`
	// Leaders is, per node, how many shards it leads (from ListShards
	// after the window; nil if that failed).
	Leaders []int `json:"leaders"`
	// Err is the failure, if any.
	Err error `json:"-"`
	// Error is Err's message in the JSON form.
	Error string `json:"error,omitempty"`
}

// IdleSplits returns the --initial-splits making n user shards: the n-1
// keys "k1" to "k<n-1>", zero-padded to the width of n-1 ("k001" to "k999"
// for 1,000 shards) so that their byte order is their numeric order.
func IdleSplits(n int) string {
	if n <= 1 {
		return ""
	}
	width := len(strconv.Itoa(n - 1))
	keys := make([]string, 0, n-1)
	for i := 1; i < n; i++ {
		keys = append(keys, fmt.Sprintf("k%0*d", width, i))
	}
	return strings.Join(keys, ",")
}

// RunIdle measures every case of cfg in turn and calls emit after each.
func RunIdle(ctx context.Context, cfg IdleConfig, emit func(IdleResult)) []IdleResult {
	if cfg.Members <= 0 {
		cfg.Members = 3
	}
	if emit == nil {
		emit = func(IdleResult) {}
	}
	var out []IdleResult
	created := missingDirs(cfg.Dir)
	if _, err := ShaleServerBinary(cfg.Log); err != nil {
		for _, n := range cfg.Shards {
			r := IdleResult{Shards: n, Nodes: cfg.Members, Err: err, Error: err.Error()}
			emit(r)
			out = append(out, r)
		}
		return out
	}
	for _, n := range cfg.Shards {
		if ctx.Err() != nil {
			break
		}
		r := runIdleCase(ctx, &cfg, n)
		if r.Err != nil {
			r.Error = r.Err.Error()
		}
		if ctx.Err() != nil {
			break
		}
		out = append(out, r)
		emit(r)
	}
	if !cfg.Keep {
		// Remove the directories this run created, if they are empty.
		for _, d := range created {
			if os.Remove(d) != nil {
				break
			}
		}
	}
	return out
}

func runIdleCase(ctx context.Context, cfg *IdleConfig, shards int) IdleResult {
	r := IdleResult{
		Shards:     shards,
		Nodes:      cfg.Members,
		ServerArgs: strings.Join(currentShaleOptions().ExtraArgs, " "),
	}
	dir, err := freshRunDir(cfg.Dir, fmt.Sprintf("idle-%d", shards), cfg.Log)
	if err != nil {
		r.Err = err
		return r
	}
	cfg.logf("idle/%d shards: starting %d shale-server nodes in %s", shards, cfg.Members, dir)
	t := time.Now()
	rc, err := startRunCluster(ctx, dir, cfg.Members, IdleSplits(shards), cfg.Keep, cfg.Log)
	if err != nil {
		r.Err = err
		return r
	}
	nodes := rc.nodes
	defer func() {
		if err := rc.stop(); err != nil && r.Err == nil {
			r.Err = err
		}
	}()
	fail := func(err error) IdleResult {
		r.Err = rc.fail(err)
		return r
	}
	// Bootstrapping takes about a minute per 2,000 shards here, and
	// electing and balancing the leaders as long again.
	startCtx, cancel := context.WithTimeout(ctx, idleStartTimeout(shards))
	cli, err := rc.connect(startCtx, idleStartTimeout(shards), shards+1, cfg.Log)
	if err != nil {
		cancel()
		r.Err = err
		return r
	}
	// Wait for the placement service to finish balancing leaders, so the
	// window measures idle shards, not leadership transfers.
	err = waitPlacementBalanced(startCtx, cli)
	cancel()
	cli.Close()
	if err != nil {
		return fail(err)
	}
	r.StartSeconds = round(time.Since(t).Seconds(), 2)
	cfg.logf("idle/%d shards: every shard has a leader after %s; settling for %s", shards, time.Since(t).Round(time.Millisecond), cfg.Settle)
	select {
	case <-ctx.Done():
		return r
	case <-time.After(cfg.Settle):
	}
	r.SettleSeconds = cfg.Settle.Seconds()

	pids := nodes.Pids()
	before := make([]uint64, len(pids))
	for i, pid := range pids {
		if before[i], err = cpuTicks(pid); err != nil {
			return fail(err)
		}
	}
	t0 := time.Now()
	cfg.logf("idle/%d shards: measuring CPU for %s", shards, cfg.Window)
	select {
	case <-ctx.Done():
		return r
	case <-time.After(cfg.Window):
	}
	after := make([]uint64, len(pids))
	for i, pid := range pids {
		if after[i], err = cpuTicks(pid); err != nil {
			return fail(err)
		}
	}
	window := time.Since(t0)
	r.WindowSeconds = round(window.Seconds(), 2)
	hz := clockTicks()
	for i, pid := range pids {
		pct := float64(after[i]-before[i]) / hz / window.Seconds() * 100
		r.CPUPercent = append(r.CPUPercent, round(pct, 2))
		r.CPUPercentTotal += pct
		r.RSSMB = append(r.RSSMB, round(float64(rssBytes(pid))/1e6, 1))
		q, n := quiesced(ctx, nodes.HTTP[i])
		r.Quiesced = append(r.Quiesced, q)
		r.Replicas = append(r.Replicas, n)
	}
	r.CPUPercentTotal = round(r.CPUPercentTotal, 2)
	if err := nodes.checkRunning(); err != nil {
		return fail(err)
	}
	// Count the leaders only now: listing the shards makes every node
	// report every replica's status, work that would count in the window.
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if cli, err := nodes.NewClient(lctx, cfg.Log); err == nil {
		if shards, err := cli.ListShards(lctx); err == nil {
			r.Leaders = make([]int, cfg.Members)
			for _, s := range shards {
				if id := s.GetLeaderNodeId(); id >= 1 && int(id) <= cfg.Members {
					r.Leaders[id-1]++
				}
			}
		}
		cli.Close()
	}
	return r
}

// idleStartTimeout is how long a cluster of n idle shards may take to have
// every shard led and the leaders balanced: 10 minutes, and a minute more
// per 1,000 shards (10,000 took 9m40s in one run and over 10 minutes in the
// next).
func idleStartTimeout(n int) time.Duration {
	return 10*time.Minute + time.Duration(n/1000)*time.Minute
}

// cpuTicks is a process's user + system CPU time in clock ticks, from
// /proc/<pid>/stat (fields 14 and 15).
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("CPU time of pid %d: %w (the idle benchmark needs Linux's /proc)", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after it start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: malformed /proc stat %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: short /proc stat %q", pid, s)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("pid %d: /proc stat: %w", pid, err)
	}
	return utime + stime, nil
}

// clockTicks is the kernel's USER_HZ (getconf CLK_TCK), 100 if unknown.
func clockTicks() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}

// rssBytes is a process's resident set (VmRSS), 0 if unknown.
func rssBytes(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fs := strings.Fields(rest)
			if len(fs) >= 1 {
				kb, _ := strconv.ParseInt(fs[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// quiesced counts a node's replicas and those reporting
// shale_shard_quiesced 1 on its /metrics; -1, -1 if it cannot be read.
func quiesced(ctx context.Context, httpAddr string) (quiesced, replicas int) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return -1, -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1, -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "shale_shard_quiesced{") {
			continue
		}
		replicas++
		if strings.HasSuffix(line, " 1") {
			quiesced++
		}
	}
	if sc.Err() != nil {
		return -1, -1
	}
	return quiesced, replicas
}

// WriteIdleJSONLine writes the result as one JSON object and a newline.
func WriteIdleJSONLine(w io.Writer, r IdleResult) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteIdleTable writes one row per case: CPU per node and in total,
// resident memory and quiesced replicas per node.
func WriteIdleTable(w io.Writer, results []IdleResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "shards\tserver args\tnodes\tstart s\twindow s\tCPU %% per node\tCPU %% total\tleaders per node\tRSS MB per node\tquiesced/replicas per node\t\n")
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%d\tERROR\t\t\t\t\t\t\t\n", r.Shards, dash(r.ServerArgs), r.Nodes)
			continue
		}
		var cpu, rss, q []string
		leaders := "?"
		if r.Leaders != nil {
			var l []string
			for _, n := range r.Leaders {
				l = append(l, strconv.Itoa(n))
			}
			leaders = strings.Join(l, " ")
		}
		for i := range r.CPUPercent {
			cpu = append(cpu, fmt.Sprintf("%.2f", r.CPUPercent[i]))
			rss = append(rss, fmt.Sprintf("%.0f", r.RSSMB[i]))
			q = append(q, fmt.Sprintf("%d/%d", r.Quiesced[i], r.Replicas[i]))
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%.1f\t%.1f\t%s\t%.2f\t%s\t%s\t%s\t\n", r.Shards, dash(r.ServerArgs), r.Nodes,
			r.StartSeconds, r.WindowSeconds, strings.Join(cpu, " "), r.CPUPercentTotal, leaders, strings.Join(rss, " "), strings.Join(q, " "))
	}
	tw.Flush()
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(w, "  %d shards: ERROR: %v\n", r.Shards, r.Err)
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// waitPlacementBalanced waits until the placement leader reports nothing
// to do, running or stuck.
func waitPlacementBalanced(ctx context.Context, cli *shaleclient.Client) error {
	var last error
	for {
		st, err := cli.PlacementStatus(ctx)
		if err == nil && st.GetBalanced() {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("placement not balanced: %d running, %d stuck, leader spread %d", len(st.GetRunning()), len(st.GetStuck()), st.GetLeaderSpread())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for placement to settle: %w", last)
		case <-time.After(time.Second):
		}
	}
}
