// Package proctest holds process-level integration tests: they build the
// real shale-server and shalectl binaries once per test binary (TestMain runs
// `go build`), start clusters of separate server processes on loopback
// ports, and kill, restart and signal those processes.
//
//   - TestKillLeaderFailover: a 3-node cluster under concurrent writes; the
//     leader of the written shard is killed with SIGKILL, writes resume after
//     the election (the unavailability window is logged), and the restarted
//     node catches up (proven by stale reads served by that node alone).
//   - TestRollingRestartNoFailedRequest: a 3-node cluster under writes and
//     linearizable reads through the SDK; every node in turn gets SIGTERM
//     (it drains its leaderships and exits 0) and restarts; not one request
//     fails, none has an unknown outcome, and every acknowledged write reads
//     back.
//   - TestRunClusterScript: scripts/run-cluster.sh (what `make run` runs)
//     starts a cluster, serves a write, stops cleanly on SIGINT, and restarts
//     the same cluster from its data.
//
// The tests skip under -short and when the go tool is not on PATH. The
// servers are normal builds even under `go test -race`; only the test
// process (the clients) runs with the race detector. Set SHALE_TEST_LOG=1 to
// see the client logs; the servers' logs are printed when a test fails.
package proctest
