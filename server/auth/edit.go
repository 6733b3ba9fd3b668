package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"slices"
	"sort"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// MaxSigningKeys is how many signing keys RotateKey keeps: the new one and
// the one before it.
const MaxSigningKeys = 2

// Change is one edit of an AuthState, applied by Edit to a clone of the
// current state. When it runs, st.Revision already holds the new revision.
// A Change must be deterministic and cheap: Edit may run it again on a newer
// state after a compare-and-set conflict.
type Change func(st *shalev1.AuthState) error

// Edit returns the state that follows cur after ch: a clone of cur (nil is
// the empty state: disabled, revision 0, no users, roles nor keys) with
// revision cur.revision+1, changed by ch, its users and roles sorted by name
// and each user's roles sorted, and checked against the invariants (see the
// package documentation). cur is never modified.
//
// Errors are gRPC status errors: InvalidArgument for a bad name or
// permission, NotFound for an unknown user, role or permission,
// AlreadyExists, FailedPrecondition when the root rule would break (enabling
// without user root holding role root; deleting user root or revoking its
// role root while enabled). A state that breaks another invariant (possible
// only with a Change written outside this package, or a corrupt cur) is
// refused with InvalidArgument.
func Edit(cur *shalev1.AuthState, ch Change) (*shalev1.AuthState, error) {
	if ch == nil {
		return nil, status.Error(codes.Internal, "auth: Edit with a nil change")
	}
	var next *shalev1.AuthState
	if cur == nil {
		next = &shalev1.AuthState{}
	} else {
		next = proto.Clone(cur).(*shalev1.AuthState)
	}
	if next.Revision == math.MaxUint64 {
		return nil, failedPrecondition("the auth state is at the last revision (%d)", next.Revision)
	}
	rev := next.Revision + 1
	next.Revision = rev
	if err := ch(next); err != nil {
		return nil, err
	}
	next.Revision = rev
	normalize(next)
	if err := Validate(next); err != nil {
		return nil, err
	}
	return next, nil
}

// normalize sorts the users and roles by name, and each user's roles.
func normalize(st *shalev1.AuthState) {
	sort.SliceStable(st.Users, func(i, j int) bool { return st.Users[i].GetName() < st.Users[j].GetName() })
	sort.SliceStable(st.Roles, func(i, j int) bool { return st.Roles[i].GetName() < st.Roles[j].GetName() })
	for _, u := range st.Users {
		if u != nil {
			sort.Strings(u.Roles)
		}
	}
}

