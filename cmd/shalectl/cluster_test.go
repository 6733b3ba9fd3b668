package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// args prefixes a cluster command with fc's endpoints.
func (fc *fakeCluster) args(args ...string) []string {
	return append([]string{"--endpoints", fc.endpoints(), "--timeout", "5s"}, args...)
}

func TestClusterKV(t *testing.T) {
	t.Parallel()
	fc := newFakeCluster(t)

	// put and get on both shards (the second is led by the other node).
	contains(t, "put", ok(t, fc.args("kv", "put", "apple", "red")...), "OK (revision 1)")
	contains(t, "put", ok(t, fc.args("kv", "put", "zebra", "striped", "--ttl", "1h")...), "OK (revision 2)")
	if out := ok(t, fc.args("kv", "get", "apple")...); out != "red\n" {
		t.Errorf("get apple = %q", out)
	}
	if out := ok(t, fc.args("kv", "get", "zebra", "--consistency", "stale")...); out != "striped\n" {
		t.Errorf("get zebra = %q", out)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(ok(t, fc.args("kv", "get", "zebra", "-o", "json")...)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["key"] != "zebra" || rec["value"] != "striped" || rec["version"] != 1.0 || rec["expire_at"] == nil {
		t.Errorf("get -o json = %v", rec)
	}

	// put --prev shows the previous value.
	out := ok(t, fc.args("kv", "put", "apple", "green", "--prev")...)
	contains(t, "put --prev", out, "OK (revision 3)", "previous: red")
	contains(t, "put --prev new key", ok(t, fc.args("kv", "put", "banana", "yellow", "--prev")...), "previous: (none)")

	// Not found: exit status 1 and "key not found".
	stderr := fails(t, fc.args("kv", "get", "nope")...)
	contains(t, "get missing", stderr, "shalectl: key not found: nope")

	// del.
	contains(t, "del", ok(t, fc.args("kv", "del", "banana", "--prev")...), "deleted 1 key", "previous: yellow")
	contains(t, "del again", ok(t, fc.args("kv", "del", "banana")...), "deleted 0 keys")
	fails(t, fc.args("kv", "get", "banana")...)

	// Binary keys and values: --hex input, quoted or hex output.
	ok(t, fc.args("kv", "--hex", "put", "0x6b00ff", "0x010203")...)
	if out := ok(t, fc.args("kv", "--hex", "get", "6b00ff")...); out != "0x010203\n" {
		t.Errorf("hex get = %q", out)
	}
	if out := ok(t, fc.args("kv", "get", "k\x00\xff")...); out != `"\x01\x02\x03"`+"\n" {
		t.Errorf("binary value printed as %q", out)
	}
	ok(t, fc.args("kv", "put", "naïve", "café")...)
	if out := ok(t, fc.args("kv", "get", "naïve")...); out != "café\n" {
		t.Errorf("UTF-8 value printed as %q", out)
	}
	contains(t, "bad hex", fails(t, fc.args("kv", "--hex", "get", "zz")...), "invalid hex")

	// cas.
	contains(t, "cas", ok(t, fc.args("kv", "cas", "apple", "green", "blue")...), "OK")
	contains(t, "cas fails", fails(t, fc.args("kv", "cas", "apple", "green", "pink")...), "compare failed", "blue")
	contains(t, "cas absent", ok(t, fc.args("kv", "cas", "--expect-absent", "lock", "me", "--ttl", "30s")...), "OK")
	contains(t, "cas absent fails", fails(t, fc.args("kv", "cas", "--expect-absent", "lock", "you")...), "compare failed", "exists")
	contains(t, "cas missing", fails(t, fc.args("kv", "cas", "ghost", "a", "b")...), "does not exist")
	var cas map[string]any
	r := shalectl(t, fc.args("kv", "cas", "apple", "x", "y", "-o", "json")...)
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &cas) != nil || cas["succeeded"] != false {
		t.Errorf("cas -o json failure: %+v", r)
	}
	contains(t, "cas arity", fails(t, fc.args("kv", "cas", "--expect-absent", "a", "b", "c")...), "takes 2 argument(s)")

	// Values from stdin and files, and to a file: larger than the 128 KiB
	// a single command-line argument may be, and binary.
	big := strings.Repeat("0123456789abcdef", 300<<10/16) + "\x00\xff\n"
	okIn(t, big, fc.args("kv", "put", "big", "-")...)
	dir := t.TempDir()
	ok(t, fc.args("kv", "get", "big", "--output-file", filepath.Join(dir, "got"))...)
	if got, err := os.ReadFile(filepath.Join(dir, "got")); err != nil || string(got) != big {
		t.Errorf("kv get --output-file wrote %d bytes (err %v), want the %d put from stdin", len(got), err, len(big))
	}
	if err := os.WriteFile(filepath.Join(dir, "in"), []byte(big+"2"), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, fc.args("kv", "--hex", "put", "0x62696732", "--value-file", filepath.Join(dir, "in"))...)
	if out := ok(t, fc.args("kv", "get", "big2", "--output-file", "-")...); out != big+"2" {
		t.Errorf("kv get --output-file - printed %d bytes, want the %d of --value-file", len(out), len(big)+1)
	}
	var noValue map[string]any
	if err := json.Unmarshal([]byte(ok(t, fc.args("kv", "get", "big2", "--output-file", filepath.Join(dir, "got"), "-o", "json")...)), &noValue); err != nil {
		t.Fatal(err)
	}
	if _, has := noValue["value"]; noValue["key"] != "big2" || has {
		t.Errorf("get --output-file -o json = %v, want the record without its value", noValue)
	}
	contains(t, "value-file and VALUE", fails(t, fc.args("kv", "put", "k", "v", "--value-file", filepath.Join(dir, "in"))...), "--value-file takes 1 argument")
	contains(t, "missing value-file", fails(t, fc.args("kv", "put", "k", "--value-file", filepath.Join(dir, "nope"))...), "--value-file", "no such file")
	contains(t, "no VALUE", fails(t, fc.args("kv", "put", "k")...), "takes 2 argument(s), KEY VALUE")

	// Usage errors.
	contains(t, "bad ttl", fails(t, fc.args("kv", "put", "a", "b", "--ttl", "-1s")...), "--ttl")
	contains(t, "bad consistency", fails(t, fc.args("kv", "get", "a", "--consistency", "eventual")...), "--consistency")
	contains(t, "get arity", fails(t, fc.args("kv", "get")...), "takes 1 argument(s), KEY")
}

func TestClusterScan(t *testing.T) {
	t.Parallel()
	fc := newFakeCluster(t)
	keys := []string{"a1", "a2", "b1", "k9", "m0", "m1", "n5", "x", "y"}
	for _, k := range keys {
		ok(t, fc.args("kv", "put", k, "v-"+k)...)
	}
	ok(t, fc.args("kv", "put", "long", strings.Repeat("z", 100))...)
	keys = append(keys, "long")
	slices.Sort(keys)

	scanKeys := func(args ...string) []string {
		t.Helper()
		out := ok(t, fc.args(append([]string{"kv", "scan"}, args...)...)...)
		var got []string
		for i, l := range lines(out) {
			f := strings.Fields(l)
			if i == 0 {
				if f[0] != "KEY" {
					t.Fatalf("no header in:\n%s", out)
				}
				continue
			}
			got = append(got, f[0])
		}
		return got
	}
	rev := func(s []string) []string { s = slices.Clone(s); slices.Reverse(s); return s }
	check := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", what, got, want)
		}
	}
	check("all", scanKeys(), keys)
	check("all reverse", scanKeys("--reverse"), rev(keys))
	check("range", scanKeys("b", "n"), []string{"b1", "k9", "long", "m0", "m1"})
	check("from", scanKeys("m1"), []string{"m1", "n5", "x", "y"})
	check("range reverse", scanKeys("b", "n", "--reverse"), rev([]string{"b1", "k9", "long", "m0", "m1"}))
	check("prefix", scanKeys("--prefix", "m"), []string{"m0", "m1"})
	check("limit", scanKeys("--limit", "4"), keys[:4])
	check("limit reverse paged", scanKeys("--limit", "3", "--reverse", "--page-size", "1"), rev(keys)[:3])
	check("keys-only", scanKeys("--keys-only", "--prefix", "a"), []string{"a1", "a2"})

	out := ok(t, fc.args("kv", "scan", "--prefix", "a")...)
	if !regexp.MustCompile(`(?m)^KEY\s+VALUE\n^a1\s+v-a1\n^a2\s+v-a2\n`).MatchString(out) {
		t.Errorf("table:\n%s", out)
	}
	contains(t, "truncated", ok(t, fc.args("kv", "scan", "--prefix", "lo")...), "...(100 bytes)")
	contains(t, "full", ok(t, fc.args("kv", "scan", "--prefix", "lo", "--full-values")...), strings.Repeat("z", 100)+"\n")
	if out := ok(t, fc.args("kv", "scan", "q", "r")...); out != "" {
		t.Errorf("empty scan printed %q", out)
	}
	contains(t, "inverted", fails(t, fc.args("kv", "scan", "z", "a")...), "invalid argument", "start must be before end")

	// JSON Lines.
	out = ok(t, fc.args("kv", "scan", "--prefix", "m", "-o", "json")...)
	ls := lines(out)
	if len(ls) != 2 {
		t.Fatalf("json lines:\n%s", out)
	}
	var rec struct {
		Key, Value  string
		ModRevision uint64 `json:"mod_revision"`
	}
	if err := json.Unmarshal([]byte(ls[1]), &rec); err != nil || rec.Key != "m1" || rec.Value != "v-m1" || rec.ModRevision == 0 {
		t.Errorf("json line %q: %+v %v", ls[1], rec, err)
	}
	out = ok(t, fc.args("kv", "scan", "--prefix", "m", "--keys-only", "-o", "json")...)
	if strings.Contains(out, "value") {
		t.Errorf("keys-only json has values:\n%s", out)
	}
	contains(t, "prefix and range", fails(t, fc.args("kv", "scan", "a", "--prefix", "m")...), "--prefix cannot be combined")
	contains(t, "too many args", fails(t, fc.args("kv", "scan", "a", "b", "c")...), "at most 2 argument(s)")
}

