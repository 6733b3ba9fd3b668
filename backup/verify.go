package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// VerifyProgress reports a verification under way.
type VerifyProgress struct {
	FilesDone, Files int
	BytesDone, Bytes int64
}

// VerifyReport is what Verify read and found.
type VerifyReport struct {
	Files int
	Bytes int64
	// Problems names every file missing, cut short or with a wrong
	// checksum.
	Problems []string
}

// Verify reads backup id's manifest and every file it lists, and checks
// each file's size and CRC-32C. It returns an error wrapping ErrCorrupt
// when anything is wrong, with every problem in the report.
func Verify(ctx context.Context, loc *Location, id string, progress func(VerifyProgress)) (VerifyReport, error) {
	var rep VerifyReport
	m, err := loc.Describe(ctx, id)
	if err != nil {
		return rep, err
	}
	total := VerifyProgress{}
	for _, p := range m.Shards {
		total.Files += len(p.stored())
		total.Bytes += int64(p.Bytes())
	}
	buf := make([]byte, 1<<20)
	for _, p := range m.Shards {
		for _, f := range p.stored() {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			// A missing or damaged file is a problem to report; any other
			// error (the store unreachable) stops the verification.
			if err := loc.readChecked(ctx, f, io.Discard, buf); errors.Is(err, ErrCorrupt) {
				problem := strings.TrimPrefix(err.Error(), ErrCorrupt.Error()+": ")
				rep.Problems = append(rep.Problems, fmt.Sprintf("shard %d: %s (%s): %s", p.ShardID, f.Name, f.Path, problem))
			} else if err != nil {
				return rep, fmt.Errorf("backup %s: read %s: %w", id, f.Path, err)
			}
			rep.Files++
			rep.Bytes += int64(f.Size)
			if progress != nil {
				total.FilesDone, total.BytesDone = rep.Files, rep.Bytes
				progress(total)
			}
		}
	}
	if len(rep.Problems) > 0 {
		return rep, fmt.Errorf("backup %s: %w: %d of %d files bad: %s", id, ErrCorrupt, len(rep.Problems), rep.Files, rep.Problems[0])
	}
	return rep, nil
}
