package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"
)

// testingFilePoll is how often a testing file (--testing-*-file) is read
// again.
const testingFilePoll = 250 * time.Millisecond

// followFile passes the trimmed content of the file at path (a missing file
// reads as empty) to apply: once now, returning its error, then every
// testingFilePoll until ctx ends. A later error is logged and apply is
// expected to keep its previous setting: a half-written file must not
// swing it. The fault-injection tests change a running node this way.
func followFile(ctx context.Context, path string, log *slog.Logger, apply func(content string) error) error {
	read := func() error {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			b, err = nil, nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if err := apply(strings.TrimSpace(string(b))); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}
	if err := read(); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(testingFilePoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := read(); err != nil {
					log.Warn("testing file", "err", err)
				}
			}
		}
	}()
	return nil
}
