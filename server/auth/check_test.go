package auth

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

var seedFlag = flag.Uint64("auth.seed", 0, "seed of TestCheckModel (0: from the clock)")

// alphabet is the bytes of the model's keys: a few letters, and the
// smallest and largest bytes, where spans have their corner cases.
const alphabet = "\x00abcde\xff"

// randKey is a key of 0 to maxLen bytes, mostly letters.
func randKey(r *rand.Rand, maxLen int) []byte {
	k := make([]byte, r.IntN(maxLen+1))
	for i := range k {
		if r.IntN(8) == 0 {
			k[i] = alphabet[[]int{0, len(alphabet) - 1}[r.IntN(2)]]
		} else {
			k[i] = alphabet[1+r.IntN(len(alphabet)-2)]
		}
	}
	return k
}

// randPermission is a valid permission on one key, a prefix or a range.
func randPermission(r *rand.Rand) *shalev1.Permission {
	for {
		p := &shalev1.Permission{Type: []shalev1.PermissionType{pRead, pWrite, pRW}[r.IntN(3)], Key: randKey(r, 3)}
		switch r.IntN(3) {
		case 0:
			p.Prefix = true
		case 1:
			p.RangeEnd = randKey(r, 3)
		}
		if ValidatePermission(p) == nil {
			return p
		}
	}
}

// randSpan is a span to check: a key, a prefix, a range (sometimes without
// upper bound, sometimes empty or inverted).
func randSpan(r *rand.Rand) Span {
	switch r.IntN(4) {
	case 0:
		return KeySpan(randKey(r, 4))
	case 1:
		return PrefixSpan(randKey(r, 3))
	case 2:
		return RangeSpan(randKey(r, 3), nil)
	default:
		a, b := randKey(r, 4), randKey(r, 4)
		if bytes.Compare(a, b) > 0 && r.IntN(8) != 0 {
			a, b = b, a
		}
		if len(b) == 0 {
			b = []byte("a")
		}
		return RangeSpan(a, b)
	}
}

// permContains is what a permission means, written without spans.
func permContains(p *shalev1.Permission, k []byte) bool {
	switch {
	case p.Prefix:
		return bytes.HasPrefix(k, p.Key)
	case len(p.RangeEnd) > 0:
		return bytes.Compare(p.Key, k) <= 0 && bytes.Compare(k, p.RangeEnd) < 0
	default:
		return bytes.Equal(k, p.Key)
	}
}

// oracleGap is the naive answer to a check: the first key of sp that none
// of perms covers (ok if there is none). Only sp.Start and the ends of the
// permissions' spans can be that key: below any uncovered key x of sp, the
// greatest such point c <= x is uncovered too (a span covering c would
// either end in (c, x], contradicting that c is the greatest, or cover x).
// So it tests those points, in order, one by one against every span.
func oracleGap(perms []*shalev1.Permission, sp Span) (ok bool, gap []byte) {
	if sp.Empty() {
		return true, nil
	}
	spans := make([]Span, len(perms))
	points := [][]byte{sp.Start}
	for i, p := range perms {
		spans[i] = PermissionSpan(p)
		if e := spans[i].End; e != nil && sp.Contains(e) {
			points = append(points, e)
		}
	}
	sort.Slice(points, func(i, j int) bool { return bytes.Compare(points[i], points[j]) < 0 })
	for _, c := range points {
		if !slices.ContainsFunc(spans, func(s Span) bool { return s.Contains(c) }) {
			return false, c
		}
	}
	return true, nil
}

// allKeys is every key of up to 4 bytes of the alphabet, sorted: the keys
// the enumerating oracle walks.
var allKeys = func() [][]byte {
	keys := [][]byte{{}}
	for n, prev := 1, [][]byte{{}}; n <= 4; n++ {
		var next [][]byte
		for _, p := range prev {
			for i := 0; i < len(alphabet); i++ {
				next = append(next, append(slices.Clone(p), alphabet[i]))
			}
		}
		keys = append(keys, next...)
		prev = next
	}
	sort.Slice(keys, func(i, j int) bool { return bytes.Compare(keys[i], keys[j]) < 0 })
	return keys
}()

