package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shale-db/shale/bench/storagebench"
)

// Default sizes of a run: the full run and --quick.
const (
	DefaultKeys      = 100_000
	QuickKeys        = 10_000
	DefaultDuration  = 10 * time.Second
	QuickDuration    = 2 * time.Second
	preloadClients   = 64
	preloadConns     = 8
	startTimeout     = 2 * time.Minute
	defaultHangGrace = time.Minute
)

// DefaultClients are the concurrency levels of a run.
var DefaultClients = []int{1, 16, 256}

// Config is one benchmark run.
type Config struct {
	// Engines and Workloads to run. Workloads run in order; within a
	// workload the engines run back to back, each on a fresh cluster,
	// which runs every concurrency level in Clients in order.
	Engines   []string
	Workloads []string
	// Clients are the concurrency levels: the number of closed-loop
	// clients of each cell.
	Clients []int
	// Conns caps the client connections of a cell: min(clients, Conns)
	// connections shared round robin by the clients; 0 means one
	// connection per client.
	Conns int
	// Duration is the timed length of every cell.
	Duration time.Duration
	// Keys is the size of the keyspace: the records preloaded before the
	// read workloads and the keys the put workload draws from.
	Keys int
	// ValueSize is the size of every value in bytes.
	ValueSize int
	// Members is the cluster size (3).
	Members int
	// Dir is the parent of the per-(workload, engine) cluster directories.
	Dir string
	// Keep leaves each cluster's directory (data and logs) in place; it is
	// always kept when a run fails.
	Keep bool
	// Seed makes key choices and values reproducible.
	Seed uint64
	// HangTimeout is how long past Duration a cell may run (waiting for
	// operations in flight) before it is cancelled and fails.
	HangTimeout time.Duration
	// SlowOps, when positive, logs every cell's operations that took at
	// least this long (the 20 slowest, with their wall-clock start, to
	// match against the servers' logs) and how many there were.
	SlowOps time.Duration
	// Rounds repeats every (workload, engine) this many times (default 1),
	// each time on a fresh cluster, alternating the engines' order from
	// round to round (A B, B A, A B, ...), and reports for each cell the
	// round with the median ops/s. On a shared machine whose speed drifts
	// over minutes this keeps the drift from favouring whichever engine
	// runs first.
	Rounds int
	// ProfileDir, when set, receives CPU profiles of every cell's timed
	// phase: <workload>.<engine>.<clients>.client.pprof for this process
	// (the cell's clients), and .node<i>.pprof for each member of a
	// cluster that serves /debug/pprof (Shale), covering the phase's
	// first Duration less one second.
	ProfileDir string
	// Log receives progress messages (nil: none).
	Log io.Writer
}

func (c *Config) logf(format string, args ...any) { logLine(c.Log, format, args...) }

// Result is the outcome of one cell: one (workload, engine, clients).
type Result struct {
	// Engine and Workload name the cell with Clients.
	Engine   string
	Workload string
	// Clients is the number of concurrent clients; Conns the number of
	// client connections they shared.
	Clients int
	Conns   int
	// Ops and Bytes are the operations completed and key+value bytes
	// moved in the timed phase, which lasted Elapsed (until the last
	// operation in flight at the end of Duration completed).
	Ops     int64
	Bytes   int64
	Elapsed time.Duration
	// Latency has every operation's latency, merged over the clients.
	Latency *storagebench.Histogram
	// MinOpsIn1s is the fewest operations completed in a whole second of
	// the timed phase; ZeroSeconds counts whole seconds with none.
	MinOpsIn1s  int64
	ZeroSeconds int
	// ServerCPU is the CPU time (user + system) the cluster's server
	// processes used during the timed phase, 0 when the cluster does not
	// list its processes or /proc cannot be read (see CPUPerOp).
	ServerCPU time.Duration
	// ClientCPU is the CPU time (user + system) this process (every client
	// of the cell, and nothing else of weight) used during the timed
	// phase, 0 when /proc cannot be read.
	ClientCPU time.Duration
	// WALBytes is the bytes the cluster's members wrote to their
	// write-ahead logs during the timed phase, all members together (0:
	// not measured; see walMeter).
	WALBytes float64
	// Replicas is how many members store each write (the cluster's
	// size), for WALBytesPerOp.
	Replicas int
	// Notes are remarks (preload time, kept directories, ...).
	Notes []string
	// Err is the cell's failure, if any.
	Err error
}

