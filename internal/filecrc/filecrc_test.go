package filecrc

import (
	"context"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
)

func TestFile(t *testing.T) {
	data := make([]byte, 1<<20+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := func(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }
	for _, tc := range []struct {
		limit    int64
		bufSize  int
		wantSize int64
	}{
		{-1, 0, int64(len(data))},
		{-1, 4096, int64(len(data))},
		{1000, 333, 1000},
		{0, 10, 0},
		{int64(len(data)) + 50, 1 << 16, int64(len(data))},
	} {
		size, crc, err := File(context.Background(), path, tc.limit, make([]byte, tc.bufSize))
		if err != nil {
			t.Fatalf("limit %d: %v", tc.limit, err)
		}
		if size != tc.wantSize || crc != want(data[:tc.wantSize]) {
			t.Fatalf("limit %d buf %d: size %d crc %08x, want %d %08x", tc.limit, tc.bufSize, size, crc, tc.wantSize, want(data[:tc.wantSize]))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := File(ctx, path, -1, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v, want context.Canceled", err)
	}
	if _, _, err := File(context.Background(), filepath.Join(t.TempDir(), "missing"), -1, nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