// Validate checks the invariants of a state (see the package
// documentation): valid and unique names; no stored role named root; users
// hold only roles that exist (or root), each once; valid permissions;
// signing keys with unique IDs and 32-byte seeds; and, while enabled, user
// root holding role root and a signing key. It returns a FailedPrecondition
// status error for the root rule, InvalidArgument for the others.
func Validate(st *shalev1.AuthState) error {
	roles := make(map[string]bool, len(st.GetRoles()))
	for _, r := range st.GetRoles() {
		if r == nil {
			return invalidArg("invalid auth state: a nil role")
		}
		if err := ValidName(r.GetName()); err != nil {
			return invalidArg("invalid auth state: role: %v", err)
		}
		if r.GetName() == RootRole {
			return invalidArg("invalid auth state: role %q is built in and cannot be stored", RootRole)
		}
		if roles[r.GetName()] {
			return invalidArg("invalid auth state: role %q appears twice", r.GetName())
		}
		roles[r.GetName()] = true
		for _, p := range r.GetPermissions() {
			if err := ValidatePermission(p); err != nil {
				return invalidArg("invalid auth state: role %q: %s", r.GetName(), status.Convert(err).Message())
			}
		}
	}
	users := make(map[string]*shalev1.User, len(st.GetUsers()))
	for _, u := range st.GetUsers() {
		if u == nil {
			return invalidArg("invalid auth state: a nil user")
		}
		if err := ValidName(u.GetName()); err != nil {
			return invalidArg("invalid auth state: user: %v", err)
		}
		if users[u.GetName()] != nil {
			return invalidArg("invalid auth state: user %q appears twice", u.GetName())
		}
		users[u.GetName()] = u
		held := make(map[string]bool, len(u.GetRoles()))
		for _, r := range u.GetRoles() {
			if r != RootRole && !roles[r] {
				return invalidArg("invalid auth state: user %q holds role %q, which does not exist", u.GetName(), r)
			}
			if held[r] {
				return invalidArg("invalid auth state: user %q holds role %q twice", u.GetName(), r)
			}
			held[r] = true
		}
		if h := u.GetPasswordHash(); len(h) > 0 {
			if _, err := bcrypt.Cost(h); err != nil {
				return invalidArg("invalid auth state: user %q: the password hash is not a bcrypt hash: %v", u.GetName(), err)
			}
		}
	}
	keys := make(map[string]bool, len(st.GetSigningKeys()))
	for _, k := range st.GetSigningKeys() {
		if k == nil || k.GetId() == "" {
			return invalidArg("invalid auth state: a signing key without ID")
		}
		if keys[k.GetId()] {
			return invalidArg("invalid auth state: signing key %q appears twice", k.GetId())
		}
		keys[k.GetId()] = true
		if len(k.GetEd25519Seed()) != ed25519.SeedSize {
			return invalidArg("invalid auth state: signing key %q: the seed is %d bytes, not %d",
				k.GetId(), len(k.GetEd25519Seed()), ed25519.SeedSize)
		}
	}
	if st.GetEnabled() {
		root := users[RootUser]
		if root == nil {
			return failedPrecondition("auth is enabled, so user %q must exist", RootUser)
		}
		if !slices.Contains(root.GetRoles(), RootRole) {
			return failedPrecondition("auth is enabled, so user %q must hold role %q", RootUser, RootRole)
		}
		if len(keys) == 0 {
			return failedPrecondition("auth is enabled, so there must be a signing key")
		}
	}
	return nil
}

func findUser(st *shalev1.AuthState, name string) (int, *shalev1.User) {
	for i, u := range st.Users {
		if u.GetName() == name {
			return i, u
		}
	}
	return -1, nil
}

func findRole(st *shalev1.AuthState, name string) (int, *shalev1.Role) {
	for i, r := range st.Roles {
		if r.GetName() == name {
			return i, r
		}
	}
	return -1, nil
}

func userNotFound(name string) error { return notFound("user %q does not exist", name) }
func roleNotFound(name string) error { return notFound("role %q does not exist", name) }

// errChange is a Change that always fails with err: it carries the error
// of an argument found wrong before any state is seen.
func errChange(err error) Change {
	return func(*shalev1.AuthState) error { return err }
}

// hashPassword checks a password and hashes it with bcrypt at cost.
func hashPassword(user, password string, cost int) ([]byte, error) {
	if password == "" {
		return nil, invalidArg("user %q: the password is empty", user)
	}
	if len(password) > MaxPasswordBytes {
		return nil, invalidArg("user %q: the password is %d bytes, longer than %d", user, len(password), MaxPasswordBytes)
	}
	if cost < bcrypt.MinCost || cost > bcrypt.MaxCost {
		return nil, invalidArg("bcrypt cost %d: want %d to %d", cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "user %q: hashing the password: %v", user, err)
	}
	return h, nil
}

// AddUser adds user name with a password (hashed here, once, with bcrypt at
// cost, DefaultPasswordCost unless an operator chose otherwise), or, with noPassword, without one (the user then authenticates only with a
// client certificate, and password must be empty). The user starts with no
// role. InvalidArgument for a bad name or password; the Change fails with
// AlreadyExists if the user exists.
func AddUser(name, password string, noPassword bool, cost int) (Change, error) {
	if err := ValidName(name); err != nil {
		return nil, invalidArg("user: %v", err)
	}
	var hash []byte
	if noPassword {
		if password != "" {
			return nil, invalidArg("user %q: a user without password is given a password", name)
		}
	} else {
		var err error
		if hash, err = hashPassword(name, password, cost); err != nil {
			return nil, err
		}
	}
	return func(st *shalev1.AuthState) error {
		if _, u := findUser(st, name); u != nil {
			return alreadyExists("user %q already exists", name)
		}
		// The generation starts at the new revision, higher than any
		// generation an earlier user of the same name had: the tokens of a
		// deleted user never work for a new user of the same name.
		st.Users = append(st.Users, &shalev1.User{
			Name:            name,
			PasswordHash:    slices.Clone(hash),
			TokenGeneration: st.Revision,
		})
		return nil
	}, nil
}

