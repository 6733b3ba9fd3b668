package storagebench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// JSONResult is the machine-readable form of a Result: exactly these fields,
// one object per line. space_amp and disk_over_logical are 0 where they do
// not apply.
type JSONResult struct {
	Engine          string  `json:"engine"`
	Workload        string  `json:"workload"`
	OpsPerSec       float64 `json:"ops_per_sec"`
	MBPerSec        float64 `json:"mb_per_sec"`
	P50us           float64 `json:"p50_us"`
	P99us           float64 `json:"p99_us"`
	P999us          float64 `json:"p999_us"`
	P9999us         float64 `json:"p9999_us"`
	MaxUs           float64 `json:"max_us"`
	MinOpsIn1s      int64   `json:"min_ops_in_1s"`
	OpsPerSecond    []int64 `json:"ops_in_each_1s"`
	SpaceAmp        float64 `json:"space_amp"`
	DiskOverLogical float64 `json:"disk_over_logical"`
	SSTWriteAmp     float64 `json:"sst_write_amp"`
}

func mb(n int64) float64 { return float64(n) / 1e6 }

func us(d time.Duration) float64 { return round(float64(d)/1e3, 3) }

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

// JSON returns the result's JSON form.
func (r *Result) JSON() JSONResult {
	return JSONResult{
		Engine:          r.Engine,
		Workload:        r.Workload,
		OpsPerSec:       round(r.OpsPerSec(), 1),
		MBPerSec:        round(r.MBPerSec(), 3),
		P50us:           us(r.Latency.Quantile(0.50)),
		P99us:           us(r.Latency.Quantile(0.99)),
		P999us:          us(r.Latency.Quantile(0.999)),
		P9999us:         us(r.Latency.Quantile(0.9999)),
		MaxUs:           us(r.Latency.Max()),
		MinOpsIn1s:      r.MinOpsIn1s,
		OpsPerSecond:    r.PerSecond,
		SpaceAmp:        round(r.SpaceAmp, 3),
		DiskOverLogical: round(r.DiskOverLogical, 3),
		SSTWriteAmp:     round(r.SSTWriteAmp, 3),
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

// WriteTable writes the results grouped by workload, with every engine's
// ratio against the base engine (base_ops/peer_ops), the metrics summaries
// of the fill workloads, and a closing line per engine.
func WriteTable(w io.Writer, results []Result, base string) {
	var order []string
	byWorkload := map[string][]*Result{}
	var engines []string
	seenEngine := map[string]bool{}
	for i := range results {
		r := &results[i]
		if _, ok := byWorkload[r.Workload]; !ok {
			order = append(order, r.Workload)
		}
		byWorkload[r.Workload] = append(byWorkload[r.Workload], r)
		if !seenEngine[r.Engine] {
			seenEngine[r.Engine] = true
			engines = append(engines, r.Engine)
		}
	}
	find := func(rs []*Result, engine string) *Result {
		for _, r := range rs {
			if r.Engine == engine {
				return r
			}
		}
		return nil
	}
	ratioHeader := base + "/engine"
	for _, wl := range order {
		rs := byWorkload[wl]
		fmt.Fprintf(w, "\n== %s ==\n", wl)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "engine\tops/s\tMB/s\tp50 µs\tp99 µs\tp99.9 µs\tp99.99 µs\tmax µs\tmin ops/1s\tSST w-amp\tspace-amp\tdisk/logical\t%s\t\n", ratioHeader)
		b := find(rs, base)
		for _, r := range rs {
			if r.Err != nil {
				fmt.Fprintf(tw, "%s\tERROR\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Engine)
				continue
			}
			j := r.JSON()
			amp, dol, wamp := "-", "-", "-"
			if r.SSTWriteAmp > 0 {
				wamp = fmt.Sprintf("%.2f", r.SSTWriteAmp)
			}
			if r.SpaceAmp > 0 {
				amp = fmt.Sprintf("%.2f", r.SpaceAmp)
			}
			if r.DiskOverLogical > 0 {
				dol = fmt.Sprintf("%.2f", r.DiskOverLogical)
			}
			ratio := "-"
			if r.Engine != base {
				if v := Ratio(b, r); v > 0 {
					ratio = fmt.Sprintf("%.2fx", v)
				}
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%d\t%s\t%s\t%s\t%s\t\n",
				r.Engine, j.OpsPerSec, j.MBPerSec, j.P50us, j.P99us, j.P999us, j.P9999us, j.MaxUs, j.MinOpsIn1s, wamp, amp, dol, ratio)
		}
		tw.Flush()
		for _, r := range rs {
			if r.Err != nil {
				fmt.Fprintf(w, "  %s: ERROR: %v\n", r.Engine, r.Err)
			}
			for _, n := range r.Notes {
				fmt.Fprintf(w, "  %s: note: %s\n", r.Engine, n)
			}
			if r.DirBytes > 0 {
				fmt.Fprintf(w, "  %s: directory %.1f MB = SSTs %.1f MB + other %.1f MB (WAL, WAL archive, manifest); SSTs after full compaction %.1f MB\n",
					r.Engine, mb(r.DirBytes), mb(r.SSTBytesBefore), mb(r.DirBytes-r.SSTBytesBefore), mb(r.SSTBytesAfter))
			}
			if r.Summary != "" {
				fmt.Fprintf(w, "  %s\n", r.Summary)
			}
		}
	}

	// One closing line per engine: workloads run and failed, time spent in
	// timed phases, and the geometric mean of the base engine's ratio
	// against it over the workloads both completed.
	fmt.Fprintf(w, "\n== summary ==\n")
	for _, e := range engines {
		var n, failed int
		var timed time.Duration
		var logSum float64
		var k int
		for _, wl := range order {
			r := find(byWorkload[wl], e)
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
				if v := Ratio(find(byWorkload[wl], base), r); v > 0 {
					logSum += math.Log(v)
					k++
				}
			}
		}
		var parts []string
		parts = append(parts, fmt.Sprintf("%d workloads", n))
		if failed > 0 {
			parts = append(parts, fmt.Sprintf("%d FAILED", failed))
		}
		parts = append(parts, fmt.Sprintf("timed %s", timed.Round(10*time.Millisecond)))
		if e != base && k > 0 {
			parts = append(parts, fmt.Sprintf("geomean %s %.2fx over %d workloads", ratioHeader, math.Exp(logSum/float64(k)), k))
		}
		fmt.Fprintf(w, "%-10s %s\n", e, strings.Join(parts, ", "))
	}
}
