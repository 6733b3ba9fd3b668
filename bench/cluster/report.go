package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// JSONResult is the machine-readable form of a Result, one object per line.
// It has every field of the storage benchmark's lines
// (storagebench.JSONResult), in the same units, plus clients and, when
// measured, cpu_us_per_op; space_amp and disk_over_logical do not apply to
// clusters and are always 0.
type JSONResult struct {
	Engine           string  `json:"engine"`                         // engine name: shale, etcd
	Workload         string  `json:"workload"`                       // workload name: put, get, ycsb-a, ycsb-b, ycsb-e
	Clients          int     `json:"clients"`                        // concurrent clients
	OpsPerSec        float64 `json:"ops_per_sec"`                    // operations per second of the timed phase
	MBPerSec         float64 `json:"mb_per_sec"`                     // key+value MB (10^6 bytes) moved per second
	P50us            float64 `json:"p50_us"`                         // median latency, µs
	P99us            float64 `json:"p99_us"`                         // 99th percentile latency, µs
	P999us           float64 `json:"p999_us"`                        // 99.9th percentile latency, µs
	MaxUs            float64 `json:"max_us"`                         // largest latency (exact), µs
	MinOpsIn1s       int64   `json:"min_ops_in_1s"`                  // fewest operations completed in a whole second
	SpaceAmp         float64 `json:"space_amp"`                      // always 0 (storage benchmark field)
	DiskOverLogical  float64 `json:"disk_over_logical"`              // always 0 (storage benchmark field)
	CPUusPerOp       float64 `json:"cpu_us_per_op,omitempty"`        // servers' CPU time per operation, µs (absent: not measured)
	ClientCPUusPerOp float64 `json:"client_cpu_us_per_op,omitempty"` // the clients' (the benchmark process's) CPU time per operation, µs
	WALBytesPerOp    float64 `json:"wal_bytes_per_op,omitempty"`     // bytes written to write-ahead logs per operation and replica (absent: not measured)
}

func us(d time.Duration) float64 { return round(float64(d)/1e3, 3) }

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

// JSON returns the result's JSON form.
func (r *Result) JSON() JSONResult {
	return JSONResult{
		Engine:           r.Engine,
		Workload:         r.Workload,
		Clients:          r.Clients,
		OpsPerSec:        round(r.OpsPerSec(), 1),
		MBPerSec:         round(r.MBPerSec(), 3),
		P50us:            us(r.Latency.Quantile(0.50)),
		P99us:            us(r.Latency.Quantile(0.99)),
		P999us:           us(r.Latency.Quantile(0.999)),
		MaxUs:            us(r.Latency.Max()),
		MinOpsIn1s:       r.MinOpsIn1s,
		CPUusPerOp:       us(r.CPUPerOp()),
		ClientCPUusPerOp: us(r.ClientCPUPerOp()),
		WALBytesPerOp:    round(r.WALBytesPerOp(), 1),
	}
}

