package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
	"github.com/shale-db/shale/server"
)

// TestRestore: restore stages the parts a founding node hosts in its new
// data directory (JSON and text output; the placement from the flags or
// from $SHALE_NODE_ID and $SHALE_INITIAL_CLUSTER), refuses a data
// directory that is not empty, a node not among the founding nodes and a
// time the backup does not reach (leaving nothing behind), finishes a
// restore that did not finish, and a founding node started on the
// prepared directory founds its cluster from the backup, with every
// backed-up key.
func TestRestore(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Splits: [][]byte{[]byte("b/m")}})
	eps := strings.Join(c.Endpoints(), ",")
	loc := filepath.Join(t.TempDir(), "backups")
	want := map[string]string{}
	for i := 0; i < 20; i++ {
		k, v := fmt.Sprintf("b/%c%02d", "az"[i%2], i), fmt.Sprintf("v%02d", i)
		ok(t, "--endpoints", eps, "--timeout", "20s", "kv", "put", k, v)
		want[k] = v
	}
	var b backupCreateRecord
	if err := json.Unmarshal([]byte(ok(t, "--endpoints", eps, "--timeout", "20s", "backup", "create", "--location", loc, "--id", "b1", "-o", "json")), &b); err != nil {
		t.Fatal(err)
	}
	// restore does not contact the cluster: point it at a port nothing
	// listens on.
	restore := func(a ...string) []string {
		return append([]string{"--endpoints", "127.0.0.1:1", "--timeout", "1s", "restore"}, a...)
	}
	// One founding node: it hosts every user shard.
	single := []string{"--node-id", "1", "--initial-cluster", "1=127.0.0.1:7001"}

	// JSON: what was staged, and the record the server acts on.
	d1 := filepath.Join(t.TempDir(), "node1")
	var rec restoreRecord
	r := shalectl(t, restore(append([]string{"b1", "--location", loc, "--data-dir", d1, "-o", "json"}, single...)...)...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("restore -o json: exit %d, stderr (no progress with -o json):\n%s", r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil {
		t.Fatal(err)
	}
	files, bytes, users := 0, int64(0), 0
	for _, p := range b.Manifest.Shards {
		if !p.System {
			files += len(p.Files) + len(p.Log)
			bytes += int64(p.Bytes())
			users++
		}
	}
	if rec.ID != "b1" || rec.ClusterID != b.Manifest.ClusterID || rec.ClusterID == "" || rec.DataDir != d1 || rec.AsOf != nil ||
		rec.NodeID != 1 || fmt.Sprint(rec.Nodes) != "[1]" || rec.ReplicationFactor != 3 || rec.Shards != b.Shards || rec.ShardsHosted != users ||
		rec.Files != files || rec.Bytes != bytes || rec.Bytes == 0 || rec.FilesReused != 0 {
		t.Fatalf("restore -o json: %+v\n%s", rec, r.stdout)
	}
	if !strings.Contains(r.stdout, `"as_of": null`) {
		t.Errorf("restore -o json without --as-of: no \"as_of\": null in\n%s", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(d1, "restore", "restore.json")); err != nil {
		t.Fatalf("restore left no record of the prepared restore: %v", err)
	}

	// Again on the same directory: refused, and the staged copy kept; so
	// is any other directory that is not empty.
	contains(t, "restore into a prepared directory", fails(t, restore(append([]string{"b1", "--location", loc, "--data-dir", d1}, single...)...)...),
		"restore: ", d1, "already holds a prepared restore of backup b1", "start shale-server on it")
	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "NODE"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	contains(t, "restore into a used directory", fails(t, restore(append([]string{"b1", "--location", loc, "--data-dir", used}, single...)...)...),
		"restore: ", used, "is not empty")
	if _, err := os.Stat(filepath.Join(used, "NODE")); err != nil {
		t.Fatalf("a refused restore touched %s: %v", used, err)
	}
	if _, err := os.Stat(filepath.Join(d1, "restore", "restore.json")); err != nil {
		t.Fatalf("a refused restore removed the prepared one: %v", err)
	}

	// Usage errors, a node not among the founding nodes, and a time the
	// backup does not reach.
	contains(t, "no --data-dir", fails(t, restore(append([]string{"b1", "--location", loc}, single...)...)...), "needs --data-dir DIR", "--help")
	contains(t, "no --location", fails(t, restore(append([]string{"b1", "--data-dir", t.TempDir()}, single...)...)...), "needs --location LOC", "--help")
	contains(t, "no ID", fails(t, restore("--location", loc, "--data-dir", t.TempDir())...), "takes 1 argument(s), ID")
	contains(t, "bad ID", fails(t, restore("../x", "--location", loc, "--data-dir", t.TempDir())...), "ID: ")
	contains(t, "bad --as-of", fails(t, restore("b1", "--location", loc, "--data-dir", t.TempDir(), "--as-of", "yesterday")...),
		"--as-of: want an RFC 3339 time", "--help")
	contains(t, "no --node-id", fails(t, restore("b1", "--location", loc, "--data-dir", t.TempDir(), "--initial-cluster", "1=a:1")...),
		"needs --node-id N (or $SHALE_NODE_ID)", "--help")
	contains(t, "no --initial-cluster", fails(t, restore("b1", "--location", loc, "--data-dir", t.TempDir(), "--node-id", "1")...),
		"needs --initial-cluster ID=ADDR,... (or $SHALE_INITIAL_CLUSTER)", "--help")
	contains(t, "bad --initial-cluster", fails(t, restore("b1", "--location", loc, "--data-dir", t.TempDir(), "--node-id", "1", "--initial-cluster", "1")...),
		"--initial-cluster: initial cluster entry", "--help")
	contains(t, "unknown backup", fails(t, restore(append([]string{"nope", "--location", loc, "--data-dir", t.TempDir()}, single...)...)...), "restore: ", "no backup nope")
	d2 := filepath.Join(t.TempDir(), "node2")
	contains(t, "a node not in the cluster", fails(t, restore("b1", "--location", loc, "--data-dir", d2, "--node-id", "4", "--initial-cluster", "1=a:1,2=b:1,3=c:1")...),
		"restore: ", "node 4 is not one of the founding nodes [1 2 3]")
	future := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	contains(t, "--as-of after the backup", fails(t, restore(append([]string{"b1", "--location", loc, "--data-dir", d2, "--as-of", future}, single...)...)...),
		"restore: ", "only until")
	if _, err := os.Stat(d2); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused restore left %s behind: %v", d2, err)
	}

	// A restore that did not finish (its record gone): run again, it
	// keeps what was staged and finishes. The placement comes from the
	// environment, as shale-server's does.
	d4 := filepath.Join(t.TempDir(), "node4")
	ok(t, restore(append([]string{"b1", "--location", loc, "--data-dir", d4}, single...)...)...)
	if err := os.Remove(filepath.Join(d4, "restore", "restore.json")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SHALE_NODE_ID", "1")
	t.Setenv("SHALE_INITIAL_CLUSTER", "1=127.0.0.1:7001")
	contains(t, "restore again", ok(t, restore("b1", "--location", loc, "--data-dir", d4)...),
		fmt.Sprintf("%d staged, every checksum matches (%d of them by an earlier restore that did not finish)", files, files))

	// Text: the summary and the next step (the progress line is for
	// terminals only).
	d3 := filepath.Join(t.TempDir(), "node3")
	out := ok(t, restore("b1", "--location", loc, "--data-dir", d3)...)
	contains(t, "restore", out, "prepared:", "backup b1", filepath.Join(d3, "restore"), b.Manifest.ClusterID,
		"node:", "1 of the founding nodes 1, 3 replicas per shard", fmt.Sprintf("this node hosts %d of the %d user shards", users, users),
		"shards:", "every checksum matches", "everything the backup holds",
		"shale-server --data-dir "+d3+" --node-id 1 --listen ADDR --initial-cluster 1=127.0.0.1:7001 --replication-factor 3")

	// A founding node started on the prepared directory founds its
	// cluster from the backup, and removes the staged copy.
	restored := testcluster.Start(t, testcluster.Options{Nodes: 1, Configure: func(cfg *server.Config) { cfg.DataDir = d1 }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(d1, "restore")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the node kept the staged copy %s after founding: %v", filepath.Join(d1, "restore"), err)
	}
	cl, err := client.New(ctx, restored.Endpoints(), client.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]string{}
	it := cl.Scan(ctx, nil, nil)
	for it.Next() {
		got[string(it.KV().Key)] = string(it.KV().Value)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	it.Close()
	if len(got) != len(want) {
		t.Fatalf("the restored cluster holds %d keys, the backup %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("key %s restored as %q, backed up as %q", k, got[k], v)
		}
	}
	st, err := cl.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetClusterId() == "" || st.GetClusterId() == b.Manifest.ClusterID {
		t.Errorf("the restored cluster's ID is %q (the backed-up one's %q)", st.GetClusterId(), b.Manifest.ClusterID)
	}
}