// DeleteUser removes user name; its tokens stop verifying. NotFound if there
// is no such user; FailedPrecondition for user root while auth is enabled.
func DeleteUser(name string) Change {
	return func(st *shalev1.AuthState) error {
		i, u := findUser(st, name)
		if u == nil {
			return userNotFound(name)
		}
		if name == RootUser && st.Enabled {
			return failedPrecondition("user %q cannot be deleted while auth is enabled", RootUser)
		}
		st.Users = slices.Delete(st.Users, i, i+1)
		return nil
	}
}

// ChangePassword sets the password of user name (hashed here, once, with
// bcrypt at cost), which
// may have had none, and bumps its token generation so that the tokens
// issued before stop verifying. InvalidArgument for a bad password; the
// Change fails with NotFound if there is no such user.
func ChangePassword(name, password string, cost int) (Change, error) {
	hash, err := hashPassword(name, password, cost)
	if err != nil {
		return nil, err
	}
	return func(st *shalev1.AuthState) error {
		_, u := findUser(st, name)
		if u == nil {
			return userNotFound(name)
		}
		u.PasswordHash = slices.Clone(hash)
		u.TokenGeneration = max(u.TokenGeneration+1, st.Revision)
		return nil
	}, nil
}

// GrantRole gives role to user. NotFound for an unknown user or role (root
// always exists); AlreadyExists if the user holds it.
func GrantRole(user, role string) Change {
	return func(st *shalev1.AuthState) error {
		_, u := findUser(st, user)
		if u == nil {
			return userNotFound(user)
		}
		if role != RootRole {
			if _, r := findRole(st, role); r == nil {
				return roleNotFound(role)
			}
		}
		if slices.Contains(u.Roles, role) {
			return alreadyExists("user %q already holds role %q", user, role)
		}
		u.Roles = append(u.Roles, role)
		return nil
	}
}

// RevokeRole takes role from user. NotFound for an unknown user or if the
// user does not hold the role; FailedPrecondition for role root of user root
// while auth is enabled.
func RevokeRole(user, role string) Change {
	return func(st *shalev1.AuthState) error {
		_, u := findUser(st, user)
		if u == nil {
			return userNotFound(user)
		}
		i := slices.Index(u.Roles, role)
		if i < 0 {
			return notFound("user %q does not hold role %q", user, role)
		}
		if user == RootUser && role == RootRole && st.Enabled {
			return failedPrecondition("role %q cannot be revoked from user %q while auth is enabled", RootRole, RootUser)
		}
		u.Roles = slices.Delete(u.Roles, i, i+1)
		return nil
	}
}

// AddRole adds a role without permissions. InvalidArgument for a bad name;
// AlreadyExists if it exists, root included.
func AddRole(name string) Change {
	if err := ValidName(name); err != nil {
		return errChange(invalidArg("role: %v", err))
	}
	return func(st *shalev1.AuthState) error {
		if name == RootRole {
			return alreadyExists("role %q is built in", RootRole)
		}
		if _, r := findRole(st, name); r != nil {
			return alreadyExists("role %q already exists", name)
		}
		st.Roles = append(st.Roles, &shalev1.Role{Name: name})
		return nil
	}
}

// DeleteRole removes a role and takes it from every user that holds it.
// InvalidArgument for root; NotFound if there is no such role.
func DeleteRole(name string) Change {
	return func(st *shalev1.AuthState) error {
		if name == RootRole {
			return invalidArg("role %q is built in and cannot be deleted", RootRole)
		}
		i, r := findRole(st, name)
		if r == nil {
			return roleNotFound(name)
		}
		st.Roles = slices.Delete(st.Roles, i, i+1)
		for _, u := range st.Users {
			u.Roles = slices.DeleteFunc(u.Roles, func(s string) bool { return s == name })
		}
		return nil
	}
}