// OpsPerSec is the timed phase's throughput.
func (r *Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// WALBytesPerOp is the bytes written to write-ahead logs per operation of
// the timed phase and per replica (what one member writes for one
// operation), 0 when not measured.
func (r *Result) WALBytesPerOp() float64 {
	if r.Ops <= 0 || r.WALBytes <= 0 || r.Replicas <= 0 {
		return 0
	}
	return r.WALBytes / float64(r.Ops) / float64(r.Replicas)
}

// CPUPerOp is the servers' CPU time per operation of the timed phase, 0
// when not measured.
func (r *Result) CPUPerOp() time.Duration {
	if r.Ops <= 0 || r.ServerCPU <= 0 {
		return 0
	}
	return r.ServerCPU / time.Duration(r.Ops)
}

// ClientCPUPerOp is the clients' CPU time per operation of the timed
// phase, 0 when not measured.
func (r *Result) ClientCPUPerOp() time.Duration {
	if r.Ops <= 0 || r.ClientCPU <= 0 {
		return 0
	}
	return r.ClientCPU / time.Duration(r.Ops)
}

// MBPerSec is the key+value bytes per second, in MB (10^6 bytes).
func (r *Result) MBPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds()
}

// Run runs every workload against every engine at every concurrency level
// and calls emit after each cell. It returns every result; failed cells
// carry Err and do not stop the others. When ctx is cancelled Run stops
// its clusters and returns what it has.
func Run(ctx context.Context, cfg Config, emit func(Result)) []Result {
	if cfg.Duration <= 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Keys <= 0 {
		cfg.Keys = DefaultKeys
	}
	if cfg.ValueSize <= 0 {
		cfg.ValueSize = DefaultValueSize
	}
	if len(cfg.Clients) == 0 {
		cfg.Clients = DefaultClients
	}
	if cfg.Members <= 0 {
		cfg.Members = 3
	}
	if cfg.HangTimeout <= 0 {
		cfg.HangTimeout = defaultHangGrace
	}
	if emit == nil {
		emit = func(Result) {}
	}
	created := missingDirs(cfg.Dir)
	zipf := NewZipfian(uint64(cfg.Keys), ZipfianTheta)
	vals := newValues(cfg.ValueSize, cfg.Seed)
	if cfg.Rounds <= 0 {
		cfg.Rounds = 1
	}
	var results []Result
run:
	for _, wname := range cfg.Workloads {
		w, ok := findWorkload(wname)
		if !ok {
			for _, engine := range cfg.Engines {
				rs := failAll(&cfg, engine, wname, fmt.Errorf("unknown workload %q", wname))
				for _, r := range rs {
					emit(r)
				}
				results = append(results, rs...)
			}
			continue
		}
		if cfg.Rounds == 1 {
			for _, engine := range cfg.Engines {
				if ctx.Err() != nil {
					break run
				}
				sh := &shared{keys: uint64(cfg.Keys), zipf: zipf, vals: vals}
				results = append(results, runEngine(ctx, &cfg, engine, w, sh, emit)...)
			}
			continue
		}
		// Several rounds: collect every round's cells, then report the
		// median round of each.
		rounds := make(map[string][][]Result) // engine → round → cells
		for round := 0; round < cfg.Rounds; round++ {
			order := slices.Clone(cfg.Engines)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, engine := range order {
				if ctx.Err() != nil {
					break run
				}
				cfg.logf("%s/%s: round %d of %d", w.name, engine, round+1, cfg.Rounds)
				sh := &shared{keys: uint64(cfg.Keys), zipf: zipf, vals: vals}
				rounds[engine] = append(rounds[engine], runEngine(ctx, &cfg, engine, w, sh, nil))
			}
		}
		for _, engine := range cfg.Engines {
			for _, r := range medianRounds(rounds[engine]) {
				emit(r)
				results = append(results, r)
			}
		}
	}
	if !cfg.Keep {
		// Remove the directories this run created, if they are empty.
		for _, d := range created {
			if os.Remove(d) != nil {
				break
			}
		}
	}
	return results
}

