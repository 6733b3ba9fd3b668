package storagebench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"
)

// Config is one benchmark run.
type Config struct {
	// Engines and Workloads to run; every workload runs against every
	// engine, engines interleaved per workload.
	Engines   []string
	Workloads []string
	// Dir is the parent of the per-(workload, engine) data directories.
	Dir string
	// Keep leaves the data directories in place after each run.
	Keep bool
	// Num is the number of keys.
	Num int
	// Reads is the number of lookups or seeks of the read workloads
	// (0: Num).
	Reads int
	// KeySize and ValueSize are in bytes.
	KeySize, ValueSize int
	// Seed makes key orders and values reproducible.
	Seed uint64
	// Settings are the engine settings (DefaultSettings when zero).
	Settings Settings
	// SettleTimeout bounds the waits for compactions to settle.
	SettleTimeout time.Duration
	// HangTimeout, when > 0, makes a watchdog report a run with no
	// progress for that long: it writes every goroutine's stack to Log and
	// calls OnHang (default: exit with status 3).
	HangTimeout time.Duration
	OnHang      func()
	// CPUProfile, when set, is the prefix of one CPU profile per (engine,
	// workload) covering the timed phase: PREFIX.<engine>.<workload>.pprof.
	CPUProfile string
	// Log receives progress messages (nil: none).
	Log io.Writer
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

// Result is the outcome of one (engine, workload) run.
type Result struct {
	Engine   string
	Workload string
	// Ops and Bytes are the operations completed and key+value bytes
	// processed in the timed phase, which lasted Elapsed.
	Ops     int64
	Bytes   int64
	Elapsed time.Duration
	// Latency is per timed operation (per batch for fillbatch-sync).
	Latency *Histogram
	// MinOpsIn1s is the fewest operations completed in a whole second;
	// ZeroSeconds counts whole seconds with none.
	MinOpsIn1s  int64
	ZeroSeconds int
	// PerSecond is the operations completed in each whole second of the
	// timed phase, in order (the partial last second left out).
	PerSecond []int64
	// SpaceAmp and DiskOverLogical are measured after overwrite (0
	// elsewhere), from SSTBytesBefore/After and DirBytes.
	SpaceAmp        float64
	DiskOverLogical float64
	SSTBytesBefore  int64
	SSTBytesAfter   int64
	DirBytes        int64
	// SSTWriteAmp is the SST bytes flushes and compactions wrote from the
	// start of the timed phase until, after it, the memtable was flushed
	// and compactions settled, over the key+value bytes the timed phase
	// wrote (Bytes): write amplification in one unit for every engine.
	// Measured for the fill workloads and overwrite (0 elsewhere, and for
	// an engine that does not count its SST writes).
	SSTWriteAmp float64
	// Summary is the engine's metrics summary after a fill workload.
	Summary string
	// Notes are remarks (compactions that did not settle, ...).
	Notes []string
	// Err is the run's failure, if any.
	Err error
}

// OpsPerSec is the timed phase's throughput.
func (r *Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// MBPerSec is the key+value bytes per second, in MB (10^6 bytes).
func (r *Result) MBPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds()
}

// Run runs every workload against every engine and calls emit after each
// run. It returns every result; failed runs carry Err and do not stop the
// others.
func Run(cfg Config, emit func(Result)) []Result {
	if cfg.Settings == (Settings{}) {
		cfg.Settings = DefaultSettings()
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = time.Minute
	}
	var results []Result
	for _, w := range cfg.Workloads {
		for _, e := range cfg.Engines {
			res := runOne(&cfg, e, w)
			results = append(results, res)
			if emit != nil {
				emit(res)
			}
		}
	}
	return results
}

func runOne(cfg *Config, engine, wname string) (res Result) {
	res = Result{Engine: engine, Workload: wname, Latency: &Histogram{}}
	w, ok := workloads[wname]
	if !ok {
		res.Err = fmt.Errorf("unknown workload %q", wname)
		return res
	}
	dir := filepath.Join(cfg.Dir, wname+"-"+engine)
	if err := os.RemoveAll(dir); err != nil {
		res.Err = err
		return res
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		res.Err = err
		return res
	}
	// Start every run from a clean heap: the previous engine's garbage is
	// not this one's to collect.
	runtime.GC()
	debug.FreeOSMemory()

	var progress atomic.Int64
	var phaseMu sync.Mutex
	phase := "open"
	c := &runCtx{
		cfg:  cfg,
		dir:  dir,
		keys: NewKeyGen(cfg.KeySize),
		vals: NewValueGen(cfg.ValueSize, newRand(cfg.Seed, 0)),
		setPhase: func(p string) {
			phaseMu.Lock()
			phase = p
			phaseMu.Unlock()
			progress.Add(1)
		},
		tick: func() { progress.Add(1) },
	}
	stop := startWatchdog(cfg, engine, wname, &progress, func() string {
		phaseMu.Lock()
		defer phaseMu.Unlock()
		return phase
	})
	defer stop()

	cfg.logf("%s/%s: open %s", wname, engine, dir)
	e, err := OpenEngine(engine, dir, cfg.Settings)
	if err != nil {
		res.Err = fmt.Errorf("open: %w", err)
		return res
	}
	c.e = e
	defer func() {
		c.setPhase("close")
		if err := e.Close(); err != nil && res.Err == nil {
			res.Err = fmt.Errorf("close: %w", err)
		}
		if !cfg.Keep {
			if err := os.RemoveAll(dir); err != nil && res.Err == nil {
				res.Err = err
			}
		}
		res.Notes = c.notes
	}()

	if w.setup != nil {
		t := time.Now()
		if err := w.setup(c); err != nil {
			res.Err = fmt.Errorf("setup: %w", err)
			return res
		}
		cfg.logf("%s/%s: setup took %s; %s", wname, engine, time.Since(t).Round(time.Millisecond), e.Summary())
	}

	sstWritten0, err := e.SSTBytesWritten()
	if err != nil {
		res.Err = fmt.Errorf("SST bytes written: %w", err)
		return res
	}
	c.setPhase("timed run")
	rec := newRecorder(&progress)
	stopProfile, err := startProfile(cfg, engine, wname)
	if err != nil {
		res.Err = err
		return res
	}
	runErr := w.run(c, rec)
	rec.finish()
	if err := stopProfile(); err != nil {
		runErr = errors.Join(runErr, err)
	}
	res.Ops, res.Bytes, res.Elapsed = rec.ops, rec.bytes, rec.elapsed()
	res.Latency = &rec.hist
	res.MinOpsIn1s, res.ZeroSeconds = rec.minOpsIn1s()
	res.PerSecond = rec.wholeSeconds()
	if runErr != nil {
		res.Err = runErr
		return res
	}
	cfg.logf("%s/%s: %d ops in %s (%.0f ops/s); ops per whole second: %v", wname, engine, res.Ops, res.Elapsed.Round(time.Millisecond), res.OpsPerSec(), res.PerSecond)
	if res.ZeroSeconds > 0 {
		c.note(fmt.Sprintf("%d whole second(s) with no operation completed", res.ZeroSeconds))
	}
	if IsFill(wname) || wname == Overwrite {
		if err := c.flushAndSettle(); err != nil {
			res.Err = err
			return res
		}
		sstWritten, err := e.SSTBytesWritten()
		if err != nil {
			res.Err = fmt.Errorf("SST bytes written: %w", err)
			return res
		}
		if res.Bytes > 0 && sstWritten >= 0 && sstWritten0 >= 0 {
			res.SSTWriteAmp = float64(sstWritten-sstWritten0) / float64(res.Bytes)
		}
	}
	if IsFill(wname) {
		res.Summary = e.Summary()
	}
	if w.after != nil {
		t := time.Now()
		if err := w.after(c, &res); err != nil {
			res.Err = fmt.Errorf("after: %w", err)
			return res
		}
		cfg.logf("%s/%s: post-run measurements took %s", wname, engine, time.Since(t).Round(time.Millisecond))
	}
	return res
}

func startProfile(cfg *Config, engine, wname string) (stop func() error, err error) {
	if cfg.CPUProfile == "" {
		return func() error { return nil }, nil
	}
	name := fmt.Sprintf("%s.%s.%s.pprof", cfg.CPUProfile, engine, wname)
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// startWatchdog reports a run whose progress counter has not moved for
// cfg.HangTimeout.
func startWatchdog(cfg *Config, engine, wname string, progress *atomic.Int64, phase func() string) (stop func()) {
	if cfg.HangTimeout <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		last := progress.Load()
		lastChange := time.Now()
		tick := time.NewTicker(min(cfg.HangTimeout/4, time.Second))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if p := progress.Load(); p != last {
				last, lastChange = p, time.Now()
				continue
			}
			if time.Since(lastChange) < cfg.HangTimeout {
				continue
			}
			w := cfg.Log
			if w == nil {
				w = os.Stderr
			}
			fmt.Fprintf(w, "HANG: %s/%s made no progress for %s in phase %q; goroutines:\n",
				wname, engine, cfg.HangTimeout, phase())
			_ = pprof.Lookup("goroutine").WriteTo(w, 2)
			if cfg.OnHang != nil {
				cfg.OnHang()
			} else {
				os.Exit(3)
			}
			return
		}
	}()
	return func() { close(done) }
}
