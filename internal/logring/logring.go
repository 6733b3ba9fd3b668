// Package logring is a slog handler that keeps a process's last log
// records in memory, for a test to print or save when it fails (a long run
// cannot keep every record, and its failure is explained by the last ones).
package logring

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Handler keeps the last records at or above its level, one line each
// (time, level, message, attributes). Handlers derived with WithAttrs share
// its records. It is safe for concurrent use.
type Handler struct {
	level slog.Level
	attrs []slog.Attr
	ring  *ring
}

type ring struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
}

// New returns a Handler keeping the last n records at or above level.
func New(n int, level slog.Level) *Handler {
	return &Handler{level: level, ring: &ring{lines: make([]string, max(n, 1))}}
}

// Enabled reports whether a record of level lvl is kept.
func (h *Handler) Enabled(_ context.Context, lvl slog.Level) bool { return lvl >= h.level }

// Handle keeps r, dropping the oldest record kept when full.
func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", r.Time.UTC().Format("15:04:05.000"), r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	g := h.ring
	g.mu.Lock()
	g.lines[g.next] = b.String()
	g.next = (g.next + 1) % len(g.lines)
	g.full = g.full || g.next == 0
	g.mu.Unlock()
	return nil
}

// WithAttrs returns a Handler adding attrs to every record, sharing h's
// records.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{level: h.level, attrs: append(slices.Clip(h.attrs), attrs...), ring: h.ring}
}

// WithGroup returns h: groups are not kept apart.
func (h *Handler) WithGroup(string) slog.Handler { return h }

// Lines returns the records kept, oldest first.
func (h *Handler) Lines() []string {
	g := h.ring
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	if g.full {
		out = append(out, g.lines[g.next:]...)
	}
	return append(out, g.lines[:g.next]...)
}