// medianRounds picks, for every concurrency level, the round whose ops/s
// is the median of the rounds (the lower middle one for an even count), and
// notes every round's ops/s on it. A level that failed in any round reports
// that failure.
func medianRounds(rounds [][]Result) []Result {
	byClients := make(map[int][]Result)
	var levels []int
	for _, rs := range rounds {
		for _, r := range rs {
			if _, ok := byClients[r.Clients]; !ok {
				levels = append(levels, r.Clients)
			}
			byClients[r.Clients] = append(byClients[r.Clients], r)
		}
	}
	var out []Result
	for _, c := range levels {
		rs := byClients[c]
		var failed *Result
		rates := make([]string, len(rs))
		for i := range rs {
			rates[i] = fmt.Sprintf("%.0f", rs[i].OpsPerSec())
			if rs[i].Err != nil && failed == nil {
				failed = &rs[i]
			}
		}
		if failed != nil {
			out = append(out, *failed)
			continue
		}
		sorted := slices.Clone(rs)
		slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.OpsPerSec(), b.OpsPerSec()) })
		m := sorted[(len(sorted)-1)/2]
		m.Notes = append(slices.Clone(m.Notes), fmt.Sprintf("median of %d rounds; ops/s by round: %s", len(rs), strings.Join(rates, ", ")))
		out = append(out, m)
	}
	return out
}

// missingDirs lists dir and those of its parents that do not exist yet,
// deepest first.
func missingDirs(dir string) []string {
	p, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	var out []string
	for {
		if _, err := os.Stat(p); err == nil {
			return out
		}
		out = append(out, p)
		parent := filepath.Dir(p)
		if parent == p {
			return out
		}
		p = parent
	}
}

func failAll(cfg *Config, engine, wname string, err error) []Result {
	var rs []Result
	for _, c := range cfg.Clients {
		rs = append(rs, Result{Engine: engine, Workload: wname, Clients: c, Latency: &storagebench.Histogram{}, Err: err})
	}
	return rs
}

