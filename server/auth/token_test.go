package auth

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

const ttl = 5 * time.Minute

func issue(t *testing.T, s *Store, user string) string {
	t.Helper()
	tok, exp, err := s.IssueToken(user, t0, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if !exp.Equal(t0.Add(ttl)) {
		t.Fatalf("expires %v, want %v", exp, t0.Add(ttl))
	}
	return tok
}

func wantUser(t *testing.T, s *Store, tok string, now time.Time, want string) {
	t.Helper()
	got, exp, err := s.VerifyToken(tok, now)
	if err != nil {
		t.Fatalf("VerifyToken: %v", err)
	}
	if !now.Before(exp) {
		t.Fatalf("VerifyToken: expiry %v not after %v", exp, now)
	}
	if got != want {
		t.Fatalf("VerifyToken = %q, want %q", got, want)
	}
}

func TestTokenRoundTrip(t *testing.T) {
	s := NewStore(rootState(t))
	tok := issue(t, s, "alice")
	wantUser(t, s, tok, t0, "alice")
	wantUser(t, s, tok, t0.Add(ttl-time.Nanosecond), "alice")

	// The token is a JWT with the documented header and claims.
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q", tok)
	}
	var header map[string]any
	var body map[string]any
	for i, v := range []*map[string]any{&header, &body} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	if header["alg"] != "EdDSA" || header["kid"] != s.State().SigningKeys[0].Id {
		t.Fatalf("header %v", header)
	}
	if body["sub"] != "alice" || body["iat"] != float64(t0.Unix()) || body["exp"] != float64(t0.Add(ttl).Unix()) ||
		body["gen"] != float64(user(s.State(), "alice").TokenGeneration) {
		t.Fatalf("claims %v", body)
	}

	// A token verifies on another node, whose Store is built from a copy
	// of the same state.
	other := NewStore(apply(t, s.State(), AddRole("unrelated")))
	wantUser(t, other, tok, t0, "alice")

	// Issuing needs a known user, a key and a ttl of at least a second.
	if _, _, err := s.IssueToken("nobody", t0, ttl); err == nil {
		t.Fatal("a token for an unknown user")
	}
	_, _, err := s.IssueToken("alice", t0, time.Millisecond)
	wantStatus(t, err, codes.InvalidArgument)
	_, _, err = NewStore(apply(t, nil, must(t)(AddUser("alice", "pw", false, testCost)))).IssueToken("alice", t0, ttl)
	wantStatus(t, err, codes.FailedPrecondition)
}

func TestTokenExpiry(t *testing.T) {
	s := NewStore(rootState(t))
	// exp holds whole seconds: the expiry is rounded down.
	tok, exp, err := s.IssueToken("alice", t0.Add(300*time.Millisecond), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(10 * time.Second); !exp.Equal(want) {
		t.Fatalf("expires %v, want %v", exp, want)
	}
	wantUser(t, s, tok, exp.Add(-time.Nanosecond), "alice")
	_, _, err = s.VerifyToken(tok, exp)
	wantStatus(t, err, codes.Unauthenticated, "token expired")
	_, _, err = s.VerifyToken(tok, exp.Add(time.Hour))
	wantStatus(t, err, codes.Unauthenticated, "token expired")
}

func TestTokenKeys(t *testing.T) {
	st := rootState(t)
	s := NewStore(st)
	tok := issue(t, s, "alice")

	// Another cluster's key is unknown here.
	foreign := NewStore(rootState(t))
	_, _, err := foreign.VerifyToken(tok, t0)
	wantStatus(t, err, codes.Unauthenticated, "token signed by an unknown key")

	// A token with this key's ID signed by another key has a bad signature.
	forged := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"sub": "root", "exp": t0.Add(ttl).Unix(), "gen": 1})
	forged.Header["kid"] = st.SigningKeys[0].Id
	_, priv, _ := ed25519.GenerateKey(nil)
	ftok, err := forged.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.VerifyToken(ftok, t0)
	wantStatus(t, err, codes.Unauthenticated, "token signature is invalid")

	// Rotations: the previous key still verifies, the one before does not.
	st1 := apply(t, st, must(t)(RotateKey(t0)))
	s1 := NewStore(st1)
	wantUser(t, s1, tok, t0, "alice")
	tok1 := issue(t, s1, "alice")
	if kid := tokenKid(t, tok1); kid != st1.SigningKeys[0].Id || kid == st.SigningKeys[0].Id {
		t.Fatalf("new token signed by %q", kid)
	}
	st2 := apply(t, st1, must(t)(RotateKey(t0)))
	s2 := NewStore(st2)
	_, _, err = s2.VerifyToken(tok, t0)
	wantStatus(t, err, codes.Unauthenticated, "token signed by an unknown key")
	wantUser(t, s2, tok1, t0, "alice")
	st3 := apply(t, st2, must(t)(RotateKey(t0)))
	_, _, err = NewStore(st3).VerifyToken(tok1, t0)
	wantStatus(t, err, codes.Unauthenticated, "token signed by an unknown key")
}