// GrantPermission adds p (stored as given, after ValidatePermission) to a
// role; granting a permission the role has, identical in every field, again
// changes nothing. InvalidArgument for a bad permission or for role root
// (which allows everything); NotFound if there is no such role.
func GrantPermission(role string, p *shalev1.Permission) Change {
	if err := ValidatePermission(p); err != nil {
		return errChange(status.Errorf(codes.InvalidArgument, "role %q: %s", role, status.Convert(err).Message()))
	}
	p = proto.Clone(p).(*shalev1.Permission)
	return func(st *shalev1.AuthState) error {
		if role == RootRole {
			return invalidArg("role %q allows everything and holds no permissions", RootRole)
		}
		_, r := findRole(st, role)
		if r == nil {
			return roleNotFound(role)
		}
		for _, q := range r.Permissions {
			if samePermission(p, q) {
				return nil
			}
		}
		r.Permissions = append(r.Permissions, proto.Clone(p).(*shalev1.Permission))
		return nil
	}
}

// RevokePermission removes from a role the permission identical to p in
// every field (type included). NotFound if there is no such role or the
// role has no such permission.
func RevokePermission(role string, p *shalev1.Permission) Change {
	if p == nil {
		return errChange(invalidArg("role %q: the permission is missing", role))
	}
	p = proto.Clone(p).(*shalev1.Permission)
	return func(st *shalev1.AuthState) error {
		if role == RootRole {
			return notFound("role %q holds no permissions", RootRole)
		}
		_, r := findRole(st, role)
		if r == nil {
			return roleNotFound(role)
		}
		i := slices.IndexFunc(r.Permissions, func(q *shalev1.Permission) bool { return samePermission(p, q) })
		if i < 0 {
			return notFound("role %q has no permission %s", role, describePermission(p))
		}
		r.Permissions = slices.Delete(r.Permissions, i, i+1)
		return nil
	}
}

// newSigningKey makes a random Ed25519 signing key, named by a hash of its
// public key.
func newSigningKey(now time.Time) (*shalev1.SigningKey, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, status.Errorf(codes.Internal, "making a signing key: %v", err)
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	return &shalev1.SigningKey{
		Id:               hex.EncodeToString(sum[:8]),
		Ed25519Seed:      seed,
		CreatedUnixNanos: now.UnixNano(),
	}, nil
}

// Enable turns auth on. The key it makes here, once, becomes the signing
// key if the state has none. The Change fails with FailedPrecondition
// unless user root exists and holds role root. Enabling an enabled state
// succeeds (and only bumps the revision).
func Enable(now time.Time) (Change, error) {
	key, err := newSigningKey(now)
	if err != nil {
		return nil, err
	}
	return func(st *shalev1.AuthState) error {
		_, root := findUser(st, RootUser)
		if root == nil {
			return failedPrecondition("auth cannot be enabled: user %q does not exist", RootUser)
		}
		if !slices.Contains(root.Roles, RootRole) {
			return failedPrecondition("auth cannot be enabled: user %q does not hold role %q", RootUser, RootRole)
		}
		if len(st.SigningKeys) == 0 {
			st.SigningKeys = []*shalev1.SigningKey{proto.Clone(key).(*shalev1.SigningKey)}
		}
		st.Enabled = true
		return nil
	}, nil
}

// Disable turns auth off: every caller may then do everything. Users, roles
// and keys stay. Disabling a disabled state succeeds.
func Disable() Change {
	return func(st *shalev1.AuthState) error {
		st.Enabled = false
		return nil
	}
}

// RotateKey makes a new signing key here, once; the Change puts it first
// (it signs the tokens issued from then on) and keeps the MaxSigningKeys
// newest keys: tokens signed by the key before stay valid, tokens signed by
// older keys stop verifying.
func RotateKey(now time.Time) (Change, error) {
	key, err := newSigningKey(now)
	if err != nil {
		return nil, err
	}
	return func(st *shalev1.AuthState) error {
		for _, k := range st.SigningKeys {
			if k.GetId() == key.Id {
				return alreadyExists("signing key %q already exists", key.Id)
			}
		}
		keys := append([]*shalev1.SigningKey{proto.Clone(key).(*shalev1.SigningKey)}, st.SigningKeys...)
		st.SigningKeys = keys[:min(len(keys), MaxSigningKeys)]
		return nil
	}, nil
}
