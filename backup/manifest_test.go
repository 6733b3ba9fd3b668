package backup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func sampleManifest() *Manifest {
	return &Manifest{
		Format: FormatVersion, ID: "b1", ClusterID: "c", Started: time.Unix(100, 0).UTC(), Finished: time.Unix(160, 0).UTC(),
		Shards: []Part{{
			ShardID: 2, Start: []byte("a"), End: []byte("m"), Epoch: 3, Descriptor: []byte(`{"shardId":"2"}`), NodeID: 1,
			AppliedIndex: 10, AppliedTerm: 2, Date: HLC{WallNanos: 5, Logical: 1},
			Files: []File{{Name: "000001.sst", Size: 10, CRC32C: 7, Path: storedPath(2, "000001.sst", 10, 7)}},
		}},
	}
}

// TestManifestRoundTrip: a manifest reads back as written, and a change to
// any byte of its body is found by its checksum.
func TestManifestRoundTrip(t *testing.T) {
	m := sampleManifest()
	b, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := encodeManifest(got)
	if !bytes.Equal(b, again) {
		t.Fatalf("round trip changed the manifest:\n%s\n%s", b, again)
	}
	bad := bytes.Replace(b, []byte(`"applied_index": 10`), []byte(`"applied_index": 11`), 1)
	if bytes.Equal(bad, b) {
		t.Fatal("test did not change the manifest")
	}
	if _, err := DecodeManifest(bad); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("a changed manifest: %v", err)
	}
}

// TestParseStored: stored names read back to their file, and nothing else
// is taken for one.
func TestParseStored(t *testing.T) {
	for _, name := range []string{"000001.sst", "MANIFEST-000004", "CURRENT", "a.b.c"} {
		p := storedPath(7, name, 12345, 0xdeadbeef)
		f, ok := parseStored(p, "files/shard-7/")
		if !ok || f.GetName() != name || f.GetSize() != 12345 || f.GetCrc32C() != 0xdeadbeef {
			t.Fatalf("%s: %v %v", p, f, ok)
		}
	}
	for _, p := range []string{"files/shard-7/x", "files/shard-7/.tmp-123", "files/shard-7/a.12.zzzzzzzz", "files/shard-8/a.1.00000001", "files/shard-7/a.01.00000001"} {
		if f, ok := parseStored(p, "files/shard-7/"); ok {
			t.Fatalf("%s taken for %v", p, f)
		}
	}
}

func part(id uint64, start, end string) *Part {
	return &Part{ShardID: id, Start: []byte(start), End: []byte(end)}
}

// TestCoverKeySpace: the parts kept cover the user key space once; a part
// inside another's range (a split or merge during the backup) is left out;
// a gap or partial overlap is an error.
func TestCoverKeySpace(t *testing.T) {
	sys := &Part{ShardID: 1, System: true}
	ids := func(ps []Part) []uint64 {
		var out []uint64
		for _, p := range ps {
			out = append(out, p.ShardID)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		parts []*Part
		want  []uint64
		err   string
	}{
		{"two shards", []*Part{sys, part(3, "m", ""), part(2, "", "m")}, []uint64{1, 2, 3}, ""},
		{"split after the left copy", []*Part{sys, part(2, "", ""), part(3, "m", "")}, []uint64{1, 2}, ""},
		{"merged after the right copy", []*Part{sys, part(2, "", ""), part(3, "m", "")}, []uint64{1, 2}, ""},
		{"split before the left copy", []*Part{sys, part(2, "", "m")}, nil, `from "m" on`},
		{"a gap", []*Part{sys, part(2, "", "f"), part(3, "m", "")}, nil, `from "f" to "m"`},
		{"partial overlap", []*Part{sys, part(2, "", "p"), part(3, "m", "")}, nil, "overlap"},
		{"no system shard", []*Part{part(2, "", "")}, nil, "system shard"},
	} {
		m := map[uint64]*Part{}
		for _, p := range tc.parts {
			m[p.ShardID] = p
		}
		got, err := coverKeySpace(m)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, ids(got), err, tc.want)
			continue
		}
		for i := range got {
			if got[i].ShardID != tc.want[i] {
				t.Errorf("%s: %v, want %v", tc.name, ids(got), tc.want)
			}
		}
	}
}

// FuzzDecodeManifest: any input decodes to a manifest or an error, never a
// panic; what decodes encodes and decodes again the same.
func FuzzDecodeManifest(f *testing.F) {
	b, _ := encodeManifest(sampleManifest())
	f.Add(b)
	f.Add([]byte(`{"body":{},"crc32c":0}`))
	f.Add([]byte(`{"body":null}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := DecodeManifest(in)
		if err != nil {
			return
		}
		out, err := encodeManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeManifest(out); err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v", err)
		}
	})
}

// FuzzReadFrames: any bytes read as log segment frames give entries or an
// error, never a panic; frames written read back as written.
func FuzzReadFrames(f *testing.F) {
	var seed []byte
	for i := uint64(1); i <= 3; i++ {
		seed, _ = appendFrame(seed, &shalev1.BackupLogEntry{Index: i, Revision: i, Ops: []*shalev1.BackupLogOp{{Kind: 1, Key: []byte("dk"), Value: []byte("v")}}})
	}
	f.Add(seed)
	f.Add([]byte{0x05, 1, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		var got []*shalev1.BackupLogEntry
		err := readFrames(bufio.NewReader(bytes.NewReader(in)), func(e *shalev1.BackupLogEntry) error {
			got = append(got, e)
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		var again []byte
		for _, e := range got {
			if again, err = appendFrame(again, e); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		if err := readFrames(bufio.NewReader(bytes.NewReader(again)), func(e *shalev1.BackupLogEntry) error {
			if !proto.Equal(e, got[n]) {
				t.Fatalf("entry %d read back as %v, written %v", n, e, got[n])
			}
			n++
			return nil
		}); err != nil || n != len(got) {
			t.Fatalf("re-encoded frames: %d of %d, %v", n, len(got), err)
		}
	})
}

// TestReadFramesEntriesOutliveTheirFrame: the entries readFrames hands
// out stay intact after later frames are read (frames share one read
// buffer).
func TestReadFramesEntriesOutliveTheirFrame(t *testing.T) {
	var in []byte
	for i := uint64(1); i <= 4; i++ {
		var err error
		in, err = appendFrame(in, &shalev1.BackupLogEntry{Index: i, Ops: []*shalev1.BackupLogOp{{Kind: 1, Key: fmt.Appendf(nil, "key-%d", i), Value: bytes.Repeat([]byte{byte(i)}, int(100*i))}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	var got []*shalev1.BackupLogEntry
	if err := readFrames(bufio.NewReader(bytes.NewReader(in)), func(e *shalev1.BackupLogEntry) error {
		got = append(got, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d entries, want 4", len(got))
	}
	for i, e := range got {
		n := uint64(i + 1)
		op := e.GetOps()[0]
		if e.GetIndex() != n || string(op.GetKey()) != fmt.Sprintf("key-%d", n) || !bytes.Equal(op.GetValue(), bytes.Repeat([]byte{byte(n)}, int(100*n))) {
			t.Fatalf("entry %d changed after later frames were read: index %d, key %q, %d-byte value", n, e.GetIndex(), op.GetKey(), len(op.GetValue()))
		}
	}
}
