// Package output holds shalectl's formatting helpers: the text and JSON
// output formats, the codec that turns command-line arguments into keys and
// values (and back), value truncation and human-readable sizes.
package output

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// Format is an output format selected with -o/--output.
type Format string

// The output formats.
const (
	// Text is the default, human-oriented format.
	Text Format = "text"
	// JSON is machine-readable: one document, or one document per line
	// (JSON Lines) for commands that stream records.
	JSON Format = "json"
)

// ParseFormat validates an -o/--output value.
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case Text, JSON:
		return Format(s), nil
	}
	return "", fmt.Errorf("unknown output format %q (want %q or %q)", s, Text, JSON)
}

// Codec converts keys and values between their command-line spelling and
// bytes. The zero value handles them as strings.
type Codec struct {
	// Hex makes Parse decode hexadecimal (an optional 0x prefix is allowed)
	// and Format print 0x-prefixed lowercase hexadecimal.
	Hex bool
}

// Parse returns the bytes an argument spells.
func (c Codec) Parse(s string) ([]byte, error) {
	if !c.Hex {
		return []byte(s), nil
	}
	h := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	b, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("invalid hex %q: %w", s, err)
	}
	return b, nil
}

// ParseOptional is Parse for optional flags: the empty string (flag not
// given) yields nil, meaning "unbounded".
func (c Codec) ParseOptional(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	return c.Parse(s)
}

// Format returns the printed form of b. In string mode, b is printed as is
// when it is printable ASCII and as a double-quoted Go string literal (with
// escapes) otherwise; use Hex for binary data.
func (c Codec) Format(b []byte) string {
	if c.Hex {
		return "0x" + hex.EncodeToString(b)
	}
	for _, x := range b {
		if x < 0x20 || x > 0x7e {
			return strconv.QuoteToASCII(string(b))
		}
	}
	return string(b)
}

// FormatTruncated is Format of at most max bytes of b (all of b when max <=
// 0), followed by a note of the full length when b was cut.
func (c Codec) FormatTruncated(b []byte, max int) string {
	if max <= 0 || len(b) <= max {
		return c.Format(b)
	}
	return fmt.Sprintf("%s...(%d bytes)", c.Format(b[:max]), len(b))
}

// WriteJSON writes v as one indented JSON document followed by a newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// WriteJSONLine writes v as a single-line JSON document (a JSON Lines
// record).
func WriteJSONLine(w io.Writer, v any) error {
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// Bytes formats a byte count with a binary unit suffix: "512B", "1.5K",
// "3.0M", "2.1G".
func Bytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// SyncWriter serialises writes to W, so that a writer shared with
// background goroutines (such as the storage engine's logger) stays safe.
type SyncWriter struct {
	mu sync.Mutex
	// W receives the writes.
	W io.Writer
}

// Write writes p to W under the lock.
func (s *SyncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.W.Write(p)
}
