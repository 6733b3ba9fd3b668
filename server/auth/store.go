package auth

import (
	"crypto/ed25519"
	"slices"
	"strings"
	"sync"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Perm is what a request needs on a span: Read, Write, or both
// (Read|Write).
type Perm uint8

const (
	// Read is reading keys (get, scan, watch).
	Read Perm = 1
	// Write is writing keys (put, delete, delete range).
	Write Perm = 2
)

func (p Perm) String() string {
	switch p {
	case Read:
		return "read"
	case Write:
		return "write"
	case Read | Write:
		return "read and write"
	}
	return "invalid permission"
}

// Store is an immutable view of one AuthState, indexed for the checks of
// every request. Its methods are safe for concurrent use. A new state needs
// a new Store.
type Store struct {
	st    *shalev1.AuthState
	users map[string]*userEntry
	// verify maps a signing key's ID to its public key; signer is the
	// newest key (nil without keys).
	verify   map[string]ed25519.PublicKey
	signer   ed25519.PrivateKey
	signerID string
	// dummy is the hash checked for unknown users (dummyPasswordHash).
	dummyOnce sync.Once
	dummy     []byte
}

type userEntry struct {
	user  *shalev1.User
	root  bool
	perms *mergedPerms // nil for root
}

// mergedPerms is the union of the permissions of a set of roles, as one
// span set for reading and one for writing.
type mergedPerms struct {
	read, write spanSet
}

// NewStore indexes st, which the caller must not modify afterwards: for
// each user, the union of its roles' permissions becomes two sorted span
// sets (read and write), shared by the users that hold the same roles, so
// that Check costs one binary search. nil is the empty state (disabled,
// revision 0). NewStore does not validate st (Edit does); it ignores what
// it cannot use (roles that do not exist, signing keys of the wrong size).
func NewStore(st *shalev1.AuthState) *Store {
	if st == nil {
		st = &shalev1.AuthState{}
	}
	s := &Store{
		st:     st,
		users:  make(map[string]*userEntry, len(st.GetUsers())),
		verify: make(map[string]ed25519.PublicKey, len(st.GetSigningKeys())),
	}
	roles := make(map[string]*shalev1.Role, len(st.GetRoles()))
	for _, r := range st.GetRoles() {
		roles[r.GetName()] = r
	}
	byRoles := make(map[string]*mergedPerms) // key: the sorted role names, NUL-separated
	for _, u := range st.GetUsers() {
		e := &userEntry{user: u, root: slices.Contains(u.GetRoles(), RootRole)}
		s.users[u.GetName()] = e
		if e.root {
			continue
		}
		held := slices.Clone(u.GetRoles())
		slices.Sort(held)
		held = slices.Compact(held)
		k := strings.Join(held, "\x00")
		if e.perms = byRoles[k]; e.perms == nil {
			e.perms = mergePerms(roles, held)
			byRoles[k] = e.perms
		}
	}
	for _, k := range st.GetSigningKeys() {
		if len(k.GetEd25519Seed()) != ed25519.SeedSize || k.GetId() == "" {
			continue
		}
		if _, dup := s.verify[k.GetId()]; dup {
			continue
		}
		priv := ed25519.NewKeyFromSeed(k.GetEd25519Seed())
		s.verify[k.GetId()] = priv.Public().(ed25519.PublicKey)
		if s.signer == nil {
			s.signer, s.signerID = priv, k.GetId()
		}
	}
	return s
}

func mergePerms(roles map[string]*shalev1.Role, held []string) *mergedPerms {
	var read, write []Span
	for _, name := range held {
		for _, p := range roles[name].GetPermissions() {
			if ValidatePermission(p) != nil {
				continue
			}
			sp := PermissionSpan(p)
			switch p.GetType() {
			case shalev1.PermissionType_PERMISSION_TYPE_READ:
				read = append(read, sp)
			case shalev1.PermissionType_PERMISSION_TYPE_WRITE:
				write = append(write, sp)
			case shalev1.PermissionType_PERMISSION_TYPE_READWRITE:
				read = append(read, sp)
				write = append(write, sp)
			}
		}
	}
	return &mergedPerms{read: newSpanSet(read), write: newSpanSet(write)}
}

// Enabled reports whether auth is enabled.
func (s *Store) Enabled() bool { return s.st.GetEnabled() }

// Revision is the revision of the state.
func (s *Store) Revision() uint64 { return s.st.GetRevision() }

// State is the state the Store was built from (an empty one for nil). The
// caller must not modify it.
func (s *Store) State() *shalev1.AuthState { return s.st }

// HasUser reports whether user name exists (false for NodeUser).
func (s *Store) HasUser(name string) bool { return s.users[name] != nil }

// User is the record of user name, nil if there is none. The caller must
// not modify it.
func (s *Store) User(name string) *shalev1.User {
	if e := s.users[name]; e != nil {
		return e.user
	}
	return nil
}

// Roles is a copy of the roles user holds, sorted (nil for an unknown user
// and for NodeUser).
func (s *Store) Roles(user string) []string {
	if e := s.users[user]; e != nil {
		return slices.Clone(e.user.GetRoles())
	}
	return nil
}

// IsRoot reports whether user holds the root role, or is NodeUser.
func (s *Store) IsRoot(user string) bool {
	if user == NodeUser {
		return true
	}
	e := s.users[user]
	return e != nil && e.root
}

// Check returns nil if user may do perm on every key of sp: while auth is
// disabled, for NodeUser and root users always; for the others, if the
// union of their roles' permissions of that type covers sp (an empty span
// always is covered). Otherwise it returns a PermissionDenied status error
// that names the user, the missing permission and the span, and the first
// key of the span that is not covered. Its cost is a map look-up and one
// binary search per permission type in the user's merged spans.
func (s *Store) Check(user string, perm Perm, sp Span) error {
	if !s.Enabled() || user == NodeUser {
		return nil
	}
	if perm == 0 || perm&^(Read|Write) != 0 {
		return status.Errorf(codes.Internal, "auth: checking the invalid permission %d", perm)
	}
	e := s.users[user]
	if e == nil {
		return status.Errorf(codes.PermissionDenied, "user %q does not exist", user)
	}
	if e.root {
		return nil
	}
	for _, p := range []Perm{Read, Write} {
		if perm&p == 0 {
			continue
		}
		set := e.perms.read
		if p == Write {
			set = e.perms.write
		}
		if ok, gap := set.covers(sp); !ok {
			if sp.isKey() {
				return status.Errorf(codes.PermissionDenied, "user %q has no %s permission on %s", user, p, sp)
			}
			return status.Errorf(codes.PermissionDenied, "user %q has no %s permission on %s (the first key not covered is %q)",
				user, p, sp, gap)
		}
	}
	return nil
}

// errWrongPassword is the one answer to every failed password check.
var errWrongPassword = status.Error(codes.Unauthenticated, "wrong user name or password")

// dummyPasswordHash is a hash that no password matches, whose check costs
// what a user's does (the cost of the stored hashes); made on first use.
func (s *Store) dummyPasswordHash() []byte {
	s.dummyOnce.Do(func() {
		cost := DefaultPasswordCost
		for _, e := range s.users {
			if c, err := bcrypt.Cost(e.user.GetPasswordHash()); err == nil {
				cost = c
				break
			}
		}
		h, err := bcrypt.GenerateFromPassword([]byte("\x00 no password matches this hash \x00"), cost)
		if err != nil {
			// Only a cost out of range fails, and stored costs are
			// in range: compare against nothing (still refused).
			h = nil
		}
		s.dummy = h
	})
	return s.dummy
}

// CheckPassword returns nil if user name exists and has this password.
// Otherwise (unknown user, user without password, wrong password) it
// returns the same Unauthenticated error, "wrong user name or password",
// after the same bcrypt work: for an unknown user and a user without
// password, the password is checked against a dummy hash.
func (s *Store) CheckPassword(name, password string) error {
	var hash []byte
	if e := s.users[name]; e != nil {
		hash = e.user.GetPasswordHash()
	}
	known := len(hash) > 0
	if !known {
		hash = s.dummyPasswordHash()
	}
	// bcrypt reads only the first MaxPasswordBytes bytes: a longer password
	// was never set, so it is wrong even if its beginning matches.
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	if err != nil || !known || len(password) > MaxPasswordBytes {
		return errWrongPassword
	}
	return nil
}
