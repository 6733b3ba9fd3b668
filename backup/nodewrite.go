package backup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/shale-db/shale/internal/directfile"
	"github.com/shale-db/shale/internal/filecrc"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// The nodes write their own parts (Admin.BackupShardTo): Create asks each
// node for a shard's checkpoint written straight into the location, and
// only coordinates, writing the manifest last. What a node needs for it is
// here: the location opened with the credentials Create sends
// (OpenWithCredentials), the check that it is the location Create writes
// to (CheckStarted), and the writing itself (StoreCheckpoint).

// S3Credentials are an S3 access key, its secret and, for temporary
// credentials, the session token. Printed or logged (String, GoString,
// LogValue), they show the access key only.
type S3Credentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// String names the access key; the secret and the token are never shown.
func (c S3Credentials) String() string {
	return fmt.Sprintf("S3Credentials{AccessKeyID: %q, SecretAccessKey: <redacted>, SessionToken: <redacted>}", c.AccessKeyID)
}

// GoString is String: %#v shows no secret either.
func (c S3Credentials) GoString() string { return c.String() }

// LogValue is String: a logged S3Credentials shows no secret.
func (c S3Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

// OpenWithCredentials opens the existing location where names (as
// Location.Address gives it), as Open does, except that an S3 location's
// requests are signed with creds when creds is not nil (instead of the
// credentials of this process's environment).
func OpenWithCredentials(ctx context.Context, where string, creds *S3Credentials) (*Location, error) {
	return open(ctx, where, false, creds)
}

// Address names the location for another process that opens it
// (OpenWithCredentials): String, with a directory made absolute.
func (l *Location) Address() (string, error) {
	if d, ok := l.st.(*dirStore); ok {
		abs, err := filepath.Abs(d.dir)
		if err != nil {
			return "", fmt.Errorf("backup: location %s: %w", d.dir, err)
		}
		return abs, nil
	}
	return l.String(), nil
}

// s3Credentials returns the credentials an S3 location signs its requests
// with, resolved now; nil for a directory.
func (l *Location) s3Credentials() (*S3Credentials, error) {
	s, ok := l.st.(*s3Store)
	if !ok {
		return nil, nil
	}
	v, err := s.creds.GetWithContext(&credentials.CredContext{})
	if err != nil {
		return nil, fmt.Errorf("backup: credentials for %s: %w", s, err)
	}
	return &S3Credentials{AccessKeyID: v.AccessKeyID, SecretAccessKey: v.SecretAccessKey, SessionToken: v.SessionToken}, nil
}

// ErrOtherLocation says that the location a node opened is not the one
// the backup is written to: it holds no start marker of the backup with
// the backup's token (a directory path that names another directory on
// that node than on the caller's host, say).
var ErrOtherLocation = errors.New("not the location the backup is written to")

// newToken returns a random token that marks one run of Create.
func newToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("backup: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// CheckStarted checks that the location holds backup id begun by the run
// of Create that token names (its start marker): an error wrapping
// ErrOtherLocation when it does not.
func (l *Location) CheckStarted(ctx context.Context, id, token string) error {
	if err := ValidID(id); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	b, err := l.readAll(ctx, startedName(id), 1<<16)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("backup: %s holds no backup %s being written: %w", l, id, ErrOtherLocation)
	}
	if err != nil {
		return fmt.Errorf("backup: read the start of backup %s in %s: %w", id, l, err)
	}
	var info struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(b, &info); err != nil || info.Token == "" || info.Token != token {
		return fmt.Errorf("backup: backup %s in %s was begun by another run: %w", id, l, ErrOtherLocation)
	}
	return nil
}

// copyBufferSize is how much StoreCheckpoint reads and writes at a time.
const copyBufferSize = 1 << 20

// StoreCheckpoint stores the files of shard shardID's checkpoint in dir
// into the location, as a backup's part: each of files (name and size, the
// size being the file's first bytes to take) under
// files/shard-<id>/<name>.<size>.<crc32c>, durably, and sets its Crc32C. A
// file of skip with the same name, size and checksum is checksummed but not
// stored. In a directory location each file is read once: its CRC-32C is
// computed while it is written to a temporary file, which is then renamed
// to the name that carries it; an S3 object is named before it is written,
// so each file is read for its checksum first, then again to upload it
// (checked against that checksum). pace, if not nil, is called before each
// write of n bytes (the node's rate limit). It returns the indexes in files
// of the files stored and their bytes.
func (l *Location) StoreCheckpoint(ctx context.Context, shardID uint64, dir string, files []*shalev1.SnapshotFile,
	skip []*shalev1.SnapshotFile, pace func(ctx context.Context, n int) error) (written []uint32, bytes int64, err error) {
	held := make(map[string]*shalev1.SnapshotFile, len(skip))
	for _, f := range skip {
		held[f.GetName()] = f
	}
	buf := make([]byte, copyBufferSize)
	for i, f := range files {
		if err := validFileName(f.GetName()); err != nil {
			return written, bytes, fmt.Errorf("backup: shard %d: %w", shardID, err)
		}
		path := filepath.Join(dir, f.GetName())
		if h := held[f.GetName()]; h != nil && h.GetSize() == f.GetSize() {
			crc, err := checksumFile(ctx, path, f.GetSize(), buf)
			if err != nil {
				return written, bytes, err
			}
			f.Crc32C = crc
			if crc == h.GetCrc32C() {
				continue
			}
		}
		crc, err := l.storeFile(ctx, shardID, path, f.GetName(), f.GetSize(), buf, pace)
		if err != nil {
			return written, bytes, fmt.Errorf("backup: store %s in %s: %w", f.GetName(), l, err)
		}
		f.Crc32C = crc
		written = append(written, uint32(i))
		bytes += int64(f.GetSize())
	}
	return written, bytes, nil
}

// storeFile stores the first size bytes of the file at path as checkpoint
// file name of shard shardID and returns their CRC-32C.
func (l *Location) storeFile(ctx context.Context, shardID uint64, path, name string, size uint64, buf []byte,
	pace func(context.Context, int) error) (uint32, error) {
	d, ok := l.st.(*dirStore)
	if !ok {
		crc, err := checksumFile(ctx, path, size, buf)
		if err != nil {
			return 0, err
		}
		src, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		defer src.Close()
		r := &checkedReader{in: src, r: &pacedReader{ctx: ctx, r: io.LimitReader(src, int64(size)), pace: pace}, size: size, crc: crc}
		return crc, l.st.put(ctx, storedPath(shardID, name, size, crc), r, int64(size))
	}
	src, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	tmp, err := d.tempFile()
	if err != nil {
		return 0, err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	w := directfile.New(tmp) // written once, read only by a restore or a verify
	defer w.Close()
	var sum crcCounter
	in := io.LimitReader(src, int64(size))
	for sum.n < size {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n, rerr := io.ReadFull(in, buf[:min(uint64(len(buf)), size-sum.n)])
		if n > 0 {
			if pace != nil {
				if err := pace(ctx, n); err != nil {
					return 0, err
				}
			}
			_, _ = sum.Write(buf[:n])
			if _, err := w.Write(buf[:n]); err != nil {
				return 0, err
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				return 0, fmt.Errorf("%s: %d bytes, shorter than its listed %d", path, sum.n, size)
			}
			return 0, rerr
		}
	}
	if err := w.Sync(); err != nil {
		return 0, err
	}
	return sum.crc, d.putFile(ctx, storedPath(shardID, name, size, sum.crc), tmp, int64(size))
}

// checksumFile returns the CRC-32C of the first size bytes of the file at
// path, read through buf.
func checksumFile(ctx context.Context, path string, size uint64, buf []byte) (uint32, error) {
	n, crc, err := filecrc.File(ctx, path, int64(size), buf)
	if err != nil {
		return 0, fmt.Errorf("backup: checksum %s: %w", path, err)
	}
	if uint64(n) != size {
		return 0, fmt.Errorf("backup: %s: %d bytes, shorter than its listed %d", path, n, size)
	}
	return crc, nil
}

// pacedReader calls pace with every read's length before returning it.
type pacedReader struct {
	ctx  context.Context
	r    io.Reader
	pace func(context.Context, int) error
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := p.r.Read(b)
	if n > 0 && p.pace != nil {
		if perr := p.pace(p.ctx, n); perr != nil {
			return 0, perr
		}
	}
	return n, err
}