func TestClusterAdmin(t *testing.T) {
	t.Parallel()
	fc := newFakeCluster(t)

	out := ok(t, fc.args("cluster", "status")...)
	contains(t, "cluster status", out, "cluster: test-cluster", "nodes: 2 (2 live)", "shards: 2",
		"zone-a", "1.5K", "3.0M", "(min)", "(max)", "1*,2", "1,2*")
	if !regexp.MustCompile(`(?m)^ID\s+ADDRESS\s+ZONE\s+LIVE\s+REPLICAS\s+LEADERS\s+USED\s+LAST SEEN$`).MatchString(out) {
		t.Errorf("node table header:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^1\s+\(min\)\s+m\s+3\s+1\s+1\*,2\s+3\.0M\s+41$`).MatchString(out) {
		t.Errorf("shard row:\n%s", out)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(ok(t, fc.args("cluster", "status", "-o", "json")...)), &st); err != nil {
		t.Fatal(err)
	}
	if st["cluster_id"] != "test-cluster" || len(st["nodes"].([]any)) != 2 || len(st["shards"].([]any)) != 2 {
		t.Errorf("cluster status json: %v", st)
	}

	out = ok(t, fc.args("shard", "list")...)
	if !regexp.MustCompile(`(?m)^2\s+m\s+\(max\)\s+1\s+2\s+1,2\*\s+3\.0M\s+41$`).MatchString(out) {
		t.Errorf("shard list:\n%s", out)
	}
	contains(t, "shard list --hex", ok(t, fc.args("shard", "list", "--hex")...), "0x6d")
	var sl struct {
		Shards []struct {
			Descriptor struct {
				ShardID string `json:"shard_id"`
			} `json:"descriptor"`
		} `json:"shards"`
	}
	if err := json.Unmarshal([]byte(ok(t, fc.args("shard", "list", "-o", "json")...)), &sl); err != nil || len(sl.Shards) != 2 || sl.Shards[1].Descriptor.ShardID != "2" {
		t.Errorf("shard list json: %+v %v", sl, err)
	}

	out = ok(t, fc.args("shard", "checksum", "1")...)
	if !regexp.MustCompile(`(?m)^1\s+41\s+0000000000000abc\n2\s+41\s+0000000000000abc$`).MatchString(out) {
		t.Errorf("shard checksum:\n%s", out)
	}
	fc.mu.Lock()
	fc.checksums = map[uint64]uint64{2: 0xdef}
	fc.mu.Unlock()
	contains(t, "shard checksum conflict", fails(t, fc.args("shard", "checksum", "1")...),
		"replicas disagree: nodes 1 and 2 at index 41: 0000000000000abc != 0000000000000def")
	fc.mu.Lock()
	fc.checksums = nil
	fc.mu.Unlock()

	out = ok(t, fc.args("shard", "info", "1")...)
	contains(t, "shard info", out, "range:", "[(min), m)", "epoch:", "applied index:", "41", "replicas:", "voter")
	if !regexp.MustCompile(`(?m)^\s+1\s+1\s+voter\s+42\s+\*$`).MatchString(out) {
		t.Errorf("replica row:\n%s", out)
	}
	if strings.Contains(out, "quiesced:") || strings.Contains(out, "stopped:") {
		t.Errorf("a serving, ticking replica shows quiesced or stopped:\n%s", out)
	}
	fc.mu.Lock()
	fc.shards[0].quiesced, fc.shards[0].stopped = true, "replication: shard 1 halted: boom"
	fc.mu.Unlock()
	contains(t, "shard info of a halted replica", ok(t, fc.args("shard", "info", "1")...),
		"quiesced:", "yes (idle, not ticking)", "stopped:", "replication: shard 1 halted: boom")
	fc.mu.Lock()
	fc.shards[0].quiesced, fc.shards[0].stopped = false, ""
	fc.mu.Unlock()
	contains(t, "shard info missing", fails(t, fc.args("shard", "info", "9")...), "shard 9 not found")
	contains(t, "shard info bad id", fails(t, fc.args("shard", "info", "x")...), "ID must be a positive integer")

	out = ok(t, fc.args("node", "list")...)
	if !regexp.MustCompile(`(?m)^2\s+127\.0\.0\.1:\d+\s+zone-b\s+yes\s+2\s+1\s+1\.5K\s+\d+s ago$`).MatchString(out) {
		t.Errorf("node list:\n%s", out)
	}
	contains(t, "node add", ok(t, fc.args("node", "add", "10.0.0.3:7001", "--zone", "zone-c")...),
		"added node 3 (10.0.0.3:7001, zone zone-c) to cluster test-cluster (3 nodes)")
	var added map[string]any
	if err := json.Unmarshal([]byte(ok(t, fc.args("node", "add", "10.0.0.4:7001", "-o", "json")...)), &added); err != nil ||
		added["node"].(map[string]any)["node_id"] != "4" {
		t.Errorf("node add json: %v %v", added, err)
	}
	contains(t, "node remove", ok(t, fc.args("node", "remove", "3")...), "node 3: removal accepted")
	contains(t, "node list after remove", ok(t, fc.args("node", "list")...), "removed")
	contains(t, "node remove missing", fails(t, fc.args("node", "remove", "99")...), "not found")

	contains(t, "leader transfer", ok(t, fc.args("leader", "transfer", "1", "2")...), "shard 1: leader is now node 2")
	contains(t, "after transfer", ok(t, fc.args("shard", "list")...), "1,2*")
	// The KV commands follow the new leader.
	ok(t, fc.args("kv", "put", "a", "b")...)
	contains(t, "leader transfer json", ok(t, fc.args("leader", "transfer", "1", "1", "-o", "json")...), `"leader_node_id": 1`)
	contains(t, "leader transfer bad", fails(t, fc.args("leader", "transfer", "1", "7")...), "no replica")
}

func TestClusterConnectionErrors(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	stderr := fails(t, "--endpoints", addr, "--timeout", "300ms", "kv", "get", "a")
	contains(t, "unreachable", stderr, "connect to "+addr, "unavailable")
	contains(t, "empty endpoints", fails(t, "--endpoints", " , ", "node", "list"), "--endpoints is empty")
	contains(t, "no port", fails(t, "--endpoints", "127.0.0.1", "kv", "get", "a"), `endpoint "127.0.0.1" has no port`, "127.0.0.1:7001")

	// Refused everywhere: fails in about a second, not at the 10 s
	// default timeout.
	start := time.Now()
	contains(t, "refused", fails(t, "--endpoints", addr, "kv", "get", "a"), "no node reachable at "+addr+": connection refused")
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("a refused connection took %v to fail", took)
	}
}

// TestEndpointsFromEnv checks that SHALE_ENDPOINTS sets the default of
// --endpoints (read when the root command is built). Not parallel: it sets
// the environment.
func TestEndpointsFromEnv(t *testing.T) {
	fc := newFakeCluster(t)
	t.Setenv(endpointsEnv, fc.endpoints())
	contains(t, "env endpoints", ok(t, "node", "list"), "zone-a")
	contains(t, "help shows it", ok(t, "--help"), fc.endpoints())
}
