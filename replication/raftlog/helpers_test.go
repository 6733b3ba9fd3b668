package raftlog

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

// testEnv is a raft-log engine on an in-memory filesystem that tests can
// close and reopen.
type testEnv struct {
	t    *testing.T
	fs   vfs.FS
	dir  string
	db   *storage.DB
	opts Options
}

func newTestEnv(t *testing.T, opts Options) *testEnv {
	t.Helper()
	e := &testEnv{t: t, fs: vfs.NewMem(), dir: "/raftlog", opts: opts}
	e.open()
	t.Cleanup(func() {
		if e.db != nil {
			_ = e.db.Close()
		}
	})
	return e
}

func (e *testEnv) open() {
	e.t.Helper()
	db, err := storage.Open(e.dir, &storage.Options{
		FS: e.fs,
		// Small memtables: the tests' logs end up in SSTs and levels too.
		MemTableSize: 64 << 10,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		e.t.Fatalf("open engine: %v", err)
	}
	e.db = db
}

// reopen closes the engine and opens it again, returning a fresh Store.
func (e *testEnv) reopen() *Store {
	e.t.Helper()
	if err := e.db.Close(); err != nil {
		e.t.Fatalf("close engine: %v", err)
	}
	e.db = nil
	e.open()
	return New(e.db, e.opts)
}

func (e *testEnv) store() *Store { return New(e.db, e.opts) }

func mustShard(t *testing.T, s *Store, id uint64) *Log {
	t.Helper()
	l, err := s.Shard(id)
	if err != nil {
		t.Fatalf("Shard(%d): %v", id, err)
	}
	l.SetCallbacks(func() *raftpb.ConfState {
		return &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	}, nil)
	return l
}

func mustCommit(t *testing.T, s *Store, b *storage.Batch) {
	t.Helper()
	if err := s.Commit(b); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func ent(index, term uint64, data string) *raftpb.Entry {
	return &raftpb.Entry{Index: new(index), Term: new(term), Type: new(raftpb.EntryNormal), Data: []byte(data)}
}

// ents returns entries [lo, hi) of the given term with data of varying sizes.
func ents(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i < hi; i++ {
		out = append(out, ent(i, term, string(make([]byte, int(i%7)*10))))
	}
	return out
}

// sameErr reports whether got is (or wraps) want, or both are nil.
func sameErr(got, want error) bool {
	if want == nil || got == nil {
		return got == want
	}
	return errors.Is(got, want)
}

func sameHardState(a, b *raftpb.HardState) bool {
	return a.GetTerm() == b.GetTerm() && a.GetVote() == b.GetVote() && a.GetCommit() == b.GetCommit()
}

func sameEntries(a, b []*raftpb.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// cloneMem returns a MemoryStorage holding the same log as ms.
func cloneMem(t *testing.T, ms *raft.MemoryStorage) *raft.MemoryStorage {
	t.Helper()
	n := raft.NewMemoryStorage()
	fi, _ := ms.FirstIndex()
	li, _ := ms.LastIndex()
	tt, err := ms.Term(fi - 1)
	if err != nil {
		t.Fatal(err)
	}
	if fi-1 > 0 || tt > 0 {
		if err := n.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(fi - 1), Term: new(tt)}}); err != nil {
			t.Fatal(err)
		}
	}
	if li >= fi {
		es, err := ms.Entries(fi, li+1, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Append(es); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// prefixSizes returns the cumulative encoded sizes of es: out[j] is the size
// of es[:j+1].
func prefixSizes(es []*raftpb.Entry) []uint64 {
	out := make([]uint64, len(es))
	var s uint64
	for i, e := range es {
		s += uint64(proto.Size(e))
		out[i] = s
	}
	return out
}
