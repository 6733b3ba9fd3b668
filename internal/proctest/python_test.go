//go:build unix

package proctest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// python is the interpreter whose packages scripts/python-deps.sh installs
// (Debian's python3-grpcio and python3-protobuf).
const python = "/usr/bin/python3"

// requirePython skips t when Debian's Python and its gRPC packages are
// missing (`make python-deps` installs them), or fails it when $CI is set:
// CI must run it.
func requirePython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("%s with grpc and protobuf is needed (make python-deps): %v\n%s", python, err, out)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestPythonErrorDetailsExample runs examples/python/error_details.py, the
// Python example of docs/api.md, against a 3-process cluster: the nodes
// that do not lead the key's shard answer NotLeader naming the leader, the
// leader applies the put, and an unknown shard is ShardNotFound, each read
// from the grpc-status-details-bin trailer with the generated stubs of
// clients/python. docs/api.md shows the file as it is.
func TestPythonErrorDetailsExample(t *testing.T) {
	bins := requireBinaries(t)
	requirePython(t)
	script := filepath.Join(bins.root, "examples", "python", "error_details.py")
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(bins.root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```python\n"+string(src)+"```\n") {
		t.Fatalf("docs/api.md does not show %s as it is", script)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startProcCluster(t, bins, 3, splitKeys)
	readyClient(ctx, t, c, 3) // waits until every shard has a leader
	cmd := exec.CommandContext(ctx, python, append([]string{script}, c.endpoints()...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(bins.root, "clients", "python"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	t.Logf("output:\n%s", out)
	text := string(out)
	if n := strings.Count(text, ": OK\n"); n != 1 {
		t.Errorf("%d puts applied, want 1 (by the leader)", n)
	}
	notLeader := regexp.MustCompile(`(?m)^put via \S+: FAILED_PRECONDITION: .*\n  NotLeader \{shard_id: \d+ leader_node_id: (\d) leader_address: "127\.0\.0\.1:\d+"\}$`)
	m := notLeader.FindAllStringSubmatch(text, -1)
	if len(m) != 2 || m[0][1] != m[1][1] {
		t.Errorf("want two NotLeader details naming the same leader, got %v", m)
	}
	if !regexp.MustCompile(`(?m)^get of shard 999999 via \S+: NOT_FOUND: .*\n  ShardNotFound \{shard_id: 999999 node_id: 1\}$`).MatchString(text) {
		t.Errorf("no ShardNotFound detail for shard 999999 from node 1")
	}
}
