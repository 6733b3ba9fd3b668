package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/bench/cluster"
)

func watchCmd() *cobra.Command {
	var (
		engines, watchers, dir, shaleServer, shaleSplits string
		rate, writers, conns, valueSize                  int
		duration                                         time.Duration
		keep, asJSON                                     bool
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Change-feed delivery on a local 3-node cluster: Shale vs etcd",
		Long: `For every number of watchers in --watchers and every engine, starts a
fresh local 3-member cluster, opens that many watchers of the prefix "w/"
(sharing --conns client connections), waits until each has seen a marker
write, then puts --rate values per second under the prefix for --duration
(--writers concurrent writers, --value-size-byte values, each carrying its
send time) and waits up to 30s for the events to drain. It reports the
events delivered per second, how many of the due events (puts × watchers)
arrived, and the put-to-event latency percentiles, with Shale's ratio to
etcd's in the same run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			engs, err := cluster.ParseEngines(engines)
			if err != nil {
				return err
			}
			counts, err := parseClients(watchers)
			if err != nil {
				return fmt.Errorf("--watchers: %w", err)
			}
			if rate <= 0 || writers <= 0 || duration <= 0 || valueSize < 8 {
				return errors.New("need --rate > 0, --writers > 0, --duration > 0 and --value-size >= 8")
			}
			cluster.SetShaleOptions(cluster.ShaleOptions{ServerPath: shaleServer, Splits: shaleSplits})
			defer cluster.CleanupShaleServer()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "shale-bench watch: engines %s; 3 members each; watchers %s on %d connections; %d puts/s by %d writers for %s; %d-byte values\n",
					strings.Join(engs, ","), watchers, conns, rate, writers, duration, valueSize)
			}
			failed := 0
			results := cluster.RunWatch(ctx, cluster.WatchConfig{
				Engines: engs, Watchers: counts, Conns: conns, Rate: rate, Writers: writers,
				ValueSize: valueSize, Duration: duration, Dir: dir, Keep: keep, Log: os.Stderr,
			}, func(r cluster.WatchResult) {
				if r.Err != nil {
					failed++
					fmt.Fprintf(os.Stderr, "watch/%s/%d watchers: ERROR: %v\n", r.Engine, r.Watchers, r.Err)
				}
				if asJSON {
					_ = writeWatchJSON(out, r)
				}
			})
			if !asJSON {
				writeWatchTable(out, results)
			}
			if ctx.Err() != nil {
				return errors.New("interrupted")
			}
			if failed > 0 {
				return fmt.Errorf("%d cell(s) failed", failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&engines, "engines", strings.Join(cluster.EngineNames(), ","), "comma-separated engines to compare (shale, etcd)")
	f.StringVar(&watchers, "watchers", "1,10,100,1000", "comma-separated numbers of watchers")
	f.IntVar(&conns, "conns", 4, "client connections the watchers share, round robin")
	f.IntVar(&rate, "rate", 500, "puts per second under the watched prefix")
	f.IntVar(&writers, "writers", 16, "concurrent writers sharing the rate")
	f.IntVar(&valueSize, "value-size", 64, "value size in bytes (at least 8)")
	f.DurationVar(&duration, "duration", 10*time.Second, "timed length of every (engine, watchers) cell")
	f.StringVar(&dir, "dir", "./data/bench-watch", "parent directory of the per-cell cluster directories")
	f.BoolVar(&keep, "keep", false, "keep each cluster's directory")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per (engine, watchers) instead of the table")
	f.StringVar(&shaleServer, "shale-server", "", "shale-server binary for the Shale peer (default: go build it once per run)")
	f.StringVar(&shaleSplits, "shale-splits", cluster.DefaultShaleSplits, "shale-server --initial-splits of the Shale peer")
	return cmd
}

// watchJSON is the JSON form of a watch cell.
type watchJSON struct {
	Engine       string  `json:"engine"`
	Watchers     int     `json:"watchers"`
	Puts         int64   `json:"puts"`
	Expected     int64   `json:"expected_events"`
	Delivered    int64   `json:"delivered_events"`
	EventsPerSec float64 `json:"events_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Err          string  `json:"error,omitempty"`
}

func toWatchJSON(r cluster.WatchResult) watchJSON {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	j := watchJSON{Engine: r.Engine, Watchers: r.Watchers, Puts: r.Puts, Expected: r.Expected, Delivered: r.Delivered,
		EventsPerSec: r.EventsPerSec(), P50ms: ms(r.Latency.Quantile(0.5)), P99ms: ms(r.Latency.Quantile(0.99)), MaxMs: ms(r.Latency.Max())}
	if r.Err != nil {
		j.Err = r.Err.Error()
	}
	return j
}

func writeWatchJSON(w io.Writer, r cluster.WatchResult) error {
	b, err := json.Marshal(toWatchJSON(r))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeWatchTable prints the cells, with Shale's events/s and p99 as
// ratios of etcd's in the same row group.
func writeWatchTable(w io.Writer, rs []cluster.WatchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "watchers\tengine\tevents/s\tdelivered\tp50 ms\tp99 ms\tmax ms\tevents/s vs etcd\tp99 vs etcd\t\n")
	byKey := map[string]watchJSON{}
	for _, r := range rs {
		byKey[fmt.Sprint(r.Engine, "/", r.Watchers)] = toWatchJSON(r)
	}
	for _, r := range rs {
		j := byKey[fmt.Sprint(r.Engine, "/", r.Watchers)]
		ratio, p99 := "", ""
		if e, ok := byKey[fmt.Sprint("etcd/", r.Watchers)]; ok && r.Engine != "etcd" && e.EventsPerSec > 0 && e.P99ms > 0 {
			ratio = fmt.Sprintf("%.2fx", j.EventsPerSec/e.EventsPerSec)
			p99 = fmt.Sprintf("%.2fx", j.P99ms/e.P99ms)
		}
		delivered := fmt.Sprintf("%d/%d", j.Delivered, j.Expected)
		if j.Err != "" {
			delivered = "ERROR"
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t\n", j.Watchers, j.Engine, j.EventsPerSec, delivered, j.P50ms, j.P99ms, j.MaxMs, ratio, p99)
	}
	_ = tw.Flush()
}
