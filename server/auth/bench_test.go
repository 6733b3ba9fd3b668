package auth

import (
	"fmt"
	"math/rand/v2"
	"testing"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// benchState is an enabled state with 100 roles of 50 permissions each
// (random keys, prefixes and ranges over 8-byte keys "k0000000" to
// "k9999999"), user "u" holding all of them, and root.
func benchState(b *testing.B) *shalev1.AuthState {
	r := rand.New(rand.NewPCG(7, 7))
	key := func() []byte { return fmt.Appendf(nil, "k%07d", r.IntN(10_000_000)) }
	chs := []Change{must(b)(AddUser(RootUser, "", true, testCost)), GrantRole(RootUser, RootRole), must(b)(Enable(t0)),
		must(b)(AddUser("u", "", true, testCost))}
	for i := range 100 {
		name := fmt.Sprintf("role%03d", i)
		chs = append(chs, AddRole(name), GrantRole("u", name))
		for range 50 {
			p := &shalev1.Permission{Type: []shalev1.PermissionType{pRead, pWrite, pRW}[r.IntN(3)], Key: key()}
			switch r.IntN(3) {
			case 0: // a prefix of 100 keys
				p.Key = p.Key[:6]
				p.Prefix = true
			case 1: // a range of about 1000 keys
				p.RangeEnd = append(p.Key[:5:5], p.Key[5]+1)
			}
			chs = append(chs, GrantPermission(name, p))
		}
	}
	return apply(b, nil, all(chs...))
}

// BenchmarkCheck is the cost per request of Check for a user with 100
// roles of 50 permissions each (merged into the number of spans the
// read-spans metric gives): a map look-up and a binary search.
//
//   - allowed: read on keys and ranges inside the user's permissions, the
//     common path (no allocation);
//   - denied: read on random keys and ranges, most of them refused, which
//     adds building the PermissionDenied error;
//   - root: a root user (no search).
func BenchmarkCheck(b *testing.B) {
	s := NewStore(benchState(b))
	var allowed []Span
	for _, r := range s.State().Roles {
		for _, p := range r.Permissions {
			if p.Type != pWrite {
				sp := PermissionSpan(p)
				allowed = append(allowed, sp, KeySpan(sp.Start))
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 1))
	random := make([]Span, 1024)
	for i := range random {
		k := fmt.Appendf(nil, "k%07d", r.IntN(10_000_000))
		if i%2 == 0 {
			random[i] = KeySpan(k)
		} else {
			random[i] = RangeSpan(k, append(k[:6:6], k[6]+1))
		}
	}
	run := func(b *testing.B, user string, spans []Span) {
		denied := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if s.Check(user, Read, spans[i%len(spans)]) != nil {
				denied++
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(len(s.users["u"].perms.read)), "read-spans")
		b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
	}
	b.Run("allowed", func(b *testing.B) { run(b, "u", allowed) })
	b.Run("denied", func(b *testing.B) { run(b, "u", random) })
	b.Run("root", func(b *testing.B) { run(b, RootUser, random) })
}

// BenchmarkNewStore is the cost of indexing that state, paid on every node
// once per change of the auth state.
func BenchmarkNewStore(b *testing.B) {
	st := benchState(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		NewStore(st)
	}
}
