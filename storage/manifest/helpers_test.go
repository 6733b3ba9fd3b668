package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/vfs"
)

// osFS is a minimal vfs.FS over the operating system, enough for these
// tests (the real implementations live in package vfs).
type osFS struct{}

var _ vfs.FS = osFS{}

func (osFS) Create(name string) (vfs.File, error) { return os.Create(name) }
func (osFS) OpenAppend(name string) (vfs.File, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
}
func (osFS) Open(name string) (vfs.File, error) { return os.Open(name) }
func (osFS) OpenDir(name string) (vfs.File, error) {
	return os.Open(name)
}
func (osFS) Remove(name string) error             { return os.Remove(name) }
func (osFS) RemoveAll(name string) error          { return os.RemoveAll(name) }
func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }
func (osFS) Link(oldname, newname string) error   { return os.Link(oldname, newname) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error {
	return os.MkdirAll(dir, perm)
}
func (osFS) List(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}
func (osFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }
func (osFS) Lock(name string) (io.Closer, error) {
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
func (osFS) Join(elem ...string) string { return filepath.Join(elem...) }

// bytesFS serves one read-only file, path, from memory, so that replay
// tests need no disk I/O. Only Open is implemented.
type bytesFS struct {
	osFS
	path string
	data []byte
}

func (b bytesFS) Open(name string) (vfs.File, error) {
	if name != b.path {
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
	return bytesFile{bytes.NewReader(b.data)}, nil
}

type bytesFile struct{ *bytes.Reader }

func (bytesFile) Write([]byte) (int, error)  { return 0, errors.New("read-only") }
func (bytesFile) Close() error               { return nil }
func (bytesFile) Sync() error                { return nil }
func (bytesFile) Stat() (os.FileInfo, error) { return nil, errors.New("not supported") }

// parseKey parses "userkey#seq,KIND"; seq may be "max".
func parseKey(s string) (base.InternalKey, error) {
	i := strings.LastIndexByte(s, '#')
	if i < 0 {
		return base.InternalKey{}, fmt.Errorf("key %q: missing #", s)
	}
	seqStr, kindStr, ok := strings.Cut(s[i+1:], ",")
	if !ok {
		return base.InternalKey{}, fmt.Errorf("key %q: missing kind", s)
	}
	var seq base.SeqNum
	if seqStr == "max" {
		seq = base.MaxSeqNum
	} else {
		n, err := strconv.ParseUint(seqStr, 10, 64)
		if err != nil {
			return base.InternalKey{}, fmt.Errorf("key %q: %w", s, err)
		}
		seq = base.SeqNum(n)
	}
	kinds := map[string]base.Kind{"SET": base.KindSet, "DEL": base.KindDelete, "MERGE": base.KindMerge,
		"RANGEDEL": base.KindRangeDelete, "MAX": base.KindMax}
	k, ok := kinds[kindStr]
	if !ok {
		return base.InternalKey{}, fmt.Errorf("key %q: unknown kind", s)
	}
	return base.MakeInternalKey([]byte(s[:i]), seq, k), nil
}

// parseFile parses "num:smallest-largest[ size=N]"; seqnums are derived
// from the keys (with MaxSeqNum sentinels ignored).
func parseFile(s string) (*FileMetadata, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, fmt.Errorf("empty file spec")
	}
	numStr, rng, ok := strings.Cut(fields[0], ":")
	if !ok {
		return nil, fmt.Errorf("file %q: missing ':'", s)
	}
	num, err := strconv.ParseUint(numStr, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("file %q: %w", s, err)
	}
	lo, hi, ok := strings.Cut(rng, "-")
	if !ok {
		return nil, fmt.Errorf("file %q: missing '-'", s)
	}
	m := &FileMetadata{FileNum: FileNum(num), Size: 1}
	if m.Smallest, err = parseKey(lo); err != nil {
		return nil, err
	}
	if m.Largest, err = parseKey(hi); err != nil {
		return nil, err
	}
	seqs := []base.SeqNum{}
	for _, k := range []base.InternalKey{m.Smallest, m.Largest} {
		if k.SeqNum() != base.MaxSeqNum {
			seqs = append(seqs, k.SeqNum())
		}
	}
	if len(seqs) > 0 {
		m.SmallestSeq, m.LargestSeq = min(seqs[0], seqs[len(seqs)-1]), max(seqs[0], seqs[len(seqs)-1])
	}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("file %q: %s: %w", s, k, err)
		}
		switch k {
		case "size":
			m.Size = n
		case "smallest-seq":
			m.SmallestSeq = base.SeqNum(n)
		case "largest-seq":
			m.LargestSeq = base.SeqNum(n)
		default:
			return nil, fmt.Errorf("file %q: unknown field %s", s, k)
		}
	}
	return m, nil
}