// runEngine runs one workload at every concurrency level on a fresh
// cluster of one engine.
func runEngine(ctx context.Context, cfg *Config, engine string, w *workload, sh *shared, emit func(Result)) []Result {
	if emit == nil {
		emit = func(Result) {}
	}
	dir, err := filepath.Abs(filepath.Join(cfg.Dir, w.name+"-"+engine))
	if err == nil {
		err = os.RemoveAll(dir)
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		rs := failAll(cfg, engine, w.name, err)
		for _, r := range rs {
			emit(r)
		}
		return rs
	}
	runtime.GC()
	t := time.Now()
	cfg.logf("%s/%s: starting a %d-member cluster in %s", w.name, engine, cfg.Members, dir)
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	cl, err := Start(startCtx, engine, ClusterConfig{Dir: dir, Members: cfg.Members, Log: cfg.Log})
	cancel()
	if err != nil && ctx.Err() != nil {
		_ = os.RemoveAll(dir) // interrupted
		return nil
	}
	if err != nil {
		rs := failAll(cfg, engine, w.name, fmt.Errorf("start: %w (data and logs kept in %s)", err, dir))
		for _, r := range rs {
			emit(r)
		}
		return rs
	}
	cfg.logf("%s/%s: cluster healthy after %s", w.name, engine, time.Since(t).Round(time.Millisecond))

	var notes []string
	failed := false
	stop := func() error {
		t := time.Now()
		err := cl.Stop()
		cfg.logf("%s/%s: cluster stopped in %s", w.name, engine, time.Since(t).Round(time.Millisecond))
		if err == nil && !failed && !cfg.Keep {
			err = os.RemoveAll(dir)
		}
		return err
	}

	if w.preload {
		t := time.Now()
		if err := preload(ctx, cl, sh); err != nil {
			if ctx.Err() != nil { // interrupted
				_ = stop()
				return nil
			}
			failed = true
			stopErr := stop()
			rs := failAll(cfg, engine, w.name, errors.Join(fmt.Errorf("preload: %w (data and logs kept in %s)", err, dir), stopErr))
			for _, r := range rs {
				emit(r)
			}
			return rs
		}
		d := time.Since(t)
		cfg.logf("%s/%s: preloaded %d records in %s (%.0f puts/s)", w.name, engine, sh.keys, d.Round(time.Millisecond), float64(sh.keys)/d.Seconds())
		notes = append(notes, fmt.Sprintf("preload: %d records in %s", sh.keys, d.Round(time.Millisecond)))
	}

	var rs []Result
	for _, clients := range cfg.Clients {
		if ctx.Err() != nil {
			break
		}
		r := runCell(ctx, cfg, cl, engine, w, sh, clients)
		if ctx.Err() != nil {
			break // interrupted: the cell is incomplete, report nothing
		}
		if r.Err != nil {
			failed = true
			r.Notes = append(r.Notes, "cluster data and logs kept in "+dir)
		}
		if len(rs) == 0 {
			r.Notes = append(notes, r.Notes...)
		}
		if r.Err == nil {
			cfg.logf("%s/%s/%d clients: %d ops in %s (%.0f ops/s, p50 %s, p99 %s)", w.name, engine, clients, r.Ops,
				r.Elapsed.Round(time.Millisecond), r.OpsPerSec(), r.Latency.Quantile(0.5), r.Latency.Quantile(0.99))
		}
		rs = append(rs, r)
		emit(r)
	}
	if err := stop(); err != nil && len(rs) > 0 {
		last := &rs[len(rs)-1]
		last.Notes = append(last.Notes, fmt.Sprintf("stopping the cluster: %v", err))
	}
	return rs
}

