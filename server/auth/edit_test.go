package auth

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func user(st *shalev1.AuthState, name string) *shalev1.User {
	_, u := findUser(st, name)
	return u
}

func role(st *shalev1.AuthState, name string) *shalev1.Role {
	_, r := findRole(st, name)
	return r
}

// disabledState is rootState with auth disabled.
func disabledState(t testing.TB) *shalev1.AuthState {
	return apply(t, rootState(t), Disable())
}

func ok(ch Change) func(testing.TB) (Change, error) {
	return func(testing.TB) (Change, error) { return ch, nil }
}

// TestEdit runs every Change on a known state: its success, and each of its
// errors, with the code and the names the message must carry. For each
// case it checks that Edit left its input alone and, on success, that the
// revision went up by one and the result is valid.
func TestEdit(t *testing.T) {
	longName := strings.Repeat("x", MaxNameBytes)
	cases := []struct {
		name string
		st   func(testing.TB) *shalev1.AuthState // nil: rootState
		ch   func(testing.TB) (Change, error)
		// ctorCode is the constructor's expected error code, code Edit's.
		ctorCode, code codes.Code
		msg            []string
		check          func(t *testing.T, before, after *shalev1.AuthState)
	}{
		// AddUser
		{name: "AddUser", ch: func(testing.TB) (Change, error) { return AddUser("carol", "pw", false, testCost) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				u := user(after, "carol")
				if u == nil || len(u.Roles) != 0 || len(u.PasswordHash) == 0 {
					t.Fatalf("carol = %v", u)
				}
				if u.TokenGeneration != after.Revision {
					t.Fatalf("generation %d, want the revision %d", u.TokenGeneration, after.Revision)
				}
				if err := NewStore(after).CheckPassword("carol", "pw"); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "AddUser no password", ch: func(testing.TB) (Change, error) { return AddUser("dave", "", true, testCost) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if u := user(after, "dave"); u == nil || len(u.PasswordHash) != 0 {
					t.Fatalf("dave = %v", u)
				}
			}},
		{name: "AddUser longest name and unicode", ch: func(t testing.TB) (Change, error) {
			return func(st *shalev1.AuthState) error {
				if err := must(t)(AddUser(longName, "pw", false, testCost))(st); err != nil {
					return err
				}
				return must(t)(AddUser("zoë-ünïcode_1.2@x", "pw", false, testCost))(st)
			}, nil
		}},
		{name: "AddUser exists", ch: func(testing.TB) (Change, error) { return AddUser("alice", "pw", false, testCost) },
			code: codes.AlreadyExists, msg: []string{`"alice"`}},
		{name: "AddUser empty name", ch: func(testing.TB) (Change, error) { return AddUser("", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{"empty"}},
		{name: "AddUser long name", ch: func(testing.TB) (Change, error) { return AddUser(longName+"y", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{"longer than 128"}},
		{name: "AddUser space", ch: func(testing.TB) (Change, error) { return AddUser("a b", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{`"a b"`, "space"}},
		{name: "AddUser unicode space", ch: func(testing.TB) (Change, error) { return AddUser("a\u00a0b", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{"space"}},
		{name: "AddUser colon", ch: func(testing.TB) (Change, error) { return AddUser("a:b", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{`"a:b"`, "':'"}},
		{name: "AddUser control", ch: func(testing.TB) (Change, error) { return AddUser("a\x07", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{"non-printable"}},
		{name: "AddUser node user", ch: func(testing.TB) (Change, error) { return AddUser(NodeUser, "pw", false, testCost) },
			ctorCode: codes.InvalidArgument},
		{name: "AddUser bad UTF-8", ch: func(testing.TB) (Change, error) { return AddUser("a\xffb", "pw", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{"UTF-8"}},
		{name: "AddUser no password given", ch: func(testing.TB) (Change, error) { return AddUser("carol", "", false, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{`"carol"`, "empty"}},
		{name: "AddUser no-password user with password", ch: func(testing.TB) (Change, error) { return AddUser("carol", "pw", true, testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{`"carol"`}},
		{name: "AddUser password too long", ch: func(testing.TB) (Change, error) {
			return AddUser("carol", strings.Repeat("p", MaxPasswordBytes+1), false, testCost)
		}, ctorCode: codes.InvalidArgument, msg: []string{"longer than 72"}},

		// DeleteUser
		{name: "DeleteUser", ch: ok(DeleteUser("alice")),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if user(after, "alice") != nil || len(after.Users) != len(before.Users)-1 {
					t.Fatalf("users %v", after.Users)
				}
			}},
		{name: "DeleteUser unknown", ch: ok(DeleteUser("nobody")), code: codes.NotFound, msg: []string{`"nobody"`}},
		{name: "DeleteUser root enabled", ch: ok(DeleteUser(RootUser)), code: codes.FailedPrecondition, msg: []string{`"root"`}},
		{name: "DeleteUser root disabled", st: disabledState, ch: ok(DeleteUser(RootUser)),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if user(after, RootUser) != nil {
					t.Fatal("root still there")
				}
			}},

		// ChangePassword
		{name: "ChangePassword", ch: func(testing.TB) (Change, error) { return ChangePassword("alice", "new", testCost) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				b, a := user(before, "alice"), user(after, "alice")
				if a.TokenGeneration <= b.TokenGeneration {
					t.Fatalf("generation %d -> %d", b.TokenGeneration, a.TokenGeneration)
				}
				s := NewStore(after)
				if err := s.CheckPassword("alice", "new"); err != nil {
					t.Fatal(err)
				}
				wantStatus(t, s.CheckPassword("alice", "alicepw"), codes.Unauthenticated)
			}},
		{name: "ChangePassword gives a password", ch: func(testing.TB) (Change, error) { return ChangePassword("bob", "bobpw", testCost) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if err := NewStore(after).CheckPassword("bob", "bobpw"); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "ChangePassword unknown", ch: func(testing.TB) (Change, error) { return ChangePassword("nobody", "pw", testCost) },
			code: codes.NotFound, msg: []string{`"nobody"`}},
		{name: "ChangePassword empty", ch: func(testing.TB) (Change, error) { return ChangePassword("alice", "", testCost) },
			ctorCode: codes.InvalidArgument, msg: []string{`"alice"`}},

		// GrantRole
		{name: "GrantRole", ch: ok(GrantRole("alice", "writer")),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if got := user(after, "alice").Roles; !slices.Equal(got, []string{"reader", "writer"}) {
					t.Fatalf("roles %v", got)
				}
			}},
		{name: "GrantRole root", ch: ok(GrantRole("bob", RootRole)),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if !NewStore(after).IsRoot("bob") {
					t.Fatal("bob is not root")
				}
			}},
		{name: "GrantRole held", ch: ok(GrantRole("alice", "reader")), code: codes.AlreadyExists, msg: []string{`"alice"`, `"reader"`}},
		{name: "GrantRole unknown user", ch: ok(GrantRole("nobody", "reader")), code: codes.NotFound, msg: []string{`"nobody"`}},
		{name: "GrantRole unknown role", ch: ok(GrantRole("alice", "norole")), code: codes.NotFound, msg: []string{`"norole"`}},

		// RevokeRole
		{name: "RevokeRole", ch: ok(RevokeRole("alice", "reader")),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if got := user(after, "alice").Roles; len(got) != 0 {
					t.Fatalf("roles %v", got)
				}
			}},
		{name: "RevokeRole not held", ch: ok(RevokeRole("alice", "writer")), code: codes.NotFound, msg: []string{`"alice"`, `"writer"`}},
		{name: "RevokeRole unknown user", ch: ok(RevokeRole("nobody", "reader")), code: codes.NotFound, msg: []string{`"nobody"`}},
		{name: "RevokeRole root from root enabled", ch: ok(RevokeRole(RootUser, RootRole)), code: codes.FailedPrecondition,
			msg: []string{`"root"`}},
		{name: "RevokeRole root from root disabled", st: disabledState, ch: ok(RevokeRole(RootUser, RootRole)),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if NewStore(after).IsRoot(RootUser) {
					t.Fatal("root is still root")
				}
			}},

		// AddRole
		{name: "AddRole", ch: ok(AddRole("admin")),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if r := role(after, "admin"); r == nil || len(r.Permissions) != 0 {
					t.Fatalf("admin = %v", r)
				}
			}},
		{name: "AddRole exists", ch: ok(AddRole("reader")), code: codes.AlreadyExists, msg: []string{`"reader"`}},
		{name: "AddRole root", ch: ok(AddRole(RootRole)), code: codes.AlreadyExists, msg: []string{`"root"`}},
		{name: "AddRole bad name", ch: ok(AddRole("a:b")), code: codes.InvalidArgument, msg: []string{`"a:b"`}},

		// DeleteRole
		{name: "DeleteRole takes it from users", st: func(t testing.TB) *shalev1.AuthState {
			return apply(t, rootState(t), GrantRole("bob", "reader"), GrantRole("bob", "writer"))
		}, ch: ok(DeleteRole("reader")),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if role(after, "reader") != nil {
					t.Fatal("reader still there")
				}
				for _, u := range after.Users {
					if slices.Contains(u.Roles, "reader") {
						t.Fatalf("user %q still holds reader", u.Name)
					}
				}
				if got := user(after, "bob").Roles; !slices.Equal(got, []string{"writer"}) {
					t.Fatalf("bob's roles %v", got)
				}
			}},
		{name: "DeleteRole unknown", ch: ok(DeleteRole("norole")), code: codes.NotFound, msg: []string{`"norole"`}},
		{name: "DeleteRole root", ch: ok(DeleteRole(RootRole)), code: codes.InvalidArgument, msg: []string{`"root"`}},

		// GrantPermission
		{name: "GrantPermission", ch: ok(GrantPermission("writer", perm(pRW, "x", "", false))),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if n := len(role(after, "writer").Permissions); n != 2 {
					t.Fatalf("%d permissions", n)
				}
			}},
		{name: "GrantPermission identical again", ch: ok(GrantPermission("reader", perm(pRead, "a", "", true))),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if !proto.Equal(role(before, "reader"), role(after, "reader")) {
					t.Fatalf("reader changed: %v", role(after, "reader"))
				}
			}},
		{name: "GrantPermission other type same span", ch: ok(GrantPermission("reader", perm(pWrite, "a", "", true))),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if n := len(role(after, "reader").Permissions); n != 2 {
					t.Fatalf("%d permissions", n)
				}
			}},
		{name: "GrantPermission everything", ch: ok(GrantPermission("writer", perm(pRW, "", "", true)))},
		{name: "GrantPermission range from the first key", ch: ok(GrantPermission("writer", perm(pRW, "", "k", false)))},
		{name: "GrantPermission no type", ch: ok(GrantPermission("writer", perm(0, "x", "", false))),
			code: codes.InvalidArgument, msg: []string{`"writer"`, "type"}},
		{name: "GrantPermission unknown type", ch: ok(GrantPermission("writer", perm(9, "x", "", false))),
			code: codes.InvalidArgument, msg: []string{"type"}},
		{name: "GrantPermission prefix and range_end", ch: ok(GrantPermission("writer", perm(pRead, "a", "b", true))),
			code: codes.InvalidArgument, msg: []string{`"writer"`, "exclusive"}},
		{name: "GrantPermission range_end = key", ch: ok(GrantPermission("writer", perm(pRead, "b", "b", false))),
			code: codes.InvalidArgument, msg: []string{`["b", "b")`, "greater"}},
		{name: "GrantPermission range_end < key", ch: ok(GrantPermission("writer", perm(pRead, "c", "b", false))),
			code: codes.InvalidArgument, msg: []string{`["c", "b")`}},
		{name: "GrantPermission empty key", ch: ok(GrantPermission("writer", perm(pRead, "", "", false))),
			code: codes.InvalidArgument, msg: []string{"needs a key"}},
		{name: "GrantPermission nil", ch: ok(GrantPermission("writer", nil)), code: codes.InvalidArgument},
		{name: "GrantPermission root", ch: ok(GrantPermission(RootRole, perm(pRead, "a", "", false))),
			code: codes.InvalidArgument, msg: []string{`"root"`}},
		{name: "GrantPermission unknown role", ch: ok(GrantPermission("norole", perm(pRead, "a", "", false))),
			code: codes.NotFound, msg: []string{`"norole"`}},

		// RevokePermission
		{name: "RevokePermission", ch: ok(RevokePermission("writer", perm(pWrite, "m", "p", false))),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if n := len(role(after, "writer").Permissions); n != 0 {
					t.Fatalf("%d permissions", n)
				}
			}},
		{name: "RevokePermission other type", ch: ok(RevokePermission("writer", perm(pRW, "m", "p", false))),
			code: codes.NotFound, msg: []string{`"writer"`, `["m", "p")`}},
		{name: "RevokePermission other span", ch: ok(RevokePermission("writer", perm(pWrite, "m", "o", false))),
			code: codes.NotFound, msg: []string{`"writer"`}},
		{name: "RevokePermission unknown role", ch: ok(RevokePermission("norole", perm(pWrite, "m", "p", false))),
			code: codes.NotFound, msg: []string{`"norole"`}},
		{name: "RevokePermission root", ch: ok(RevokePermission(RootRole, perm(pWrite, "m", "p", false))),
			code: codes.NotFound, msg: []string{`"root"`}},
		{name: "RevokePermission nil", ch: ok(RevokePermission("writer", nil)), code: codes.InvalidArgument},

		// Enable, Disable, RotateKey
		{name: "Enable", st: disabledState, ch: func(testing.TB) (Change, error) { return Enable(t0) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if !after.Enabled || !proto.Equal(&shalev1.AuthState{SigningKeys: before.SigningKeys},
					&shalev1.AuthState{SigningKeys: after.SigningKeys}) {
					t.Fatalf("enabled %v, keys %v -> %v", after.Enabled, before.SigningKeys, after.SigningKeys)
				}
			}},
		{name: "Enable makes a key", st: func(t testing.TB) *shalev1.AuthState {
			return apply(t, nil, must(t)(AddUser("root", "pw", false, testCost)), GrantRole("root", RootRole))
		}, ch: func(testing.TB) (Change, error) { return Enable(t0) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if !after.Enabled || len(after.SigningKeys) != 1 || len(after.SigningKeys[0].Ed25519Seed) != 32 ||
					after.SigningKeys[0].CreatedUnixNanos != t0.UnixNano() {
					t.Fatalf("after %v", after)
				}
			}},
		{name: "Enable enabled", ch: func(testing.TB) (Change, error) { return Enable(t0) }},
		{name: "Enable without root", st: func(t testing.TB) *shalev1.AuthState {
			return apply(t, nil, must(t)(AddUser("alice", "pw", false, testCost)))
		}, ch: func(testing.TB) (Change, error) { return Enable(t0) }, code: codes.FailedPrecondition, msg: []string{`user "root"`}},
		{name: "Enable root without root role", st: func(t testing.TB) *shalev1.AuthState {
			return apply(t, nil, must(t)(AddUser("root", "pw", false, testCost)), AddRole("r"), GrantRole("root", "r"))
		}, ch: func(testing.TB) (Change, error) { return Enable(t0) }, code: codes.FailedPrecondition, msg: []string{`role "root"`}},
		{name: "Enable empty state", st: func(testing.TB) *shalev1.AuthState { return nil },
			ch: func(testing.TB) (Change, error) { return Enable(t0) }, code: codes.FailedPrecondition},
		{name: "Disable", ch: ok(Disable()),
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if after.Enabled || len(after.SigningKeys) != 1 || len(after.Users) != len(before.Users) {
					t.Fatalf("after %v", after)
				}
			}},
		{name: "RotateKey", ch: func(testing.TB) (Change, error) { return RotateKey(t0) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if len(after.SigningKeys) != 2 || !proto.Equal(after.SigningKeys[1], before.SigningKeys[0]) {
					t.Fatalf("keys %v -> %v", before.SigningKeys, after.SigningKeys)
				}
			}},
		{name: "RotateKey keeps two", st: func(t testing.TB) *shalev1.AuthState {
			return apply(t, rootState(t), must(t)(RotateKey(t0)))
		}, ch: func(testing.TB) (Change, error) { return RotateKey(t0) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if len(after.SigningKeys) != 2 || !proto.Equal(after.SigningKeys[1], before.SigningKeys[0]) ||
					after.SigningKeys[0].Id == before.SigningKeys[0].Id {
					t.Fatalf("keys %v -> %v", before.SigningKeys, after.SigningKeys)
				}
			}},
		{name: "RotateKey without key", st: func(testing.TB) *shalev1.AuthState { return nil },
			ch: func(testing.TB) (Change, error) { return RotateKey(t0) },
			check: func(t *testing.T, before, after *shalev1.AuthState) {
				if len(after.SigningKeys) != 1 {
					t.Fatalf("keys %v", after.SigningKeys)
				}
			}},

		// Changes from outside the package are validated too.
		{name: "custom change breaking an invariant", ch: ok(func(st *shalev1.AuthState) error {
			st.Users = append(st.Users, &shalev1.User{Name: "alice"})
			return nil
		}), code: codes.InvalidArgument, msg: []string{`"alice"`, "twice"}},
		{name: "custom change dangling role", ch: ok(func(st *shalev1.AuthState) error {
			user(st, "bob").Roles = []string{"ghost"}
			return nil
		}), code: codes.InvalidArgument, msg: []string{`"bob"`, `"ghost"`}},
		{name: "custom change breaking the root rule", ch: ok(func(st *shalev1.AuthState) error {
			user(st, "root").Roles = nil
			return nil
		}), code: codes.FailedPrecondition},
		{name: "custom change cannot set the revision", ch: ok(func(st *shalev1.AuthState) error {
			st.Revision = 1000
			return nil
		})},
		{name: "nil change", ch: ok(nil), code: codes.Internal},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before *shalev1.AuthState
			if c.st == nil {
				before = rootState(t)
			} else {
				before = c.st(t)
			}
			snapshot := proto.Clone(before)
			ch, err := c.ch(t)
			if c.ctorCode != codes.OK {
				wantStatus(t, err, c.ctorCode, c.msg...)
				return
			}
			if err != nil {
				t.Fatalf("constructor: %v", err)
			}
			after, err := Edit(before, ch)
			if before != nil && !proto.Equal(before, snapshot) {
				t.Fatalf("Edit modified its input:\n%v\nwas\n%v", before, snapshot)
			}
			if c.code != codes.OK {
				wantStatus(t, err, c.code, c.msg...)
				if after != nil {
					t.Fatalf("a state with the error: %v", after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := before.GetRevision() + 1; after.Revision != want {
				t.Fatalf("revision %d, want %d", after.Revision, want)
			}
			if err := Validate(after); err != nil {
				t.Fatalf("invalid result: %v", err)
			}
			if c.check != nil {
				c.check(t, before, after)
			}
		})
	}
}

// TestEditSortsAndDoesNotAlias checks that users and roles come out sorted
// and that the new state shares no mutable memory with the old: changing
// the result leaves the input alone.
func TestEditSortsAndDoesNotAlias(t *testing.T) {
	st := rootState(t)
	st = apply(t, st, must(t)(AddUser("aaron", "pw", false, testCost)), AddRole("alpha"), GrantRole("aaron", "writer"), GrantRole("aaron", "alpha"))
	if !slices.IsSortedFunc(st.Users, func(a, b *shalev1.User) int { return strings.Compare(a.Name, b.Name) }) {
		t.Fatalf("users not sorted: %v", st.Users)
	}
	if !slices.IsSortedFunc(st.Roles, func(a, b *shalev1.Role) int { return strings.Compare(a.Name, b.Name) }) {
		t.Fatalf("roles not sorted: %v", st.Roles)
	}
	if got := user(st, "aaron").Roles; !slices.Equal(got, []string{"alpha", "writer"}) {
		t.Fatalf("aaron's roles %v", got)
	}
	snapshot := proto.Clone(st)
	next := apply(t, st, GrantPermission("reader", perm(pRead, "z", "", false)))
	role(next, "reader").Permissions[0].Key[0] = 'q'
	user(next, "alice").PasswordHash[0] ^= 1
	next.SigningKeys[0].Ed25519Seed[0] ^= 1
	if !proto.Equal(st, snapshot) {
		t.Fatal("changing the result of Edit changed its input")
	}
}

// TestEditRetry runs the same Change on two states, as the server does
// after a compare-and-set conflict: the hash made by the constructor is
// reused, and the Change sees the newer state.
func TestEditRetry(t *testing.T) {
	base := rootState(t)
	ch := must(t)(AddUser("carol", "pw", false, testCost))
	a := apply(t, base, ch)
	racer := apply(t, base, AddRole("other"))
	b := apply(t, racer, ch)
	if !bytes.Equal(user(a, "carol").PasswordHash, user(b, "carol").PasswordHash) {
		t.Fatal("the retried change hashed again")
	}
	if role(b, "other") == nil || b.Revision != racer.Revision+1 {
		t.Fatalf("retry lost the other change: %v", b)
	}
	// A conflicting retry fails as it should.
	if _, err := Edit(apply(t, base, must(t)(AddUser("carol", "x", false, testCost))), ch); err == nil {
		t.Fatal("adding carol twice worked")
	}
}

// TestEditFromNil checks the empty state.
func TestEditFromNil(t *testing.T) {
	st := apply(t, nil, AddRole("r"))
	if st.Revision != 1 || st.Enabled || len(st.Roles) != 1 {
		t.Fatalf("state %v", st)
	}
	s := NewStore(nil)
	if s.Enabled() || s.Revision() != 0 || s.State() == nil || s.HasUser("root") {
		t.Fatal("NewStore(nil) is not the empty state")
	}
}

// TestDeleteAndReaddUser checks that a user deleted and added again starts
// at a higher token generation than the one it had.
func TestDeleteAndReaddUser(t *testing.T) {
	st := rootState(t)
	gen := user(st, "alice").TokenGeneration
	st = apply(t, st, DeleteUser("alice"), must(t)(AddUser("alice", "alicepw", false, testCost)))
	if g := user(st, "alice").TokenGeneration; g <= gen {
		t.Fatalf("generation %d after re-adding, was %d", g, gen)
	}
}

// TestValidateNames covers ValidName directly.
func TestValidateNames(t *testing.T) {
	good := []string{"a", "root", "ROOT", "a-b_c.d@e/f", "日本", strings.Repeat("é", 64)}
	bad := []string{"", " ", "a b", "a\tb", "a:b", "a\x00", "\x7f", "a\u200bb" /* zero width space: format */, "\xc3", strings.Repeat("é", 65), NodeUser}
	for _, n := range good {
		if err := ValidName(n); err != nil {
			t.Errorf("ValidName(%q) = %v", n, err)
		}
	}
	for _, n := range bad {
		if ValidName(n) == nil {
			t.Errorf("ValidName(%q) = nil", n)
		}
	}
}
