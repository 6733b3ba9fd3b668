package cluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// walMeter is implemented by clusters whose members report the bytes they
// have written to their write-ahead logs (Shale: the Raft log and every
// shard engine; etcd: its WAL).
type walMeter interface {
	// WALBytes returns, for each write-ahead log of the cluster (keyed by
	// member and log), the bytes written to it since it was opened.
	WALBytes(ctx context.Context) (map[string]float64, error)
}

// walDelta is the bytes written to the cluster's write-ahead logs between
// two WALBytes readings, in all and by kind of log (kindOf): a log present
// in both counts its growth, a log opened in between (a split's new
// engine) all of its bytes. A log closed in between (a merged shard's) is
// missing from the total.
func walDelta(before, after map[string]float64) (sum float64, byKind map[string]float64) {
	byKind = map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			sum += d
			byKind[kindOf(k)] += d
		}
	}
	return sum, byKind
}

// kindOf is the kind of a write-ahead log keyed as scrapeMembers keys
// them: its labels without the member and without a trailing number
// (engine="shard-7" is engine="shard"), or "wal" for an unlabelled one.
func kindOf(key string) string {
	_, labels, _ := strings.Cut(key, "/")
	if labels == "" {
		return "wal"
	}
	v := strings.TrimSuffix(labels, `"`)
	if i := strings.LastIndexByte(v, '-'); i >= 0 && strings.Trim(v[i+1:], "0123456789") == "" && i+1 < len(v) {
		return v[:i] + `"`
	}
	return labels
}

// startWAL reads cl's write-ahead log counters, nil when it does not
// report them or the reading fails.
func startWAL(ctx context.Context, cl Cluster) map[string]float64 {
	m, ok := cl.(walMeter)
	if !ok {
		return nil
	}
	b, err := m.WALBytes(ctx)
	if err != nil {
		return nil
	}
	return b
}

// walUsed is the bytes cl wrote to its write-ahead logs since before was
// read, in all and by kind of log, 0 and nil when it cannot be measured.
func walUsed(ctx context.Context, cl Cluster, before map[string]float64) (float64, map[string]float64) {
	if before == nil {
		return 0, nil
	}
	after, err := cl.(walMeter).WALBytes(ctx)
	if err != nil {
		return 0, nil
	}
	return walDelta(before, after)
}

// scrapeCounters reads the Prometheus text exposition at url and returns
// the samples of the metric name, keyed by their label sets ("" when a
// sample has none).
func scrapeCounters(ctx context.Context, hc *http.Client, url, name string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return nil, fmt.Errorf("GET %s: malformed sample %q", url, line)
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("GET %s: malformed sample %q", url, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s: sample %q: %w", url, line, err)
		}
		out[labels] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return out, nil
}

// scrapeMembers scrapes metric name from every member's metrics URL and
// keys each sample by the member's index and its labels.
func scrapeMembers(ctx context.Context, hc *http.Client, urls []string, name string) (map[string]float64, error) {
	out := map[string]float64{}
	for i, u := range urls {
		m, err := scrapeCounters(ctx, hc, u, name)
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("GET %s: no %s", u, name)
		}
		for labels, v := range m {
			out[strconv.Itoa(i)+"/"+labels] = v
		}
	}
	return out, nil
}

// WALBytes implements walMeter: every node's shale_storage_wal_bytes_total,
// by engine (its Raft log and each shard's engine).
func (c *shaleCluster) WALBytes(ctx context.Context) (map[string]float64, error) {
	hc, scheme, err := c.nodes.metricsClient()
	if err != nil {
		return nil, err
	}
	urls := make([]string, len(c.nodes.HTTP))
	for i, a := range c.nodes.HTTP {
		urls[i] = scheme + "://" + a + "/metrics"
	}
	return scrapeMembers(ctx, hc, urls, "shale_storage_wal_bytes_total")
}

// metricsClient is an HTTP client for the nodes' HTTP ports, with the
// cluster's CA and client certificate when it runs TLS, and the scheme.
func (c *ShaleNodes) metricsClient() (*http.Client, string, error) {
	if c.tls == nil {
		return http.DefaultClient, "http", nil
	}
	pem, err := os.ReadFile(c.tls.caFile)
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("%s: no certificate", c.tls.caFile)
	}
	cert, err := tls.LoadX509KeyPair(c.tls.clientCert, c.tls.clientKey)
	if err != nil {
		return nil, "", err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return &http.Client{Transport: tr}, "https", nil
}

// WALBytes implements walMeter: every member's
// etcd_disk_wal_write_bytes_total.
func (c *etcdCluster) WALBytes(ctx context.Context) (map[string]float64, error) {
	urls := make([]string, len(c.endpoints))
	for i, ep := range c.endpoints {
		urls[i] = strings.TrimSuffix(ep, "/") + "/metrics"
	}
	return scrapeMembers(ctx, http.DefaultClient, urls, "etcd_disk_wal_write_bytes_total")
}