// preload writes every record of the keyspace (untimed), with
// preloadClients clients over preloadConns connections.
func preload(ctx context.Context, cl Cluster, sh *shared) error {
	conns, err := openConns(ctx, cl, preloadConns)
	if err != nil {
		return err
	}
	defer closeConns(conns)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Uint64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	for i := range preloadClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &client{kv: conns[i%len(conns)], r: newRand(0, uint64(i)+1<<32), sh: sh}
			for {
				k := next.Add(1) - 1
				if k >= sh.keys || ctx.Err() != nil {
					return
				}
				if _, err := c.put(ctx, k); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("put record %d: %w", k, err); cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func openConns(ctx context.Context, cl Cluster, n int) ([]KV, error) {
	conns := make([]KV, 0, n)
	for range n {
		kv, err := cl.Client(ctx)
		if err != nil {
			closeConns(conns)
			return nil, fmt.Errorf("open client connection: %w", err)
		}
		conns = append(conns, kv)
	}
	return conns, nil
}

func closeConns(conns []KV) {
	for _, kv := range conns {
		_ = kv.Close()
	}
}

// warmUpProbes are the keys every connection reads before a cell: one in
// each sixteenth of the hex key space, so that a client that routes by
// shard has found every shard and dialed (and, when secured, completed
// the TLS handshake and had its token verified by) every member the
// workload reaches, not only the member of the first key it reads.
var warmUpProbes = func() [][]byte {
	var probes [][]byte
	for d := range 16 {
		probes = append(probes, []byte(fmt.Sprintf("%c%015x", hexDigits[d], 1)))
	}
	return probes
}()

// warmUp reads warmUpProbes (untimed) through every connection, up to 32
// connections at a time: the first requests pay for dialing, routing and
// handshakes, which a cell's timed phase must not measure.
func warmUp(ctx context.Context, conns []KV) error {
	sem := make(chan struct{}, 32)
	errs := make(chan error, len(conns))
	for _, kv := range conns {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			for _, k := range warmUpProbes {
				if _, _, err := kv.Get(wctx, k); err != nil {
					errs <- fmt.Errorf("warm-up get %s: %w", k, err)
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range conns {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// worker is the measured state of one client in a cell.
type worker struct {
	hist   storagebench.Histogram
	perSec []int64
	ops    int64
	bytes  int64
	end    time.Time
	slow   []slowOp
}

// slowOp is one operation that took at least Config.SlowOps.
type slowOp struct {
	start time.Time
	took  time.Duration
}

// runCell runs one workload with clients concurrent clients for
// cfg.Duration.
func runCell(ctx context.Context, cfg *Config, cl Cluster, engine string, w *workload, sh *shared, clients int) Result {
	res := Result{Engine: engine, Workload: w.name, Clients: clients, Latency: &storagebench.Histogram{}}
	nconns := clients
	if cfg.Conns > 0 {
		nconns = min(clients, cfg.Conns)
	}
	res.Conns = nconns
	conns, err := openConns(ctx, cl, nconns)
	if err != nil {
		res.Err = err
		return res
	}
	defer closeConns(conns)
	if err := warmUp(ctx, conns); err != nil {
		res.Err = err
		return res
	}
	runtime.GC()
	wal := startWAL(ctx, cl)
	cpu, self := startCPU(cl), selfCPU()
	prof, err := startCellProfile(ctx, cfg, cl, engine, w.name, clients)
	if err != nil {
		res.Err = err
		return res
	}

	cellCtx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.HangTimeout)
	defer cancel()
	workers := make([]worker, clients)
	var errOnce sync.Once
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wk := &workers[i]
			wk.perSec = make([]int64, 0, int(cfg.Duration/time.Second)+2)
			c := &client{
				kv: conns[i%len(conns)],
				r:  newRand(cfg.Seed, uint64(clients)<<32|uint64(i)),
				sh: sh,
			}
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				n, err := w.op(cellCtx, c)
				t1 := time.Now()
				wk.end = t1
				if err != nil {
					errOnce.Do(func() {
						if errors.Is(cellCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
							err = fmt.Errorf("%w (cell still running %s after its %s)", err, cfg.HangTimeout, cfg.Duration)
						}
						firstErr = err
						cancel()
					})
					return
				}
				wk.hist.Record(t1.Sub(t0))
				if cfg.SlowOps > 0 && t1.Sub(t0) >= cfg.SlowOps {
					wk.slow = append(wk.slow, slowOp{start: t0, took: t1.Sub(t0)})
				}
				sec := int(t1.Sub(start) / time.Second)
				for len(wk.perSec) <= sec {
					wk.perSec = append(wk.perSec, 0)
				}
				wk.perSec[sec]++
				wk.ops++
				wk.bytes += n
			}
		}()
	}
	wg.Wait()
	res.ServerCPU = cpu.used()
	res.ClientCPU = self.used()
	if err := prof.stop(); err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("profiles: %v", err))
	}
	var walByKind map[string]float64
	res.WALBytes, walByKind = walUsed(ctx, cl, wal)
	res.Replicas = cfg.Members
	end := start
	var perSec []int64
	var slow []slowOp
	for i := range workers {
		wk := &workers[i]
		slow = append(slow, wk.slow...)
		res.Latency.Merge(&wk.hist)
		res.Ops += wk.ops
		res.Bytes += wk.bytes
		if wk.end.After(end) {
			end = wk.end
		}
		for s, n := range wk.perSec {
			for len(perSec) <= s {
				perSec = append(perSec, 0)
			}
			perSec[s] += n
		}
	}
	res.Elapsed = end.Sub(start)
	if cfg.SlowOps > 0 {
		logSlowOps(cfg, engine, w.name, clients, start, slow, perSec)
	}
	res.MinOpsIn1s, res.ZeroSeconds = minOpsIn1s(perSec, res.Elapsed, res.Ops)
	if len(walByKind) > 1 && res.Ops > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(walByKind)) {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, walByKind[k]/float64(res.Ops)/float64(res.Replicas)))
		}
		res.Notes = append(res.Notes, "WAL bytes per operation and replica, by log: "+strings.Join(parts, ", "))
	}
	if res.ZeroSeconds > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d whole second(s) with no operation completed", res.ZeroSeconds))
	}
	if firstErr != nil {
		res.Err = firstErr
	} else if ctx.Err() != nil {
		res.Err = ctx.Err()
	}
	return res
}

