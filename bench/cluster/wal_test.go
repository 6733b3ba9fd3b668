package cluster

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const exposition = `# HELP shale_storage_wal_bytes_total Bytes written.
# TYPE shale_storage_wal_bytes_total counter
shale_storage_wal_bytes_total{engine="raftlog"} 1.5e+06
shale_storage_wal_bytes_total{engine="shard-2"} 4096
shale_storage_wal_bytes_total_other{engine="x"} 7
shale_storage_wal_syncs_total{engine="raftlog"} 12
etcd_disk_wal_write_bytes_total 2.5e+06
`

func serve(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func TestScrapeCounters(t *testing.T) {
	url := serve(t, exposition)
	got, err := scrapeCounters(context.Background(), http.DefaultClient, url, "shale_storage_wal_bytes_total")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[`engine="raftlog"`] != 1.5e6 || got[`engine="shard-2"`] != 4096 {
		t.Fatalf("got %v", got)
	}
	got, err = scrapeCounters(context.Background(), http.DefaultClient, url, "etcd_disk_wal_write_bytes_total")
	if err != nil || len(got) != 1 || got[""] != 2.5e6 {
		t.Fatalf("unlabelled sample: %v, %v", got, err)
	}
	for _, bad := range []string{"shale_storage_wal_bytes_total{engine=\"x\" 1\n", "shale_storage_wal_bytes_total{} abc\n", "shale_storage_wal_bytes_total \n"} {
		if _, err := scrapeCounters(context.Background(), http.DefaultClient, serve(t, bad), "shale_storage_wal_bytes_total"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := scrapeMembers(context.Background(), http.DefaultClient, []string{serve(t, "other 1\n")}, "shale_storage_wal_bytes_total"); err == nil || !strings.Contains(err.Error(), "no shale_storage_wal_bytes_total") {
		t.Errorf("a member without the metric: %v", err)
	}
}

func TestWALDelta(t *testing.T) {
	before := map[string]float64{`0/engine="raftlog"`: 100, `0/engine="shard-2"`: 50, `1/engine="shard-3"`: 10}
	after := map[string]float64{`0/engine="raftlog"`: 400, `0/engine="shard-2"`: 80, `0/engine="shard-9"`: 25} // shard-3 closed, shard-9 opened
	before["0/"], after["0/"] = 5, 9                                                                           // an unlabelled log (etcd's)
	got, byKind := walDelta(before, after)
	if got != 300+30+25+4 {
		t.Fatalf("walDelta = %v, want 359", got)
	}
	if want := map[string]float64{`engine="raftlog"`: 300, `engine="shard"`: 55, "wal": 4}; !maps.Equal(byKind, want) {
		t.Fatalf("by kind %v, want %v", byKind, want)
	}
	r := Result{Ops: 10, WALBytes: 600, Replicas: 3}
	if got := r.WALBytesPerOp(); got != 20 {
		t.Fatalf("WALBytesPerOp = %v, want 20", got)
	}
}

// FuzzScrapeCounters: any exposition text gives samples or an error,
// never a panic.
func FuzzScrapeCounters(f *testing.F) {
	f.Add(exposition)
	f.Add("shale_storage_wal_bytes_total{")
	f.Fuzz(func(t *testing.T, body string) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(body))
		}))
		defer srv.Close()
		_, _ = scrapeCounters(context.Background(), http.DefaultClient, srv.URL, "shale_storage_wal_bytes_total")
	})
}
