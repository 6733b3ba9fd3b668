package cluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// pprofMemCluster is the in-memory cluster with members that serve
// /debug/pprof/profile (fakes answering "node <i>").
type pprofMemCluster struct {
	*memCluster
	addrs []string
}

func (c *pprofMemCluster) PprofAddrs() []string { return c.addrs }

var registerPprofMem sync.Once

// TestProfileDir: with ProfileDir every cell writes this process's CPU
// profile of its timed phase and fetches each member's over the phase.
func TestProfileDir(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	var addrs []string
	for i := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			asked = append(asked, r.URL.Path+"?"+r.URL.RawQuery)
			mu.Unlock()
			_, _ = w.Write([]byte{byte('1' + i)})
		}))
		t.Cleanup(srv.Close)
		addrs = append(addrs, srv.Listener.Addr().String())
	}
	registerPprofMem.Do(func() {
		Register("mem-pprof-test", func(context.Context, ClusterConfig) (Cluster, error) {
			return &pprofMemCluster{memCluster: &memCluster{data: map[string][]byte{}}, addrs: addrs}, nil
		})
	})
	dir := filepath.Join(t.TempDir(), "profiles")
	cfg := Config{
		Engines:    []string{"mem-pprof-test"},
		Workloads:  []string{"put"},
		Clients:    []int{2},
		Duration:   100 * time.Millisecond,
		Keys:       100,
		Dir:        t.TempDir(),
		Seed:       1,
		ProfileDir: dir,
	}
	results := Run(context.Background(), cfg, nil)
	if len(results) != 1 || results[0].Err != nil || len(results[0].Notes) != 0 {
		t.Fatalf("results %+v", results)
	}
	client, err := os.ReadFile(filepath.Join(dir, "put.mem-pprof-test.2.client.pprof"))
	if err != nil || len(client) == 0 {
		t.Fatalf("client profile: %d bytes, %v", len(client), err)
	}
	for i, want := range []string{"1", "2"} {
		got, err := os.ReadFile(filepath.Join(dir, "put.mem-pprof-test.2.node"+want+".pprof"))
		if err != nil || string(got) != want {
			t.Fatalf("member %d's profile: %q, %v", i+1, got, err)
		}
	}
	for _, a := range asked {
		if a != "/debug/pprof/profile?seconds=1" {
			t.Fatalf("members asked for %v", asked)
		}
	}
	if len(asked) != 2 {
		t.Fatalf("members asked for %v", asked)
	}
}
