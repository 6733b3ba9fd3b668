package raftlog

import (
	"errors"
	"math"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/storage"
)

// corruptEnv returns an engine holding shard 5 with entries (0, 10] and a
// hard state, and an engine-level writer for damaging it.
func corruptEnv(t *testing.T) *testEnv {
	env := newTestEnv(t, Options{EntryCacheBytes: -1})
	s := env.store()
	l := mustShard(t, s, 5)
	b := storage.NewBatch()
	if err := l.Append(b, ents(1, 11, 2), &raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(10))}); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, b)
	return env
}

func damage(t *testing.T, env *testEnv, key, value []byte) {
	t.Helper()
	var err error
	if value == nil {
		err = env.db.Delete(key, storage.Sync)
	} else {
		err = env.db.Set(key, value, storage.Sync)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func wantCorrupt(t *testing.T, what string, err error, mention string) {
	t.Helper()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("%s: error %v, want ErrCorrupt", what, err)
	}
	if !strings.Contains(err.Error(), mention) {
		t.Fatalf("%s: error %q does not mention %q", what, err, mention)
	}
}

// TestCorruptionOnLoad damages the state Shard reads and checks that it
// reports an error (naming the shard) instead of panicking or loading it.
func TestCorruptionOnLoad(t *testing.T) {
	e10, _ := proto.Marshal(ent(10, 2, "x"))
	for _, tc := range []struct {
		name       string
		key, value []byte
		mention    string
	}{
		{"truncated state garbage", truncatedStateKey(5), []byte("garbage"), "shard 5"},
		{"truncated state empty", truncatedStateKey(5), []byte{}, "shard 5"},
		{"truncated state checksum", truncatedStateKey(5), func() []byte {
			b := encodeTruncatedState(3, 2)
			b[4] ^= 1
			return b
		}(), "checksum"},
		{"hard state garbage", hardStateKey(5), []byte{0x08}, "hard state"},
		{"gap in entries", entryKey(5, 4), nil, "gap"},
		{"entries beyond a gap after the truncated index", truncatedStateKey(5), encodeTruncatedState(0, 0), ""},
		{"last entry garbage", entryKey(5, 10), []byte{0xff, 0xff, 0xff}, "entry 10"},
		{"last entry under the wrong index", entryKey(5, 11), e10, "entry 11"},
		{"malformed key in entry span", append(entryKey(5, 11), 0), []byte("x"), "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := corruptEnv(t)
			if tc.mention == "" {
				// Truncated at 0 but entry 1 deleted: entries start at 2.
				damage(t, env, entryKey(5, 1), nil)
				tc.mention = "gap"
			} else {
				damage(t, env, tc.key, tc.value)
			}
			s := env.reopen()
			_, err := s.Shard(5)
			wantCorrupt(t, tc.name, err, tc.mention)
			// Other shards are unaffected.
			if l, err := s.Shard(6); err != nil || mustLast(l) != 0 {
				t.Fatalf("shard 6: %v", err)
			}
		})
	}
}

func mustLast(l *Log) uint64 { i, _ := l.LastIndex(); return i }

// TestCorruptionOnRead damages entries in the middle of a loaded log: reads
// of them fail with an error naming the entry, and nothing panics.
func TestCorruptionOnRead(t *testing.T) {
	e6, _ := proto.Marshal(ent(6, 2, ""))
	for _, tc := range []struct {
		name  string
		value []byte
	}{
		{"garbage", []byte{0xff, 0xff, 0xff, 0xff}},
		{"wrong index", e6},
		{"no index", func() []byte { b, _ := proto.Marshal(&raftpb.Entry{Term: new(uint64(2))}); return b }()},
		{"missing", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := corruptEnv(t)
			s := env.reopen()
			l := mustShard(t, s, 5) // loading checks contiguity: damage after it
			damage(t, env, entryKey(5, 5), tc.value)
			_, err := l.Entries(3, 8, math.MaxUint64)
			wantCorrupt(t, "Entries", err, "entry 5")
			_, err = l.Term(5)
			wantCorrupt(t, "Term", err, "entry 5")
			b := storage.NewBatch()
			wantCorrupt(t, "Compact", l.Compact(b, 5), "entry 5")
			// Entries before the damage are still readable.
			if es, err := l.Entries(1, 5, math.MaxUint64); err != nil || len(es) != 4 {
				t.Fatalf("Entries(1, 5) = %d entries, %v", len(es), err)
			}
		})
	}
}

// TestShardIDsMalformed checks that a stray short key under the raft prefix
// is reported, not misparsed.
func TestShardIDsMalformed(t *testing.T) {
	env := corruptEnv(t)
	damage(t, env, []byte{keyPrefix, 1, 2}, []byte("x"))
	_, err := env.store().ShardIDs()
	wantCorrupt(t, "ShardIDs", err, "malformed")
}
