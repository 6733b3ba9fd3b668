package grpctransport

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"google.golang.org/grpc"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// benchHandler accepts every snapshot and deletes it.
type benchHandler struct{}

func (benchHandler) HandleRaftBatch(*shalev1.RaftMessageBatch) {}

func (benchHandler) HandleSnapshot(_ context.Context, _ *shalev1.SnapshotHeader, dir string) error {
	return os.RemoveAll(dir)
}

// BenchmarkSnapshotTransfer streams a checkpoint-like directory (files of
// SHALE_BENCH_SNAPSHOT_FILE_MB MiB, default 32, SHALE_BENCH_SNAPSHOT_FILES of
// them, default 6, plus a few small ones) from one Transport to another
// over loopback gRPC, each on its own server as two nodes would be, with
// the receiver's staging directory under SHALE_BENCH_SNAPSHOT_DIR (default
// the test's temporary directory). Both ends share this process, so its
// CPU per byte is the two nodes' together. SHALE_BENCH_SNAPSHOT_CHUNK,
// SHALE_BENCH_SNAPSHOT_PARALLEL and SHALE_BENCH_SNAPSHOT_READ_BUFFER set the
// chunk size, the files streamed at once and the receiving server's
// grpc.ReadBufferSize, SHALE_BENCH_SNAPSHOT_WINDOW its stream flow-control
// window (default DefaultInitialWindowSize, as shale-server's).
func BenchmarkSnapshotTransfer(b *testing.B) {
	fileMB, files := envInt("SHALE_BENCH_SNAPSHOT_FILE_MB", 32), envInt("SHALE_BENCH_SNAPSHOT_FILES", 6)
	root := os.Getenv("SHALE_BENCH_SNAPSHOT_DIR")
	if root == "" {
		root = b.TempDir()
	} else {
		var err error
		if root, err = os.MkdirTemp(root, "bench-snapshot-"); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(root)
	}
	src := filepath.Join(root, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	rnd := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, fileMB<<20)
	var total int64
	for i := range files {
		_, _ = rnd.Read(buf)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("%06d.sst", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(buf))
	}
	for _, name := range []string{"CURRENT", "MANIFEST-000009", "OPTIONS-000010", "000011.log"} {
		if err := os.WriteFile(filepath.Join(src, name), buf[:1000], 0o644); err != nil {
			b.Fatal(err)
		}
		total += 1000
	}
	addrs := map[uint64]string{}
	resolve := func(id uint64) (string, error) { return addrs[id], nil }
	var trs []*Transport
	for id := uint64(1); id <= 2; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addrs[id] = lis.Addr().String()
		tr := New(Options{NodeID: id, ClusterID: "bench", Resolve: resolve, Logger: quietLogger,
			SnapshotStagingDir: filepath.Join(root, "staging-"+strconv.FormatUint(id, 10)),
			SnapshotChunkSize:  envInt("SHALE_BENCH_SNAPSHOT_CHUNK", 0),
			SnapshotParallel:   envInt("SHALE_BENCH_SNAPSHOT_PARALLEL", 0)})
		// As shale-server serves it: fixed flow-control windows.
		srvOpts := append(ServerOptions(),
			grpc.InitialWindowSize(int32(envInt("SHALE_BENCH_SNAPSHOT_WINDOW", DefaultInitialWindowSize))),
			grpc.InitialConnWindowSize(DefaultInitialConnWindowSize))
		if n := envInt("SHALE_BENCH_SNAPSHOT_READ_BUFFER", 0); n > 0 {
			srvOpts = append(srvOpts, grpc.ReadBufferSize(n))
		}
		srv := grpc.NewServer(srvOpts...)
		tr.Register(srv, benchHandler{})
		go func() { _ = srv.Serve(lis) }()
		defer srv.Stop()
		defer tr.Close()
		trs = append(trs, tr)
	}
	b.SetBytes(total)
	b.ResetTimer()
	for range b.N {
		if err := trs[0].SendSnapshot(context.Background(), &shalev1.SnapshotHeader{ShardId: 1, ToNodeId: 2}, src); err != nil {
			b.Fatal(err)
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
