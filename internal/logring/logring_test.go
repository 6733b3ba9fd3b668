package logring

import (
	"log/slog"
	"strings"
	"testing"
)

// TestKeepsTheLastRecords: the handler keeps the newest records at or above
// its level, oldest first, with the attributes of derived handlers.
func TestKeepsTheLastRecords(t *testing.T) {
	h := New(3, slog.LevelInfo)
	log := slog.New(h)
	log.Debug("dropped: below the level")
	for _, m := range []string{"one", "two", "three", "four"} {
		log.Info(m, "k", m)
	}
	slog.New(h).With("node", 7).Warn("five")
	lines := h.Lines()
	if len(lines) != 3 {
		t.Fatalf("kept %d lines, want 3: %q", len(lines), lines)
	}
	for i, want := range []string{"INFO three k=three", "INFO four k=four", "WARN five node=7"} {
		if !strings.HasSuffix(lines[i], want) {
			t.Errorf("line %d = %q, want it to end with %q", i, lines[i], want)
		}
	}
}
