package server

import (
	"os"
	"path/filepath"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// FuzzScanToken feeds arbitrary continuation tokens (client input) to the
// scan planner: it must accept only tokens it could have issued for the
// range, and never panic.
func FuzzScanToken(f *testing.F) {
	n := &Node{cfg: Config{}}
	n.cfg.applyDefaults()
	f.Add([]byte("a"), []byte("z"), false, encodeToken([]byte("m"), 3))
	f.Add([]byte(""), []byte(""), true, []byte{0xff, 0x01})
	f.Fuzz(func(t *testing.T, start, end []byte, reverse bool, token []byte) {
		p, err := n.planScan(&shalev1.ScanRequest{StartKey: start, EndKey: end, Reverse: reverse, ContinuationToken: token})
		if err != nil {
			return
		}
		if len(token) > 0 && len(p.end) > 0 && string(p.start) > string(p.end) {
			t.Fatalf("token produced an inverted range [%q, %q)", p.start, p.end)
		}
	})
}

// FuzzReadMeta feeds arbitrary bytes as the node identity file: reading it
// must fail cleanly or yield a valid identity, never panic.
func FuzzReadMeta(f *testing.F) {
	dir := f.TempDir()
	if err := writeMeta(dir, nodeMeta{NodeID: 1, ClusterID: "c", Addrs: map[string]string{"1": "a:1"}}); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, "NODE"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("{}\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "NODE"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, found, err := readMeta(d)
		if err == nil && found && (m.NodeID == 0 || m.ClusterID == "") {
			t.Fatalf("accepted an identity without node or cluster ID: %+v", m)
		}
	})
}