func tokenKid(t *testing.T, tok string) string {
	t.Helper()
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
	if err != nil {
		t.Fatal(err)
	}
	kid, _ := parsed.Header["kid"].(string)
	return kid
}

func TestTokenTampered(t *testing.T) {
	s := NewStore(rootState(t))
	tok := issue(t, s, "alice")
	parts := strings.Split(tok, ".")

	// The payload changed to another user.
	body, _ := base64.RawURLEncoding.DecodeString(parts[1])
	body = []byte(strings.Replace(string(body), `"alice"`, `"root"`, 1))
	bad := parts[0] + "." + base64.RawURLEncoding.EncodeToString(body) + "." + parts[2]
	_, _, err := s.VerifyToken(bad, t0)
	wantStatus(t, err, codes.Unauthenticated, "token signature is invalid")

	// A flipped signature bit.
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[10] ^= 1
	_, _, err = s.VerifyToken(parts[0]+"."+parts[1]+"."+base64.RawURLEncoding.EncodeToString(sig), t0)
	wantStatus(t, err, codes.Unauthenticated, "token signature is invalid")

	// Non-canonical base64 of the same signature (the last character's
	// unused bits set) is refused: only the issued string verifies.
	last := parts[2][len(parts[2])-1]
	i := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", last)
	alt := parts[2][:len(parts[2])-1] + string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[i|1])
	if alt != parts[2] {
		_, _, err = s.VerifyToken(parts[0]+"."+parts[1]+"."+alt, t0)
		wantStatus(t, err, codes.Unauthenticated, "malformed token")
	}

	for _, junk := range []string{"", "a", "a.b", "a.b.c", "a.b.c.d", tok + "x", "." + tok, "Bearer " + tok} {
		_, _, err = s.VerifyToken(junk, t0)
		wantStatus(t, err, codes.Unauthenticated)
	}
	_, _, err = s.VerifyToken("a.b.c", t0)
	wantStatus(t, err, codes.Unauthenticated, "malformed token")
}

func TestTokenAlgorithmsRefused(t *testing.T) {
	st := rootState(t)
	s := NewStore(st)
	kid := st.SigningKeys[0].Id
	claims := jwt.MapClaims{"sub": "root", "exp": t0.Add(ttl).Unix(), "iat": t0.Unix(), "gen": user(st, "root").TokenGeneration}

	none := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
	none.Header["kid"] = kid
	ntok, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.VerifyToken(ntok, t0)
	wantStatus(t, err, codes.Unauthenticated, `"none"`, "refused")

	// HS256 keyed with the public key, the classic confusion attack.
	pub := ed25519.NewKeyFromSeed(st.SigningKeys[0].Ed25519Seed).Public().(ed25519.PublicKey)
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	hs.Header["kid"] = kid
	htok, err := hs.SignedString([]byte(pub))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.VerifyToken(htok, t0)
	wantStatus(t, err, codes.Unauthenticated, `"HS256"`, "refused")

	// An unknown algorithm.
	h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"XX1","kid":"` + kid + `"}`))
	b := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"root"}`))
	_, _, err = s.VerifyToken(h+"."+b+".AAAA", t0)
	wantStatus(t, err, codes.Unauthenticated, "malformed token")

	// Without exp, a correctly signed token is refused.
	noexp := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"sub": "root", "gen": user(st, "root").TokenGeneration})
	noexp.Header["kid"] = kid
	etok, err := noexp.SignedString(ed25519.NewKeyFromSeed(st.SigningKeys[0].Ed25519Seed))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.VerifyToken(etok, t0)
	wantStatus(t, err, codes.Unauthenticated, "malformed token")
}

func TestTokenUserChanges(t *testing.T) {
	st := rootState(t)
	s := NewStore(st)
	tok := issue(t, s, "alice")
	rtok := issue(t, s, "root")

	// Deleted user.
	_, _, err := NewStore(apply(t, st, DeleteUser("alice"))).VerifyToken(tok, t0)
	wantStatus(t, err, codes.Unauthenticated, `user "alice" no longer exists`)

	// Deleted and added again.
	readded := NewStore(apply(t, st, DeleteUser("alice"), must(t)(AddUser("alice", "alicepw", false, testCost))))
	_, _, err = readded.VerifyToken(tok, t0)
	wantStatus(t, err, codes.Unauthenticated, `"alice"`)

	// Changed password: alice's old token stops working, new ones work, and
	// root's token is not affected.
	changed := NewStore(apply(t, st, must(t)(ChangePassword("alice", "new", testCost))))
	_, _, err = changed.VerifyToken(tok, t0)
	wantStatus(t, err, codes.Unauthenticated, `the password of "alice" changed since the token was issued`)
	wantUser(t, changed, issue(t, changed, "alice"), t0, "alice")
	wantUser(t, changed, rtok, t0, "root")

	// Role changes do not touch tokens: the check uses the current roles.
	wantUser(t, NewStore(apply(t, st, RevokeRole("alice", "reader"))), tok, t0, "alice")

	// A user renamed into the token by hand has no generation to match.
	noGen := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"sub": "alice", "exp": t0.Add(ttl).Unix()})
	noGen.Header["kid"] = st.SigningKeys[0].Id
	ng, _ := noGen.SignedString(ed25519.NewKeyFromSeed(st.SigningKeys[0].Ed25519Seed))
	_, _, err = s.VerifyToken(ng, t0)
	wantStatus(t, err, codes.Unauthenticated, "malformed token")
}

