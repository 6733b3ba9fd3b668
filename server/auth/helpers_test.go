package auth

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// testCost is the bcrypt cost of the tests' passwords: hashing at the
// production cost would make every AddUser take tens of milliseconds (more
// under -race), and the cost does not change what is tested.
// TestProductionCost checks the production default.
const testCost = bcrypt.MinCost

// t0 is the tests' clock.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// must returns a constructor's Change, failing the test on its error:
// must(t)(AddUser(..., testCost)).
func must(t testing.TB) func(Change, error) Change {
	return func(ch Change, err error) Change {
		t.Helper()
		if err != nil {
			t.Fatalf("constructor: %v", err)
		}
		return ch
	}
}

// apply runs Edit for each change in turn, failing the test on an error.
func apply(t testing.TB, st *shalev1.AuthState, chs ...Change) *shalev1.AuthState {
	t.Helper()
	for i, ch := range chs {
		next, err := Edit(st, ch)
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		st = next
	}
	return st
}

// all is one Change made of chs, applied in turn (one Edit for many
// changes: building a large state change by change would clone it each
// time).
func all(chs ...Change) Change {
	return func(st *shalev1.AuthState) error {
		for _, ch := range chs {
			if err := ch(st); err != nil {
				return err
			}
		}
		return nil
	}
}

// wantStatus fails the test unless err is a status error with code and a
// message containing every one of parts.
func wantStatus(t testing.TB, err error, code codes.Code, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", code)
	}
	s, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a status error", err)
	}
	if s.Code() != code {
		t.Fatalf("got %v (%q), want %v", s.Code(), s.Message(), code)
	}
	for _, p := range parts {
		if !strings.Contains(s.Message(), p) {
			t.Fatalf("message %q does not contain %q", s.Message(), p)
		}
	}
}

// rootState is an enabled state with user root (root role, password
// "rootpw"), alice (password "alicepw", role reader), bob (no password, no
// role), and roles reader (READ on prefix "a") and writer (WRITE on
// ["m", "p")).
func rootState(t testing.TB) *shalev1.AuthState {
	t.Helper()
	st := apply(t, nil,
		must(t)(AddUser("root", "rootpw", false, testCost)),
		GrantRole("root", RootRole),
		must(t)(AddUser("alice", "alicepw", false, testCost)),
		must(t)(AddUser("bob", "", true, testCost)),
		AddRole("reader"),
		AddRole("writer"),
		GrantPermission("reader", &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_READ, Key: []byte("a"), Prefix: true}),
		GrantPermission("writer", &shalev1.Permission{Type: shalev1.PermissionType_PERMISSION_TYPE_WRITE, Key: []byte("m"), RangeEnd: []byte("p")}),
		GrantRole("alice", "reader"),
		must(t)(Enable(t0)),
	)
	return st
}

func perm(typ shalev1.PermissionType, key, end string, prefix bool) *shalev1.Permission {
	p := &shalev1.Permission{Type: typ, Prefix: prefix}
	if key != "" {
		p.Key = []byte(key)
	}
	if end != "" {
		p.RangeEnd = []byte(end)
	}
	return p
}

const (
	pRead  = shalev1.PermissionType_PERMISSION_TYPE_READ
	pWrite = shalev1.PermissionType_PERMISSION_TYPE_WRITE
	pRW    = shalev1.PermissionType_PERMISSION_TYPE_READWRITE
)
