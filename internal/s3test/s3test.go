// Package s3test starts a real S3-compatible server, versitygw (the Versity
// S3 Gateway, built from the Go module proxy by `make s3-server`, which pins its release), on
// loopback for tests of the S3 backup target. Its objects are plain files
// under a directory the test owns (versitygw's POSIX backend), so a test
// can damage one behind the server's back.
package s3test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/shale-db/shale/internal/freeport"
)

// BinaryEnv names the environment variable that gives the versitygw
// binary; `make test` sets it. Without it, the binary is looked for at
// bin/versitygw in the module root.
const BinaryEnv = "SHALE_TEST_VERSITYGW"

// Server is a running versitygw.
type Server struct {
	// Endpoint is its URL, http://127.0.0.1:PORT.
	Endpoint string
	// AccessKey and SecretKey are its root credentials.
	AccessKey, SecretKey string
	// Root is the directory holding its buckets: bucket b's object k is the
	// file Root/b/k.
	Root string
}

// Start starts versitygw for the test, and stops it when the test ends.
// It sets AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to its credentials
// for the test (so the test cannot run in parallel). Without the binary
// the test is skipped, or fails when $CI is set (CI must run it).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := binary()
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("no versitygw binary at %s (%v): run `make s3-server`, or set %s", bin, err, BinaryEnv)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := &Server{AccessKey: "shaletestaccess", SecretKey: "shaletestsecret0123456789", Root: t.TempDir()}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := freeport.Ports(1)
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		if lastErr = s.run(t, bin, addr); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("s3test: start versitygw: %v", lastErr)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	return s
}

// binary is where the versitygw binary is expected: $SHALE_TEST_VERSITYGW,
// or bin/versitygw in the nearest directory above the test's that has one.
func binary() string {
	if b := os.Getenv(BinaryEnv); b != "" {
		return b
	}
	dir, err := os.Getwd()
	for err == nil {
		if p := filepath.Join(dir, "bin", "versitygw"); fileExists(p) {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return filepath.Join("bin", "versitygw")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// run starts versitygw on addr and waits until it answers.
func (s *Server) run(t testing.TB, bin, addr string) error {
	logPath := filepath.Join(t.TempDir(), "versitygw.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--access", s.AccessKey, "--secret", s.SecretKey, "--port", addr, "--quiet", "posix", s.Root)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = logFile.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			_ = logFile.Close()
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("versitygw exited (%v): %s", err, out)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("versitygw did not listen on %s within 30 s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Endpoint = "http://" + addr
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("versitygw log:\n%s", out)
		}
	})
	return nil
}

// Client returns a client of the server with its root credentials.
func (s *Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	cl, err := minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds:        credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region:       "us-east-1",
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// Bucket creates bucket name and returns the s3:// URL of prefix in it,
// with the server's endpoint and region.
func (s *Server) Bucket(t testing.TB, name, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.Client(t).MakeBucket(ctx, name, minio.MakeBucketOptions{Region: "us-east-1"})
	if err != nil {
		var r minio.ErrorResponse
		if !errors.As(err, &r) || r.Code != "BucketAlreadyOwnedByYou" {
			t.Fatalf("s3test: make bucket %s: %v", name, err)
		}
	}
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&region=us-east-1", name, prefix, s.Endpoint)
}

// Dir is the directory holding the objects under prefix in bucket.
func (s *Server) Dir(bucket, prefix string) string {
	return filepath.Join(s.Root, bucket, filepath.FromSlash(prefix))
}

// EachLocation runs fn as two subtests: "dir", on a backup location that
// is a local directory, and "s3", on a prefix of a bucket of a versitygw
// server it starts. where is the location as backup.Open takes it; dir is
// the directory its objects are files in, to damage them behind the
// location's back.
func EachLocation(t *testing.T, fn func(t *testing.T, where, dir string)) {
	t.Run("dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "backups")
		fn(t, dir, dir)
	})
	t.Run("s3", func(t *testing.T) {
		srv := Start(t)
		fn(t, srv.Bucket(t, "shale-backups", "cluster/a"), srv.Dir("shale-backups", "cluster/a"))
	})
}
