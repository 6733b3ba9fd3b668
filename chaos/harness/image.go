package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	mobyclient "github.com/moby/moby/client"
)

// DefaultImage is the tag EnsureImage builds (the one `make image` builds).
const DefaultImage = "shale:dev"

var (
	imageOnce sync.Once
	imageErr  error
	imageTag  string
)

// EnsureImage returns the Shale image to run. With SHALE_IMAGE set it is
// that image, used as it is. Otherwise it builds DefaultImage from the
// working tree with scripts/build-image.sh, once per process, so a test
// never runs a stale image (Go's build cache and Docker's layer cache make
// a rebuild of unchanged code quick).
func EnsureImage(ctx context.Context) (string, error) {
	if tag := os.Getenv("SHALE_IMAGE"); tag != "" {
		return tag, nil
	}
	imageOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			imageErr = err
			return
		}
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "build-image.sh"), DefaultImage)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("harness: build the image: %w\n%s", err, out)
			return
		}
		imageTag = DefaultImage
	})
	return imageTag, imageErr
}

// repoRoot finds the repository root (the directory holding
// scripts/build-image.sh) above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "build-image.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("harness: no scripts/build-image.sh above the working directory (set SHALE_IMAGE to use a built image)")
		}
		dir = parent
	}
}

// RequireDocker fails the test when no Docker engine answers, or skips it
// outside CI (CI unset): the container tests need an engine, which every CI
// machine has.
func RequireDocker(t interface {
	Helper()
	Fatalf(string, ...any)
	Skipf(string, ...any)
}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := mobyclient.New(mobyclient.FromEnv)
	if err == nil {
		defer cli.Close()
		_, err = cli.Ping(ctx, mobyclient.PingOptions{})
	}
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("no Docker engine: %v", err)
	}
	t.Skipf("no Docker engine (the test needs one; under CI=true this fails): %v", err)
}