type modelUser struct {
	name        string
	root        bool
	read, write []*shalev1.Permission
	// readOK and writeOK say, for each of allKeys, whether a permission
	// covers it (computed with permContains).
	readOK, writeOK []bool
}

func covered(perms []*shalev1.Permission) []bool {
	ok := make([]bool, len(allKeys))
	for i, k := range allKeys {
		ok[i] = slices.ContainsFunc(perms, func(p *shalev1.Permission) bool { return permContains(p, k) })
	}
	return ok
}

// TestCheckModel compares Store.Check with two naive oracles on random
// states: oracleGap (exact: the first key not covered), and a walk over
// every short key of the alphabet with permissions read as prefixes and
// ranges directly, which must find no uncovered key in a span that Check
// allows. Run with -auth.seed=N to replay a failure.
func TestCheckModel(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	states, checks := 150, 400
	if testing.Short() {
		states, checks = 30, 200
	}
	r := rand.New(rand.NewPCG(seed, seed^0x5ca1ab1e))
	defer func() {
		if t.Failed() {
			t.Logf("replay with: go test -run TestCheckModel ./server/auth/ -auth.seed=%d", seed)
		}
	}()
	enable := must(t)(Enable(t0))
	for it := 0; it < states && !t.Failed(); it++ {
		chs := []Change{must(t)(AddUser(RootUser, "", true, testCost)), GrantRole(RootUser, RootRole), enable}
		nroles := 1 + r.IntN(6)
		perms := make([][]*shalev1.Permission, nroles)
		for i := range nroles {
			name := fmt.Sprintf("r%d", i)
			chs = append(chs, AddRole(name))
			for range r.IntN(8) {
				p := randPermission(r)
				perms[i] = append(perms[i], p)
				chs = append(chs, GrantPermission(name, p))
			}
		}
		var users []*modelUser
		for i := range 1 + r.IntN(4) {
			u := &modelUser{name: fmt.Sprintf("u%d", i)}
			chs = append(chs, must(t)(AddUser(u.name, "", true, testCost)))
			for j := range nroles {
				if r.IntN(2) == 0 {
					continue
				}
				chs = append(chs, GrantRole(u.name, fmt.Sprintf("r%d", j)))
				for _, p := range perms[j] {
					if p.Type != pWrite {
						u.read = append(u.read, p)
					}
					if p.Type != pRead {
						u.write = append(u.write, p)
					}
				}
			}
			if r.IntN(10) == 0 {
				chs = append(chs, GrantRole(u.name, RootRole))
				u.root = true
			}
			u.readOK, u.writeOK = covered(u.read), covered(u.write)
			users = append(users, u)
		}
		s := NewStore(apply(t, nil, chs...))
		for range checks {
			u := users[r.IntN(len(users))]
			sp := randSpan(r)
			pm := []Perm{Read, Write, Read | Write}[r.IntN(3)]
			want := true
			var firstGap []byte
			for _, typ := range []Perm{Read, Write} {
				if pm&typ == 0 || u.root {
					continue
				}
				list, okKeys := u.read, u.readOK
				if typ == Write {
					list, okKeys = u.write, u.writeOK
				}
				ok, gap := oracleGap(list, sp)
				if !ok {
					want = false
					if firstGap == nil {
						firstGap = gap
					}
				}
				// The enumerating oracle: every short key of the span
				// must be covered if the span is.
				lo := sort.Search(len(allKeys), func(i int) bool { return bytes.Compare(allKeys[i], sp.Start) >= 0 })
				for i := lo; i < len(allKeys) && sp.Contains(allKeys[i]); i++ {
					if !okKeys[i] && ok {
						t.Fatalf("state %d, user %s, %v on %v: oracleGap says covered, but key %q is not (permissions %v)",
							it, u.name, typ, sp, allKeys[i], list)
					}
				}
				// And a key oracleGap finds uncovered is in the span and
				// in no permission, read as what it means.
				if !ok && (!sp.Contains(gap) ||
					slices.ContainsFunc(list, func(p *shalev1.Permission) bool { return permContains(p, gap) })) {
					t.Fatalf("state %d, user %s, %v on %v: oracleGap's gap %q is covered or outside (permissions %v)",
						it, u.name, typ, sp, gap, list)
				}
				gotOK, gotGap := userSpans(s, u.name, typ).covers(sp)
				if gotOK != ok || !bytes.Equal(gotGap, gap) {
					t.Fatalf("state %d, user %s, %v on %v: spanSet.covers = %v, gap %q; oracleGap: %v, gap %q; permissions %v",
						it, u.name, typ, sp, gotOK, gotGap, ok, gap, list)
				}
			}
			err := s.Check(u.name, pm, sp)
			if (err == nil) != want {
				t.Fatalf("state %d, user %s (root %v), %v on %v: Check = %v, oracle says allowed = %v (first gap %q); read %v write %v",
					it, u.name, u.root, pm, sp, err, want, firstGap, u.read, u.write)
			}
			if err != nil {
				wantStatus(t, err, codes.PermissionDenied, fmt.Sprintf("%q", u.name), sp.String())
			}
		}
	}
}

