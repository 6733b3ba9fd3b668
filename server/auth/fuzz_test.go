package auth

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

var (
	fuzzOnce                      sync.Once
	fuzzStore, fuzzOtherStore     *Store
	fuzzUserToken, fuzzOtherToken string
)

// fuzzSetup makes one state with its tokens for the token fuzzer: the
// token of alice, and a token of another cluster.
func fuzzSetup(t testing.TB) {
	fuzzOnce.Do(func() {
		fuzzStore = NewStore(rootState(t))
		var err error
		if fuzzUserToken, _, err = fuzzStore.IssueToken("alice", t0, ttl); err != nil {
			t.Fatal(err)
		}
		fuzzOtherStore = NewStore(rootState(t))
		if fuzzOtherToken, _, err = fuzzOtherStore.IssueToken("alice", t0, ttl); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzVerifyToken: no string makes VerifyToken panic, every failure is
// Unauthenticated, and only the token the state issued verifies.
func FuzzVerifyToken(f *testing.F) {
	fuzzSetup(f)
	parts := strings.Split(fuzzUserToken, ".")
	for _, s := range []string{
		fuzzUserToken, fuzzOtherToken, "", ".", "..", "a.b.c",
		parts[0] + "." + parts[1] + ".", parts[0] + ".." + parts[2],
		"eyJhbGciOiJub25lIn0.eyJzdWIiOiJyb290In0.",
		strings.ToUpper(fuzzUserToken), fuzzUserToken[:len(fuzzUserToken)-1],
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		user, _, err := fuzzStore.VerifyToken(tok, t0)
		if err != nil {
			if c := status.Code(err); c != codes.Unauthenticated {
				t.Fatalf("VerifyToken(%q): %v, want Unauthenticated", tok, err)
			}
			return
		}
		switch {
		case tok == fuzzUserToken && user == "alice":
		default:
			t.Fatalf("VerifyToken(%q) = %q, a token the state did not issue", tok, user)
		}
	})
}

// FuzzPermissionSpan: no permission makes PermissionSpan (or validation,
// or a Store holding it) panic, Start <= End when there is an End, and a
// valid permission's span holds exactly its keys.
func FuzzPermissionSpan(f *testing.F) {
	f.Add([]byte("a"), []byte(""), false, uint8(1))
	f.Add([]byte("a"), []byte("b"), false, uint8(2))
	f.Add([]byte("b"), []byte("a"), false, uint8(3))
	f.Add([]byte(""), []byte(""), true, uint8(3))
	f.Add([]byte("\xff\xff"), []byte(""), true, uint8(1))
	f.Add([]byte("a\xff"), []byte("b"), true, uint8(0))
	f.Fuzz(func(t *testing.T, key, end []byte, prefix bool, typ uint8) {
		p := &shalev1.Permission{Type: shalev1.PermissionType(typ % 5), Key: key, RangeEnd: end, Prefix: prefix}
		sp := PermissionSpan(p)
		if sp.End != nil && bytes.Compare(sp.Start, sp.End) > 0 {
			t.Fatalf("PermissionSpan(%v) = %v: Start after End", p, sp)
		}
		if len(sp.End) == 0 && sp.End != nil {
			t.Fatalf("PermissionSpan(%v): an empty End that is not nil", p)
		}
		valid := ValidatePermission(p) == nil
		if valid {
			// The span holds exactly the permission's keys: check at its
			// edges and around the key.
			probes := [][]byte{key, append(bytes.Clone(key), 0), append(bytes.Clone(key), 0xff), sp.Start, sp.End}
			if len(key) > 0 {
				probes = append(probes, key[:len(key)-1])
			}
			if len(end) > 0 {
				probes = append(probes, end, end[:len(end)-1], append(bytes.Clone(end), 0))
			}
			for _, k := range probes {
				if k == nil {
					continue
				}
				if sp.Contains(k) != permContains(p, k) {
					t.Fatalf("PermissionSpan(%v) = %v: Contains(%q) = %v", p, sp, k, sp.Contains(k))
				}
			}
		}
		s := NewStore(&shalev1.AuthState{
			Enabled: true,
			Users:   []*shalev1.User{{Name: "u", Roles: []string{"r"}}},
			Roles:   []*shalev1.Role{{Name: "r", Permissions: []*shalev1.Permission{p}}},
		})
		err := s.Check("u", Read|Write, sp)
		if valid && p.Type == shalev1.PermissionType_PERMISSION_TYPE_READWRITE && err != nil && !sp.Empty() {
			t.Fatalf("a READWRITE permission does not allow its own span %v: %v", sp, err)
		}
	})
}