// logSlowOps logs the operations completed in each second of a cell, how
// many took at least cfg.SlowOps and the 20 slowest, by wall-clock start.
func logSlowOps(cfg *Config, engine, workload string, clients int, start time.Time, slow []slowOp, perSec []int64) {
	logLine(cfg.Log, "%s/%s/%d clients: operations completed per second from %s: %v", workload, engine, clients, start.UTC().Format("15:04:05.000"), perSec)
	slices.SortFunc(slow, func(a, b slowOp) int { return cmp.Compare(b.took, a.took) })
	logLine(cfg.Log, "%s/%s/%d clients: %d operations took %s or more; the slowest:", workload, engine, clients, len(slow), cfg.SlowOps)
	for _, op := range slow[:min(len(slow), 20)] {
		logLine(cfg.Log, "  started %s (+%s), took %s", op.start.UTC().Format("15:04:05.000"), op.start.Sub(start).Round(time.Millisecond), op.took.Round(time.Millisecond))
	}
}

// selfCPU starts measuring this process's CPU time (nil when /proc cannot
// be read).
func selfCPU() *cpuMeter {
	pid := os.Getpid()
	t, err := cpuTicks(pid)
	if err != nil {
		return nil
	}
	return &cpuMeter{pids: []int{pid}, before: []uint64{t}}
}

// cpuMeter measures the CPU time of a set of processes.
type cpuMeter struct {
	pids   []int
	before []uint64
}

// startCPU reads the CPU time of cl's processes, if it lists them; a
// process whose time cannot be read turns the measurement off.
func startCPU(cl Cluster) *cpuMeter {
	p, ok := cl.(processes)
	if !ok {
		return nil
	}
	m := &cpuMeter{pids: p.Pids()}
	for _, pid := range m.pids {
		t, err := cpuTicks(pid)
		if err != nil {
			return nil
		}
		m.before = append(m.before, t)
	}
	return m
}

// used is the CPU time the processes used since startCPU, 0 when it
// cannot be measured.
func (m *cpuMeter) used() time.Duration {
	if m == nil || len(m.pids) == 0 {
		return 0
	}
	var ticks uint64
	for i, pid := range m.pids {
		t, err := cpuTicks(pid)
		if err != nil || t < m.before[i] {
			return 0
		}
		ticks += t - m.before[i]
	}
	return time.Duration(float64(ticks) / clockTicksOnce() * float64(time.Second))
}

var clockTicksOnce = sync.OnceValue(clockTicks)

// minOpsIn1s is the fewest operations completed in any whole second of a
// phase that lasted elapsed (seconds counted from its start, the partial
// last second left out), or all ops for a phase shorter than 1s.
// zeroSeconds counts the whole seconds with no operation completed.
func minOpsIn1s(perSec []int64, elapsed time.Duration, ops int64) (minOps int64, zeroSeconds int) {
	full := int(elapsed / time.Second)
	if full == 0 {
		return ops, 0
	}
	minOps = -1
	for s := range full {
		var n int64
		if s < len(perSec) {
			n = perSec[s]
		}
		if n == 0 {
			zeroSeconds++
		}
		if minOps < 0 || n < minOps {
			minOps = n
		}
	}
	return minOps, zeroSeconds
}
