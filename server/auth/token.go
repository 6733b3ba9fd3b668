package auth

import (
	"errors"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// tokenAlg is the only signing algorithm tokens may use.
var tokenAlg = jwt.SigningMethodEdDSA

// claims are the claims of a token: sub (the user), iat, exp, and gen, the
// user's token generation when the token was issued (absent in node
// tokens).
type claims struct {
	jwt.RegisteredClaims
	Gen *uint64 `json:"gen,omitempty"`
}

// IssueToken signs a token for user with the newest signing key, valid from
// now for ttl (at least a second; the expiry is rounded down to the second,
// as JWT stores it) and returns it with its expiry. FailedPrecondition
// without signing key, NotFound for an unknown user, InvalidArgument for a
// ttl under a second. It does not check the password (CheckPassword does).
func (s *Store) IssueToken(user string, now time.Time, ttl time.Duration) (token string, expires time.Time, err error) {
	e := s.users[user]
	if e == nil {
		return "", time.Time{}, notFound("user %q does not exist", user)
	}
	gen := e.user.GetTokenGeneration()
	if s.signer == nil {
		return "", time.Time{}, failedPrecondition("no token signing key (auth was never enabled)")
	}
	if ttl < time.Second {
		return "", time.Time{}, invalidArg("token lifetime %v is under a second", ttl)
	}
	exp := jwt.NewNumericDate(now.Add(ttl))
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   user,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: exp,
		},
		Gen: &gen,
	}
	t := jwt.NewWithClaims(tokenAlg, c)
	t.Header["kid"] = s.signerID
	signed, err := t.SignedString(s.signer)
	if err != nil {
		return "", time.Time{}, status.Errorf(codes.Internal, "signing a token for user %q: %v", user, err)
	}
	return signed, exp.Time, nil
}

var errUnknownKey = errors.New("token signed by an unknown key")

// VerifyToken checks a token at time now and returns its user and when the
// token expires (so that a verified token can be remembered until then).
// It accepts only EdDSA tokens signed by one of the state's
// signing keys (named by the "kid" header), not expired at now (no leeway:
// nodes' clocks are assumed close, and a token's lifetime is long against
// their skew), whose user still exists with the token generation stamped in
// the token. Otherwise it returns an Unauthenticated status error whose
// message says what is wrong: "malformed token", "token algorithm ... is
// refused", "token signed by an unknown key", "token signature is invalid",
// "token expired", "user X no longer exists", "the password of X changed
// since the token was issued". It does not consult Enabled.
func (s *Store) VerifyToken(token string, now time.Time) (user string, expires time.Time, err error) {
	var c claims
	p := jwt.NewParser(
		jwt.WithValidMethods([]string{tokenAlg.Alg()}),
		jwt.WithTimeFunc(func() time.Time { return now }),
		jwt.WithExpirationRequired(),
		jwt.WithStrictDecoding(),
	)
	t, err := p.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		if k, ok := s.verify[kid]; ok {
			return k, nil
		}
		return nil, errUnknownKey
	})
	if err != nil {
		return "", time.Time{}, tokenError(t, err)
	}
	var exp time.Time
	if c.ExpiresAt != nil {
		exp = c.ExpiresAt.Time
	}
	user = c.Subject
	if user == "" || c.Gen == nil {
		return "", exp, unauthenticated("malformed token: no user or no generation")
	}
	e := s.users[user]
	if e == nil {
		return "", exp, unauthenticated("user %q no longer exists", user)
	}
	if e.user.GetTokenGeneration() != *c.Gen {
		return "", exp, unauthenticated("the password of %q changed since the token was issued", user)
	}
	return user, exp, nil
}

// tokenError turns a parse error into the Unauthenticated error that says
// what is wrong, most specific reason first.
func tokenError(t *jwt.Token, err error) error {
	switch {
	case errors.Is(err, errUnknownKey):
		return unauthenticated("token signed by an unknown key")
	case errors.Is(err, jwt.ErrTokenMalformed):
		return unauthenticated("malformed token")
	case t != nil && t.Method != nil && t.Method.Alg() != tokenAlg.Alg():
		return unauthenticated("token algorithm %q is refused: only %s is accepted", t.Method.Alg(), tokenAlg.Alg())
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return unauthenticated("malformed token: no known signing algorithm")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return unauthenticated("token signature is invalid")
	case errors.Is(err, jwt.ErrTokenExpired):
		return unauthenticated("token expired")
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return unauthenticated("token not valid yet")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return unauthenticated("malformed token: no expiry")
	}
	return unauthenticated("malformed token: %v", err)
}
