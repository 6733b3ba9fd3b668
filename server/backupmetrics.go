package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// backupMetrics count the parts of backups this node served: checkpoints
// of its replicas (Admin.BackupShard) and their logs
// (Admin.BackupShardLog), for `shalectl backup create` and `backup stream`.
type backupMetrics struct {
	parts       *prometheus.CounterVec // kind, result
	bytes       *prometheus.CounterVec // kind
	lastSuccess *prometheus.GaugeVec   // kind
}

// Kinds of backup part (the kind label).
const (
	backupCheckpoint = "checkpoint"
	backupLog        = "log"
)

func newBackupMetrics(reg prometheus.Registerer) *backupMetrics {
	m := &backupMetrics{
		parts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_backup_parts_total",
			Help: "Parts of backups this node served, by kind (checkpoint: a replica's files; log: its entries since a backup) and result (ok, error: failed or cut off)."},
			[]string{"kind", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shale_backup_sent_bytes_total",
			Help: "Bytes of backup parts this node sent, by kind: checkpoint file bytes (files the backup already held are not sent) and encoded log entries."},
			[]string{"kind"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shale_backup_last_success_timestamp_seconds",
			Help: "Unix time at which this node last served a backup part in full, by kind (absent until it has)."},
			[]string{"kind"}),
	}
	reg.MustRegister(m.parts, m.bytes, m.lastSuccess)
	return m
}

// served records one part of kind that sent bytes and ended with err.
func (m *backupMetrics) served(kind string, bytes int64, err error) {
	m.bytes.WithLabelValues(kind).Add(float64(bytes))
	if err != nil {
		m.parts.WithLabelValues(kind, "error").Inc()
		return
	}
	m.parts.WithLabelValues(kind, "ok").Inc()
	m.lastSuccess.WithLabelValues(kind).Set(float64(time.Now().UnixNano()) / 1e9)
}
