package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSnapshotSentTook(t *testing.T) {
	log := filepath.Join(t.TempDir(), "server.log")
	lines := []string{
		`time=2026-11-28T05:19:01.000Z level=INFO msg="snapshot sent" node=2 component=replication shard=1 to_node=4 index=20 took=15ms`,
		`time=2026-11-28T05:19:02.000Z level=WARN msg="snapshot send failed" node=2 component=replication shard=2 to_node=4 err="rpc error"`,
		`time=2026-11-28T05:19:03.000Z level=INFO msg="snapshot sent" node=2 component=replication shard=2 to_node=5 index=16396 took=9s`,
		`time=2026-11-28T05:19:09.646Z level=INFO msg="snapshot sent" node=2 component=replication shard=2 to_node=4 index=16396 took=6.7214795s`,
		`time=2026-11-28T05:19:10.000Z level=INFO msg="snapshot sent" node=2 component=replication shard=20 to_node=4 index=1 took=1s`,
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	took, attempts, err := snapshotSentTook(log, 2, 4)
	if err != nil || took != 6721479500*time.Nanosecond || attempts != 2 {
		t.Fatalf("took %v, attempts %d, err %v; want 6.7214795s, 2, nil", took, attempts, err)
	}
	if _, _, err := snapshotSentTook(log, 3, 4); err == nil {
		t.Fatal("no error for a shard with no snapshot")
	}
}
