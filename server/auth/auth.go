package auth

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RootRole is the built-in role that allows everything: every key, and the
// Admin and Auth services. It holds no permissions of its own, is not stored
// among the roles of an AuthState, and cannot be added, deleted or granted
// permissions.
const RootRole = "root"

// RootUser is the user that must exist, holding RootRole, for auth to be
// enabled; while auth is enabled it cannot be deleted nor lose RootRole.
const RootUser = "root"

// NodeUser is the identity of another node of the cluster (node-to-node
// calls). It is never a valid user name (it starts with a NUL byte), has no
// user record, and IsRoot(NodeUser) is true.
const NodeUser = "\x00node"

// MaxNameBytes is the longest user or role name, in bytes.
const MaxNameBytes = 128

// MaxPasswordBytes is the longest password: bcrypt reads no further.
const MaxPasswordBytes = 72

// DefaultPasswordCost is the bcrypt work factor of password hashes unless
// the node is configured otherwise. bcrypt.DefaultCost (10) costs about
// 64 ms of one core per hash or check on the project's reference machine:
// slow enough to make an offline guess expensive, cheap enough because a
// client authenticates once per token, not once per request.
const DefaultPasswordCost = bcrypt.DefaultCost

// ValidName reports why name is not a valid user or role name (nil if it
// is): 1 to MaxNameBytes bytes of valid UTF-8 made of printable characters
// other than spaces and ':' (which separates user from password in
// "user:password" on the command line).
func ValidName(name string) error {
	if name == "" {
		return fmt.Errorf("the name is empty")
	}
	if len(name) > MaxNameBytes {
		return fmt.Errorf("the name %q is %d bytes, longer than %d", name, len(name), MaxNameBytes)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("the name %q is not valid UTF-8", name)
	}
	for _, r := range name {
		switch {
		case r == ':':
			return fmt.Errorf("the name %q contains ':'", name)
		case unicode.IsSpace(r):
			return fmt.Errorf("the name %q contains a space", name)
		case !unicode.IsPrint(r):
			return fmt.Errorf("the name %q contains the non-printable character %U", name, r)
		}
	}
	return nil
}

func invalidArg(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func notFound(format string, args ...any) error {
	return status.Errorf(codes.NotFound, format, args...)
}

func alreadyExists(format string, args ...any) error {
	return status.Errorf(codes.AlreadyExists, format, args...)
}

func failedPrecondition(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, format, args...)
}

func unauthenticated(format string, args ...any) error {
	return status.Errorf(codes.Unauthenticated, format, args...)
}
