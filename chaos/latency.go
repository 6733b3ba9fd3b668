package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shale-db/shale/internal/lincheck"
)

// LatencySummary is the latency of the operations with a known outcome
// that were called in some set of time windows.
type LatencySummary struct {
	Ops           int
	P50, P99, Max time.Duration
}

func (s LatencySummary) String() string {
	return fmt.Sprintf("%d ops, p50 %v, p99 %v, max %v", s.Ops, s.P50.Round(time.Millisecond), s.P99.Round(time.Millisecond), s.Max.Round(time.Millisecond))
}

// LatencyByFault groups the history's operations with a known outcome by
// the nemesis fault (kind) held when they were called, and summarises each
// group's latency; "none" are those called with no fault held. An
// operation called in two overlapping windows counts for both.
func LatencyByFault(h *lincheck.History) map[string]LatencySummary {
	byKind := map[string][]time.Duration{}
	for _, op := range h.Ops {
		if op.Output.Unknown {
			continue
		}
		took := time.Duration(op.Return - op.Call)
		during := false
		for _, a := range h.Annotations {
			if a.Tag == "nemesis" && op.Call >= a.Start && op.Call <= a.End {
				byKind[a.Description] = append(byKind[a.Description], took)
				during = true
			}
		}
		if !during {
			byKind["none"] = append(byKind["none"], took)
		}
	}
	out := map[string]LatencySummary{}
	for kind, ds := range byKind {
		slices.Sort(ds)
		out[kind] = LatencySummary{Ops: len(ds), P50: ds[len(ds)/2], P99: ds[len(ds)*99/100], Max: ds[len(ds)-1]}
	}
	return out
}

// formatLatencies lists the summaries one kind a line, in name order.
func formatLatencies(m map[string]LatencySummary) string {
	var lines []string
	for kind, s := range m {
		lines = append(lines, fmt.Sprintf("%-18s %s", kind, s))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n  ")
}
