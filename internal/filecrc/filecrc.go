// Package filecrc checksums files with CRC-32C (Castagnoli), the checksum
// snapshots and backups list for every file they ship: one reading of a
// file, stopped early if the caller's context ends.
package filecrc

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File returns the size and CRC-32C of the file at path, or of its first
// limit bytes when limit >= 0 (size is then at most limit: a shorter file
// gives its own size, which the caller compares). It reads through buf
// (a buffer of its own when buf is empty) and returns ctx's error once ctx
// ends.
func File(ctx context.Context, path string, limit int64, buf []byte) (size int64, crc uint32, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if len(buf) == 0 {
		buf = make([]byte, 256<<10)
	}
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	for {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		n, rerr := r.Read(buf)
		crc = crc32.Update(crc, castagnoli, buf[:n])
		size += int64(n)
		if rerr == io.EOF {
			return size, crc, nil
		}
		if rerr != nil {
			return 0, 0, fmt.Errorf("read %s: %w", path, rerr)
		}
	}
}
