package client

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// Client is closed and every fake server stopped in the tests' cleanups, so
// a leftover goroutine is a leak (a routing refresh or a connection that
// Close did not end).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
