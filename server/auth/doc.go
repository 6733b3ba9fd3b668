// Package auth is the logic of Shale's authentication and access control:
// users, roles, permissions on key ranges, passwords and tokens. It does no
// I/O and keeps no mutable state: the server stores the state, replicates
// it, and calls this package to change it (Edit), to index it (NewStore) and
// to check requests against it (Store).
//
// # The state
//
// The whole of auth is one shalev1.AuthState, a single record of the
// replicated system shard, replaced whole by every change. Its revision
// counts the changes: Edit returns the state that follows, with revision+1,
// and the server stores it only if the stored revision is still the one it
// edited (compare-and-set). On a conflict the server reads the new state
// and runs the same Change again, so a Change is cheap and deterministic:
// the expensive and random work (bcrypt hashing, key generation) happens
// once, in the constructor that returns it (AddUser, ChangePassword, Enable,
// RotateKey). Edit never modifies the state it is given.
//
// A state that Edit returns satisfies these invariants (Validate):
//
//   - user and role names are valid (ValidName: 1 to 128 bytes of
//     printable UTF-8 without spaces or ':') and unique; users and roles are
//     sorted by name, and each user's roles too;
//   - no stored role is named "root"; a user holds only roles that exist,
//     or root, each once;
//   - every permission is valid (ValidatePermission);
//   - signing keys have unique IDs and 32-byte Ed25519 seeds;
//   - while enabled: user "root" exists and holds role "root", and there is
//     a signing key (the root rule).
//
// Errors are gRPC status errors whose messages name the user, role or
// permission: InvalidArgument for a bad name or permission, NotFound,
// AlreadyExists, FailedPrecondition for the root rule.
//
// # Users and roles
//
// A user has a bcrypt password hash (or none: such a user authenticates
// only with a client certificate whose common name is its name), a list of
// roles, and a token generation. A role is a named list of permissions.
// Deleting a role takes it from every user.
//
// The role root is built in: it allows everything (every key, and the
// Admin and Auth services), holds no permissions, and cannot be added,
// deleted, or granted permissions. RootUser ("root") is the user that must
// hold it while auth is enabled: enabling needs it, and while enabled it can
// neither be deleted nor lose the role.
//
// NodeUser is the identity of the other nodes of the cluster in
// node-to-node calls. Its name starts with a NUL byte, so no user can have
// it; it has no record, and it may do everything.
//
// # Permissions are spans
//
// A permission allows READ, WRITE or READWRITE on one key, on a range
// [key, range_end), or on every key with a prefix (an empty prefix: every
// key). PermissionSpan turns it into a Span, a half-open interval of keys
// in bytewise order whose End nil means no upper bound (a prefix of only
// 0xff bytes has none). Requests are checked on spans too: KeySpan for one
// key, RangeSpan for a scan, PrefixSpan for a prefix scan.
//
// NewStore merges, for each distinct set of roles, the spans of all their
// permissions into two sorted lists of disjoint, non-touching spans, one
// for read and one for write. Between two such spans there is always a key
// (the end of the first), so a request's span is allowed exactly when it
// lies inside one merged span: Check is one binary search, O(log n) in the
// number of merged spans, and never looks at the roles. A span that several
// permissions cover only together (say [a, c) and [c, e) for [b, d)) is
// allowed. A permission's rights only add up: there is no deny.
//
// While auth is disabled, Check allows everything. While enabled, it allows
// root users and NodeUser everything, refuses unknown users, and refuses a
// span not covered with PermissionDenied naming the user, "read" or "write",
// the span, and the first key not covered.
//
// # Passwords
//
// Passwords are 1 to 72 bytes (bcrypt's limit) and stored as bcrypt hashes
// of cost bcrypt.DefaultCost (10; about 64 ms of one core). CheckPassword
// gives the same Unauthenticated error, "wrong user name or password",
// after the same bcrypt work, for an unknown user, a user without password
// and a wrong password, so neither the message nor the time tells which
// names exist.
//
// # Tokens
//
// A token is a JWT signed with EdDSA (Ed25519) by the newest signing key,
// whose ID is in the "kid" header; its claims are sub (the user), iat, exp
// and gen (the user's token generation). VerifyToken accepts only EdDSA
// (not "none", not HMAC), only keys that the state still has, only before
// exp (no leeway, against the caller's clock), and only if the user still
// exists with the same generation. So:
//
//   - deleting a user revokes its tokens at once;
//   - a password change bumps the generation and so revokes the user's
//     earlier tokens at once;
//   - a new user starts at the generation of the revision that added it,
//     so the tokens of an earlier user of the same name never work for it;
//   - RotateKey puts a new key first and keeps the two newest: the tokens
//     signed by the key before stay valid until they expire, and the tokens
//     signed by a key that a second rotation drops stop verifying.
//
// Every failure is Unauthenticated, with a message that says what is
// wrong ("token expired", "token signed by an unknown key", ...).
//
// A Store never changes: the server builds a new one for each new state
// and swaps it in, and a check sees one state from start to end.
package auth