// WriteJSONLine writes the result as one JSON object and a newline.
func WriteJSONLine(w io.Writer, r Result) error {
	b, err := json.Marshal(r.JSON())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// Ratio is base ops/s over peer ops/s (how many times faster the base
// engine is), 0 when either is missing.
func Ratio(base, peer *Result) float64 {
	if base == nil || peer == nil || base.Err != nil || peer.Err != nil || peer.OpsPerSec() == 0 {
		return 0
	}
	return base.OpsPerSec() / peer.OpsPerSec()
}

// BaseEngine is the engine the ratios are taken against: shale when it
// ran, else the first engine.
func BaseEngine(engines []string) string {
	for _, e := range engines {
		if e == "shale" {
			return e
		}
	}
	if len(engines) == 0 {
		return ""
	}
	return engines[0]
}

type cellKey struct {
	workload, engine string
	clients          int
}

// WriteTable writes the results grouped by workload, one row per
// (clients, engine) with the engines of a concurrency level side by side,
// every engine's ratio against the base engine (base ops/s over engine
// ops/s), and a closing line per engine.
func WriteTable(w io.Writer, results []Result, base string) {
	var order, engines []string
	var levels []int
	seenW, seenE, seenC := map[string]bool{}, map[string]bool{}, map[int]bool{}
	cells := map[cellKey]*Result{}
	for i := range results {
		r := &results[i]
		if !seenW[r.Workload] {
			seenW[r.Workload] = true
			order = append(order, r.Workload)
		}
		if !seenE[r.Engine] {
			seenE[r.Engine] = true
			engines = append(engines, r.Engine)
		}
		if !seenC[r.Clients] {
			seenC[r.Clients] = true
			levels = append(levels, r.Clients)
		}
		cells[cellKey{r.Workload, r.Engine, r.Clients}] = r
	}
	ratioHeader := base + "/engine"
	for _, wl := range order {
		fmt.Fprintf(w, "\n== %s ==\n", wl)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "clients\tengine\tops/s\tMB/s\tp50 µs\tp99 µs\tp99.9 µs\tmax µs\tmin ops/1s\tCPU µs/op\tclient CPU µs/op\tWAL B/op\t%s\t\n", ratioHeader)
		for _, c := range levels {
			b := cells[cellKey{wl, base, c}]
			for _, e := range engines {
				r := cells[cellKey{wl, e, c}]
				if r == nil {
					continue
				}
				if r.Err != nil {
					fmt.Fprintf(tw, "%d\t%s\tERROR\t\t\t\t\t\t\t\t\t\t\t\n", c, e)
					continue
				}
				j := r.JSON()
				ratio := "-"
				if e != base {
					if v := Ratio(b, r); v > 0 {
						ratio = fmt.Sprintf("%.2fx", v)
					}
				}
				cpu, ccpu, wal := "-", "-", "-"
				if j.WALBytesPerOp > 0 {
					wal = fmt.Sprintf("%.0f", j.WALBytesPerOp)
				}
				if j.CPUusPerOp > 0 {
					cpu = fmt.Sprintf("%.1f", j.CPUusPerOp)
				}
				if j.ClientCPUusPerOp > 0 {
					ccpu = fmt.Sprintf("%.1f", j.ClientCPUusPerOp)
				}
				fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.2f\t%.1f\t%.1f\t%.1f\t%.0f\t%d\t%s\t%s\t%s\t%s\t\n",
					c, e, j.OpsPerSec, j.MBPerSec, j.P50us, j.P99us, j.P999us, j.MaxUs, j.MinOpsIn1s, cpu, ccpu, wal, ratio)
			}
		}
		tw.Flush()
		for _, c := range levels {
			for _, e := range engines {
				r := cells[cellKey{wl, e, c}]
				if r == nil {
					continue
				}
				if r.Err != nil {
					fmt.Fprintf(w, "  %s/%d clients: ERROR: %v\n", e, c, r.Err)
				}
				for _, n := range r.Notes {
					fmt.Fprintf(w, "  %s/%d clients: note: %s\n", e, c, n)
				}
			}
		}
	}

	for _, e := range engines {
		if e != base && VariantBase(e) == base {
			writeVariantRatios(w, cells, order, levels, base, e)
		}
	}

	fmt.Fprintf(w, "\n== summary ==\n")
	for _, e := range engines {
		var n, failed, k int
		var timed time.Duration
		var logSum float64
		for _, wl := range order {
			for _, c := range levels {
				r := cells[cellKey{wl, e, c}]
				if r == nil {
					continue
				}
				n++
				if r.Err != nil {
					failed++
					continue
				}
				timed += r.Elapsed
				if e != base {
					if v := Ratio(cells[cellKey{wl, base, c}], r); v > 0 {
						logSum += math.Log(v)
						k++
					}
				}
			}
		}
		parts := []string{fmt.Sprintf("%d cells", n)}
		if failed > 0 {
			parts = append(parts, fmt.Sprintf("%d FAILED", failed))
		}
		parts = append(parts, fmt.Sprintf("timed %s", timed.Round(10*time.Millisecond)))
		if e != base && k > 0 {
			parts = append(parts, fmt.Sprintf("geomean %s %.2fx over %d cells", ratioHeader, math.Exp(logSum/float64(k)), k))
		}
		fmt.Fprintf(w, "%-6s %s\n", e, strings.Join(parts, ", "))
	}
}

// writeVariantRatios writes a variant's ratios to its base engine, one row
// per (workload, clients): ops/s, p50, p99, p99.9 and CPU per operation,
// each the variant's value over the base engine's ("0.90x" ops/s: the
// variant does 90% of the base's throughput; "1.05x" p50: its median
// latency is 5% longer).
func writeVariantRatios(w io.Writer, cells map[cellKey]*Result, order []string, levels []int, base, variant string) {
	fmt.Fprintf(w, "\n== %s ÷ %s ==\n", variant, base)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "workload\tclients\tops/s\tp50\tp99\tp99.9\tCPU/op\t\n")
	ratio := func(v, b float64) string {
		if v <= 0 || b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", v/b)
	}
	for _, wl := range order {
		for _, c := range levels {
			b, v := cells[cellKey{wl, base, c}], cells[cellKey{wl, variant, c}]
			if b == nil || v == nil {
				continue
			}
			if b.Err != nil || v.Err != nil {
				fmt.Fprintf(tw, "%s\t%d\tERROR\t\t\t\t\t\n", wl, c)
				continue
			}
			bj, vj := b.JSON(), v.JSON()
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", wl, c,
				ratio(vj.OpsPerSec, bj.OpsPerSec), ratio(vj.P50us, bj.P50us), ratio(vj.P99us, bj.P99us),
				ratio(vj.P999us, bj.P999us), ratio(vj.CPUusPerOp, bj.CPUusPerOp))
		}
	}
	tw.Flush()
}