// TestNodeUserHasNoTokens: NodeUser, the identity of other nodes (proven
// by their certificates), is root, no user, and gets no token; a token
// naming it does not verify.
func TestNodeUserHasNoTokens(t *testing.T) {
	st := rootState(t)
	s := NewStore(st)
	if !s.IsRoot(NodeUser) || s.HasUser(NodeUser) {
		t.Fatal("NodeUser")
	}
	if _, _, err := s.IssueToken(NodeUser, t0, ttl); err == nil {
		t.Fatal("a token for NodeUser")
	}
	forged := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"sub": NodeUser, "exp": t0.Add(ttl).Unix()})
	forged.Header["kid"] = st.SigningKeys[0].Id
	tok, _ := forged.SignedString(ed25519.NewKeyFromSeed(st.SigningKeys[0].Ed25519Seed))
	_, _, err := s.VerifyToken(tok, t0)
	wantStatus(t, err, codes.Unauthenticated, "malformed token")
}

func TestCheckPassword(t *testing.T) {
	s := NewStore(rootState(t))
	if err := s.CheckPassword("alice", "alicepw"); err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, c := range []struct{ name, pw string }{
		{"alice", "wrong"},
		{"alice", ""},
		{"alice", "alicepw" + strings.Repeat("x", MaxPasswordBytes)},
		{"nobody", "alicepw"},
		{"bob", ""}, // no password
		{"bob", "anything"},
		{NodeUser, ""},
	} {
		err := s.CheckPassword(c.name, c.pw)
		wantStatus(t, err, codes.Unauthenticated, "wrong user name or password")
		msgs = append(msgs, err.Error())
	}
	for _, m := range msgs {
		if m != msgs[0] {
			t.Fatalf("messages differ: %q and %q", m, msgs[0])
		}
	}
	// The dummy hash costs what a real one does.
	c1, _ := bcrypt.Cost(s.dummyPasswordHash())
	c2, _ := bcrypt.Cost(user(s.State(), "alice").PasswordHash)
	if c1 != c2 {
		t.Fatalf("dummy hash cost %d, real %d", c1, c2)
	}
	// A password of exactly MaxPasswordBytes works.
	long := strings.Repeat("p", MaxPasswordBytes)
	s2 := NewStore(apply(t, s.State(), must(t)(ChangePassword("alice", long, testCost))))
	if err := s2.CheckPassword("alice", long); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s2.CheckPassword("alice", long+"p"), codes.Unauthenticated)
}

// TestPasswordCost checks that hashes are made at the cost asked for, that
// the default is bcrypt's, and that a cost out of bcrypt's range is
// refused.
func TestPasswordCost(t *testing.T) {
	if DefaultPasswordCost != bcrypt.DefaultCost {
		t.Fatalf("DefaultPasswordCost %d", DefaultPasswordCost)
	}
	st := apply(t, nil, must(t)(AddUser("carol", "pw", false, testCost+1)))
	if c, err := bcrypt.Cost(user(st, "carol").PasswordHash); err != nil || c != testCost+1 {
		t.Fatalf("cost %d, %v", c, err)
	}
	if _, err := AddUser("dave", "pw", false, bcrypt.MaxCost+1); err == nil || !strings.Contains(err.Error(), "bcrypt cost") {
		t.Fatalf("cost out of range: %v", err)
	}
}

// TestStoreIgnoresWhatItCannotUse builds a Store from an unvalidated
// state: bad keys and missing roles are skipped, not fatal.
func TestStoreIgnoresWhatItCannotUse(t *testing.T) {
	st := &shalev1.AuthState{
		Enabled: true,
		Users:   []*shalev1.User{{Name: "u", Roles: []string{"ghost", "r"}}},
		Roles: []*shalev1.Role{{Name: "r", Permissions: []*shalev1.Permission{
			perm(pRead, "a", "", false), perm(0, "b", "", false), perm(pRead, "d", "c", false),
		}}},
		SigningKeys: []*shalev1.SigningKey{{Id: "short", Ed25519Seed: []byte{1}}, {Id: ""}},
	}
	s := NewStore(st)
	if err := s.Check("u", Read, KeySpan([]byte("a"))); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s.Check("u", Read, KeySpan([]byte("b"))), codes.PermissionDenied)
	wantStatus(t, s.Check("u", Read, KeySpan([]byte("c"))), codes.PermissionDenied)
	if _, _, err := s.IssueToken("u", t0, ttl); err == nil {
		t.Fatal("signed with a bad key")
	}
}