// userSpans is the merged span set of user for typ.
func userSpans(s *Store, user string, typ Perm) spanSet {
	if typ == Write {
		return s.users[user].perms.write
	}
	return s.users[user].perms.read
}

// TestPermissionSpanModel checks PermissionSpan, KeySpan, PrefixSpan and
// RangeSpan against what the permissions mean, on every short key.
func TestPermissionSpanModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		p := randPermission(r)
		sp := PermissionSpan(p)
		for _, k := range allKeys {
			if sp.Contains(k) != permContains(p, k) {
				t.Fatalf("%v: span %v contains %q: %v", p, sp, k, sp.Contains(k))
			}
		}
	}
	cases := []struct {
		sp        Span
		start     string
		end       string
		unbounded bool
	}{
		{KeySpan([]byte("a")), "a", "a\x00", false},
		{KeySpan(nil), "", "\x00", false},
		{PrefixSpan([]byte("ab")), "ab", "ac", false},
		{PrefixSpan([]byte("a\xff")), "a\xff", "b", false},
		{PrefixSpan([]byte("a\xff\xff")), "a\xff\xff", "b", false},
		{PrefixSpan([]byte("\xff\xff")), "\xff\xff", "", true},
		{PrefixSpan(nil), "", "", true},
		{RangeSpan([]byte("a"), []byte("c")), "a", "c", false},
		{RangeSpan([]byte("a"), []byte{}), "a", "", true},
	}
	for _, c := range cases {
		if string(c.sp.Start) != c.start || string(c.sp.End) != c.end || c.sp.Unbounded() != c.unbounded ||
			(c.unbounded && c.sp.End != nil) {
			t.Errorf("span %v (End nil %v), want [%q, %q) unbounded %v", c.sp, c.sp.End == nil, c.start, c.end, c.unbounded)
		}
	}
}

