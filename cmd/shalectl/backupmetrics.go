package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// streamMetrics are the Prometheus metrics of backup stream, served on
// --metrics-addr: what an operator alerts on (no backup for too long, a
// recovery point falling behind, failures).
type streamMetrics struct {
	reg           *prometheus.Registry
	backups       *prometheus.CounterVec // type: full, incremental
	failures      prometheus.Counter
	bytes         prometheus.Counter
	lastSuccess   prometheus.Gauge
	recoveryPoint prometheus.Gauge
}

func newStreamMetrics() *streamMetrics {
	m := &streamMetrics{
		reg: prometheus.NewRegistry(),
		backups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_backup_stream_backups_total",
			Help: "Backups this backup stream completed, by type (full, incremental)."}, []string{"type"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "shale_backup_stream_failures_total",
			Help: "Rounds of this backup stream that failed (their incomplete backup removed; retried at the next interval)."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "shale_backup_stream_copied_bytes_total",
			Help: "Bytes this backup stream copied into the location (files it already held are not copied)."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shale_backup_stream_last_success_timestamp_seconds",
			Help: "Unix time at which this backup stream last completed a backup (0 before the first)."}),
		recoveryPoint: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shale_backup_stream_recovery_point_timestamp_seconds",
			Help: "The latest time a restore of the newest backup can reach (its recovery point), as Unix time (0 before the first)."}),
	}
	m.backups.WithLabelValues("full")
	m.backups.WithLabelValues("incremental")
	m.reg.MustRegister(m.backups, m.failures, m.bytes, m.lastSuccess, m.recoveryPoint)
	return m
}

// succeeded records a completed backup.
func (m *streamMetrics) succeeded(full bool, copied int64, recovery time.Time) {
	typ := "incremental"
	if full {
		typ = "full"
	}
	m.backups.WithLabelValues(typ).Inc()
	m.bytes.Add(float64(copied))
	m.lastSuccess.Set(float64(time.Now().UnixNano()) / 1e9)
	if !recovery.IsZero() {
		m.recoveryPoint.Set(float64(recovery.UnixNano()) / 1e9)
	}
}

// failed records a failed round.
func (m *streamMetrics) failed() { m.failures.Inc() }

// serve listens on addr at once (so a taken port fails the command before
// any backup) and serves /metrics until ctx ends; errors after that go to
// errw.
func (m *streamMetrics) serve(ctx context.Context, addr string, errw io.Writer) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(errw, "shalectl: backup stream: metrics: %v\n", err)
		}
	}()
	context.AfterFunc(ctx, func() { srv.Close() })
	return nil
}
