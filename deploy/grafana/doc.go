// Package grafana holds the tests of the Grafana dashboard shale.json and
// the Prometheus scrape configurations next to it (README.md says how to
// use them):
//
//   - TestDashboardModel: shale.json loads as a Grafana dashboard model
//     (uid, title, a Prometheus datasource variable, the node and shard
//     variables; every panel has an id of its own, a title, a place on the
//     grid that no other panel takes, and queries through ${datasource});
//   - TestDashboardMetricsExist: every metric name the dashboard's PromQL
//     queries use is in the /metrics of a running 3-node cluster (started
//     in-process with internal/testcluster) after a little traffic, so the
//     dashboard cannot drift from the metrics shale-server exports;
//     TestDashboardMetricNameTokenizer and TestDashboardMetricMatching
//     check how names are read from PromQL and matched with a scrape;
//   - TestScrapeConfigs: the ServiceMonitors and the plain scrape
//     configuration select the Service, pods and port of deploy/k8s/base.
package grafana