// TestSpanSetMerges checks the merged form: touching and overlapping spans
// become one, so a span covered by two permissions together is allowed.
func TestSpanSetMerges(t *testing.T) {
	set := newSpanSet([]Span{
		RangeSpan([]byte("c"), []byte("e")), RangeSpan([]byte("a"), []byte("c")),
		KeySpan([]byte("e")), RangeSpan([]byte("x"), []byte("y")), RangeSpan([]byte("x"), []byte("x")),
		PrefixSpan([]byte("z")), RangeSpan([]byte("z\x00"), nil),
	})
	want := spanSet{
		{Start: []byte("a"), End: []byte("e\x00")},
		{Start: []byte("x"), End: []byte("y")},
		{Start: []byte("z")},
	}
	if fmt.Sprint(set) != fmt.Sprint(want) {
		t.Fatalf("merged %v, want %v", set, want)
	}
	for _, c := range []struct {
		sp  Span
		ok  bool
		gap string
	}{
		{RangeSpan([]byte("b"), []byte("d")), true, ""},
		{RangeSpan([]byte("a"), []byte("e\x00")), true, ""},
		{RangeSpan([]byte("a"), []byte("e\x00\x00")), false, "e\x00"},
		{RangeSpan([]byte("0"), []byte("b")), false, "0"},
		{KeySpan([]byte("y")), false, "y"},
		{RangeSpan([]byte("zz"), nil), true, ""},
		{RangeSpan([]byte("y"), nil), false, "y"},
		{RangeSpan([]byte("q"), []byte("b")), true, ""}, // empty
	} {
		ok, gap := set.covers(c.sp)
		if ok != c.ok || string(gap) != c.gap {
			t.Errorf("covers(%v) = %v, %q; want %v, %q", c.sp, ok, gap, c.ok, c.gap)
		}
	}
}

// TestCheck covers Check's rules beyond coverage: disabled, root, node,
// unknown users, the message.
func TestCheck(t *testing.T) {
	st := rootState(t)
	s := NewStore(st)
	if err := s.Check("alice", Read, PrefixSpan([]byte("ab"))); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s.Check("alice", Write, KeySpan([]byte("ab"))), codes.PermissionDenied,
		`user "alice"`, "write", `key "ab"`)
	wantStatus(t, s.Check("alice", Read, RangeSpan([]byte("a"), []byte("c"))), codes.PermissionDenied,
		`user "alice"`, "read", `["a", "c")`, `first key not covered is "b"`)
	wantStatus(t, s.Check("alice", Read|Write, KeySpan([]byte("a"))), codes.PermissionDenied, "write")
	wantStatus(t, s.Check("alice", Read, RangeSpan([]byte("a"), nil)), codes.PermissionDenied, "end of key space")
	wantStatus(t, s.Check("bob", Read, KeySpan([]byte("a"))), codes.PermissionDenied, `user "bob"`)
	wantStatus(t, s.Check("nobody", Read, KeySpan([]byte("a"))), codes.PermissionDenied, `user "nobody" does not exist`)
	wantStatus(t, s.Check("alice", 0, KeySpan([]byte("a"))), codes.Internal)
	if err := s.Check("alice", Write, RangeSpan([]byte("c"), []byte("a"))); err != nil {
		t.Fatalf("an empty span: %v", err)
	}
	for _, u := range []string{RootUser, NodeUser} {
		if err := s.Check(u, Read|Write, RangeSpan(nil, nil)); err != nil {
			t.Fatalf("%q: %v", u, err)
		}
		if !s.IsRoot(u) {
			t.Fatalf("IsRoot(%q) is false", u)
		}
	}
	if s.IsRoot("alice") || s.IsRoot("nobody") || s.HasUser(NodeUser) || !s.HasUser("bob") {
		t.Fatal("IsRoot or HasUser wrong")
	}
	if got := s.Roles("alice"); !slices.Equal(got, []string{"reader"}) {
		t.Fatalf("Roles(alice) = %v", got)
	}
	s.Roles("alice")[0] = "x"
	if s.Roles("alice")[0] != "reader" {
		t.Fatal("Roles returned the store's slice")
	}
	if s.Roles("nobody") != nil || s.Roles(NodeUser) != nil {
		t.Fatal("roles of an unknown user")
	}
	if s.State() != st || !s.Enabled() || s.Revision() != st.Revision {
		t.Fatal("State, Enabled or Revision wrong")
	}
	off := NewStore(apply(t, st, Disable()))
	if err := off.Check("nobody", Write, RangeSpan(nil, nil)); err != nil {
		t.Fatalf("disabled: %v", err)
	}
}
