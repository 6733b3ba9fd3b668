package main

// The auth, user and role commands (authentication and access control,
// shaped like etcdctl's), and the credentials of the global --user flag.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// Environment variables of the credentials.
const (
	userEnv     = "SHALE_USER"
	passwordEnv = "SHALE_PASSWORD"
)

// stdinKey is the context key of the reader that stands for stdin (tests
// pass one through run's context; otherwise os.Stdin).
type stdinKey struct{}

// stdinOf returns the command's stdin.
func stdinOf(cmd *cobra.Command) io.Reader {
	if ctx := cmd.Context(); ctx != nil {
		if r, ok := ctx.Value(stdinKey{}).(io.Reader); ok {
			return r
		}
	}
	return os.Stdin
}

// terminalOf returns stdin's file descriptor when stdin is a terminal.
func terminalOf(cmd *cobra.Command) (int, bool) {
	f, ok := stdinOf(cmd).(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0, false
	}
	return int(f.Fd()), true
}

// promptPassword asks for a password on the terminal fd, without echo,
// writing the prompt to stderr.
func promptPassword(cmd *cobra.Command, fd int, prompt string) (string, error) {
	w := cmd.ErrOrStderr()
	fmt.Fprint(w, prompt)
	b, err := term.ReadPassword(fd)
	fmt.Fprintln(w)
	if err != nil {
		return "", fmt.Errorf("read password: %w", err)
	}
	return string(b), nil
}

// readLine reads the first line of r (without its line ending).
func readLine(r io.Reader, what string) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("no %s: empty input", what)
		}
		return "", fmt.Errorf("read %s: %w", what, err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// credentials returns the client option of --user: the user name and the
// password from --user NAME:PASSWORD, --password-file, $SHALE_PASSWORD or,
// when stdin is a terminal, a prompt. No --user: none.
func (f *clusterFlags) credentials(cmd *cobra.Command) ([]client.Option, error) {
	if f.user == "" {
		if f.passwordFile != "" {
			return nil, &usageError{cmd: cmd, msg: "--password-file needs --user"}
		}
		return nil, nil
	}
	name, password, inFlag := strings.Cut(f.user, ":")
	if name == "" {
		return nil, &usageError{cmd: cmd, msg: "--user: empty user name (want NAME or NAME:PASSWORD)"}
	}
	switch {
	case inFlag:
		if f.passwordFile != "" {
			return nil, &usageError{cmd: cmd, msg: "--user NAME:PASSWORD and --password-file both give a password"}
		}
	case f.passwordFile != "":
		file, err := os.Open(f.passwordFile)
		if err != nil {
			return nil, fmt.Errorf("--password-file: %w", err)
		}
		password, err = readLine(file, "password in "+f.passwordFile)
		file.Close()
		if err != nil {
			return nil, fmt.Errorf("--password-file: %w", err)
		}
	case os.Getenv(passwordEnv) != "":
		password = os.Getenv(passwordEnv)
	default:
		fd, ok := terminalOf(cmd)
		if !ok {
			return nil, fmt.Errorf("no password for user %s: give --user %s:PASSWORD, --password-file FILE or $%s, or run in a terminal to be asked",
				name, name, passwordEnv)
		}
		var err error
		if password, err = promptPassword(cmd, fd, "Password for "+name+": "); err != nil {
			return nil, err
		}
	}
	return []client.Option{client.WithCredentials(name, password)}, nil
}

// authFlags are the flags of the auth, user and role commands.
type authFlags struct {
	*clusterFlags
	hex bool
}

func (f *authFlags) keys() keyFormat { return keyFormat{hex: f.hex} }

// authRun returns a RunE that validates -o, runs prepare (argument and
// password checks, before connecting; may be nil), then connects and runs
// fn.
func (f *authFlags) authRun(prepare func(cmd *cobra.Command, args []string) error,
	fn func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		asJSON, err := f.jsonOutput(cmd)
		if err != nil {
			return err
		}
		if prepare != nil {
			if err := prepare(cmd, args); err != nil {
				return err
			}
		}
		return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
			return fn(ctx, cmd, c, args, asJSON)
		})
	}
}

// done prints a mutation's result: msg, or with -o json the object v.
func done(cmd *cobra.Command, asJSON bool, v any, msg string) error {
	if asJSON {
		return output.WriteJSON(cmd.OutOrStdout(), v)
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), msg)
	return err
}

func newAuthCmd(cf *clusterFlags) *cobra.Command {
	f := &authFlags{clusterFlags: cf}
	enable := &cobra.Command{
		Use:   "enable",
		Short: "Turn authentication and access control on",
		Long: `enable turns the cluster's authentication and access control on: from then on
every call needs a user (--user, or a client certificate whose common name is
the user's name) and may do only what the user's roles allow. It fails unless
a user "root" with the role root exists (shalectl user add root; shalectl user
grant-role root root), and on a cluster without TLS. -o json prints
{"enabled": true}.`,
		Example: `  shalectl user add root
  shalectl user grant-role root root
  shalectl auth enable
  shalectl --user root auth status`,
		Args: noArgs,
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			if err := c.AuthEnable(ctx); err != nil {
				return fmt.Errorf("auth enable: %w", err)
			}
			return done(cmd, asJSON, map[string]bool{"enabled": true}, "authentication enabled")
		}),
	}
	disable := &cobra.Command{
		Use:   "disable",
		Short: "Turn authentication and access control off",
		Long: `disable turns the cluster's authentication and access control off: every caller
may then do everything. The users and roles stay. Needs the role root.
-o json prints {"enabled": false}.`,
		Example: `  shalectl --user root auth disable`,
		Args:    noArgs,
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			if err := c.AuthDisable(ctx); err != nil {
				return fmt.Errorf("auth disable: %w", err)
			}
			return done(cmd, asJSON, map[string]bool{"enabled": false}, "authentication disabled")
		}),
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show whether authentication is enabled, and who you are",
		Long: `status prints whether authentication is enabled, the revision of the auth state
(it counts the changes to users, roles and the setting), and the user the
cluster takes the caller for, with its roles ("-" while auth is disabled).
Any user may ask. -o json prints the AuthStatusResponse message.`,
		Example: `  shalectl --user alice auth status`,
		Args:    noArgs,
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			st, err := c.AuthStatus(ctx)
			if err != nil {
				return fmt.Errorf("auth status: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), st)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintf(tw, "enabled:\t%s\n", yesNo(st.GetEnabled()))
			fmt.Fprintf(tw, "revision:\t%d\n", st.GetRevision())
			fmt.Fprintf(tw, "user:\t%s\n", orDash(st.GetUser()))
			fmt.Fprintf(tw, "roles:\t%s\n", list(st.GetRoles()))
			return tw.Flush()
		}),
	}
	rotate := &cobra.Command{
		Use:   "rotate-key",
		Short: "Make a new token signing key",
		Long: `rotate-key makes a new key to sign tokens with. Tokens signed with the earlier
keys stay valid until they expire; rotate again only after they have (10
minutes by default) to be sure a leaked key is out of use. Needs the role
root. -o json prints {"rotated": true}.`,
		Example: `  shalectl --user root auth rotate-key`,
		Args:    noArgs,
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			if err := c.AuthRotateKey(ctx); err != nil {
				return fmt.Errorf("auth rotate-key: %w", err)
			}
			return done(cmd, asJSON, map[string]bool{"rotated": true},
				"token signing key rotated (tokens signed with the earlier keys stay valid until they expire)")
		}),
	}
	cmd := &cobra.Command{Use: "auth", Short: "Turn authentication on and off, show its status",
		Args: noArgs, RunE: groupHelp}
	cmd.AddCommand(enable, disable, status, rotate)
	return cmd
}

// newPassword reads a new password for user: from stdin with fromStdin,
// else from a prompt with confirmation when stdin is a terminal.
func newPassword(cmd *cobra.Command, user string, fromStdin bool) (string, error) {
	var pw string
	if fromStdin {
		var err error
		if pw, err = readLine(stdinOf(cmd), "password on stdin"); err != nil {
			return "", err
		}
	} else {
		fd, ok := terminalOf(cmd)
		if !ok {
			return "", fmt.Errorf("no password for user %s: stdin is not a terminal; pass --password-stdin to read it from stdin", user)
		}
		var err error
		if pw, err = promptPassword(cmd, fd, "Password of "+user+": "); err != nil {
			return "", err
		}
		again, err := promptPassword(cmd, fd, "Type password of "+user+" again for confirmation: ")
		if err != nil {
			return "", err
		}
		if again != pw {
			return "", errors.New("the passwords differ")
		}
	}
	if pw == "" {
		return "", fmt.Errorf("empty password for user %s", user)
	}
	return pw, nil
}

func newUserCmd(cf *clusterFlags) *cobra.Command {
	f := &authFlags{clusterFlags: cf}
	var (
		noPassword, addStdin bool
		name, password       string
	)
	add := &cobra.Command{
		Use:   "add NAME[:PASSWORD]",
		Short: "Add a user",
		Long: `add adds user NAME. Its password is PASSWORD when given as NAME:PASSWORD; with
--password-stdin the first line of stdin; otherwise it is asked for twice on
the terminal, without echo. With --no-password the user has no password and
authenticates only with a client certificate whose common name is NAME
(shalectl cert create-client NAME). A new user has no roles. Needs the role
root once authentication is enabled. -o json prints {"user": NAME, "added": true}.`,
		Example: `  shalectl user add root
  shalectl user add alice --password-stdin < alice.pw
  shalectl user add backup-agent --no-password`,
		Args: exactArgs("NAME[:PASSWORD]"),
		RunE: f.authRun(func(cmd *cobra.Command, args []string) error {
			var inArg bool
			name, password, inArg = strings.Cut(args[0], ":")
			switch {
			case name == "":
				return &usageError{cmd: cmd, msg: "empty user name"}
			case noPassword && (inArg || addStdin):
				return &usageError{cmd: cmd, msg: "--no-password with a password"}
			case inArg && addStdin:
				return &usageError{cmd: cmd, msg: "NAME:PASSWORD and --password-stdin both give a password"}
			case noPassword:
				return nil
			case inArg:
				if password == "" {
					return fmt.Errorf("empty password for user %s", name)
				}
				return nil
			}
			var err error
			password, err = newPassword(cmd, name, addStdin)
			return err
		}, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			if err := c.UserAdd(ctx, name, password, noPassword); err != nil {
				return fmt.Errorf("user add %s: %w", name, err)
			}
			return done(cmd, asJSON, struct {
				User  string `json:"user"`
				Added bool   `json:"added"`
			}{name, true}, "user "+name+" added")
		}),
	}
	add.Flags().BoolVar(&noPassword, "no-password", false, "the user has no password (it authenticates by client certificate)")
	add.Flags().BoolVar(&addStdin, "password-stdin", false, "read the password from the first line of stdin")

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a user",
		Long: `delete removes user NAME; its tokens stop working at once. Needs the role root.
-o json prints {"user": NAME, "deleted": true}.`,
		Example: `  shalectl --user root user delete alice`,
		Args:    exactArgs("NAME"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			if err := c.UserDelete(ctx, args[0]); err != nil {
				return fmt.Errorf("user delete %s: %w", args[0], err)
			}
			return done(cmd, asJSON, struct {
				User    string `json:"user"`
				Deleted bool   `json:"deleted"`
			}{args[0], true}, "user "+args[0]+" deleted")
		}),
	}

	var passwdStdin bool
	var newPW string
	passwd := &cobra.Command{
		Use:   "passwd NAME",
		Short: "Change a user's password",
		Long: `passwd sets user NAME's password: asked for twice on the terminal, without
echo, or with --password-stdin the first line of stdin. The user's earlier
tokens stop working at once. Needs the role root. -o json prints
{"user": NAME, "password_changed": true}.`,
		Example: `  shalectl --user root user passwd alice
  printf '%s\n' "$NEW" | shalectl --user root user passwd alice --password-stdin`,
		Args: exactArgs("NAME"),
		RunE: f.authRun(func(cmd *cobra.Command, args []string) error {
			var err error
			newPW, err = newPassword(cmd, args[0], passwdStdin)
			return err
		}, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			if err := c.UserChangePassword(ctx, args[0], newPW); err != nil {
				return fmt.Errorf("user passwd %s: %w", args[0], err)
			}
			return done(cmd, asJSON, struct {
				User            string `json:"user"`
				PasswordChanged bool   `json:"password_changed"`
			}{args[0], true}, "password of user "+args[0]+" changed")
		}),
	}
	passwd.Flags().BoolVar(&passwdStdin, "password-stdin", false, "read the password from the first line of stdin")

	grant := &cobra.Command{
		Use:   "grant-role USER ROLE",
		Short: "Give a user a role",
		Long: `grant-role gives user USER the role ROLE (and so its permissions; the role root
allows everything). Needs the role root. -o json prints
{"user": USER, "role": ROLE, "granted": true}.`,
		Example: `  shalectl user grant-role root root
  shalectl --user root user grant-role alice reader`,
		Args: exactArgs("USER", "ROLE"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			if err := c.UserGrantRole(ctx, args[0], args[1]); err != nil {
				return fmt.Errorf("user grant-role %s %s: %w", args[0], args[1], err)
			}
			return done(cmd, asJSON, struct {
				User    string `json:"user"`
				Role    string `json:"role"`
				Granted bool   `json:"granted"`
			}{args[0], args[1], true}, fmt.Sprintf("role %s granted to user %s", args[1], args[0]))
		}),
	}
	revoke := &cobra.Command{
		Use:   "revoke-role USER ROLE",
		Short: "Take a role from a user",
		Long: `revoke-role takes the role ROLE from user USER. Needs the role root. -o json
prints {"user": USER, "role": ROLE, "revoked": true}.`,
		Example: `  shalectl --user root user revoke-role alice reader`,
		Args:    exactArgs("USER", "ROLE"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			if err := c.UserRevokeRole(ctx, args[0], args[1]); err != nil {
				return fmt.Errorf("user revoke-role %s %s: %w", args[0], args[1], err)
			}
			return done(cmd, asJSON, struct {
				User    string `json:"user"`
				Role    string `json:"role"`
				Revoked bool   `json:"revoked"`
			}{args[0], args[1], true}, fmt.Sprintf("role %s revoked from user %s", args[1], args[0]))
		}),
	}
	ls := &cobra.Command{
		Use:   "list",
		Short: "List the users",
		Long: `list prints one row per user: NAME, ROLES and PASSWORD (yes, or no for a user
that authenticates by client certificate only). Needs the role root. -o json
prints the UserListResponse message.`,
		Example: `  shalectl --user root user list`,
		Args:    noArgs,
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			users, err := c.UserList(ctx)
			if err != nil {
				return fmt.Errorf("user list: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.UserListResponse{Users: users})
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "NAME\tROLES\tPASSWORD")
			for _, u := range users {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", u.GetName(), list(u.GetRoles()), yesNo(u.GetHasPassword()))
			}
			return tw.Flush()
		}),
	}
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a user's roles",
		Long: `get prints user NAME's name, roles and whether it has a password. Needs the
role root. -o json prints the UserGetResponse message.`,
		Example: `  shalectl --user root user get alice`,
		Args:    exactArgs("NAME"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			u, err := c.UserGet(ctx, args[0])
			if err != nil {
				return fmt.Errorf("user get %s: %w", args[0], err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.UserGetResponse{User: u})
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintf(tw, "user:\t%s\n", u.GetName())
			fmt.Fprintf(tw, "roles:\t%s\n", list(u.GetRoles()))
			fmt.Fprintf(tw, "password:\t%s\n", yesNo(u.GetHasPassword()))
			return tw.Flush()
		}),
	}
	cmd := &cobra.Command{Use: "user", Short: "Add, delete and list users, set passwords and roles",
		Args: noArgs, RunE: groupHelp}
	cmd.AddCommand(add, del, passwd, grant, revoke, ls, get)
	return cmd
}

// permissionTypes are the permission type arguments.
var permissionTypes = map[string]shalev1.PermissionType{
	"read":      shalev1.PermissionType_PERMISSION_TYPE_READ,
	"write":     shalev1.PermissionType_PERMISSION_TYPE_WRITE,
	"readwrite": shalev1.PermissionType_PERMISSION_TYPE_READWRITE,
}

// permissionTypeName is the argument spelling of a permission type.
func permissionTypeName(t shalev1.PermissionType) string {
	for name, v := range permissionTypes {
		if v == t {
			return name
		}
	}
	return strings.ToLower(strings.TrimPrefix(t.String(), "PERMISSION_TYPE_"))
}

// permissionArgs parses ROLE TYPE KEY [END] (--prefix: no END).
func (f *authFlags) permissionArgs(cmd *cobra.Command, args []string, prefix bool) (string, *shalev1.Permission, error) {
	if len(args) < 3 || len(args) > 4 {
		return "", nil, &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes 3 or 4 arguments, ROLE TYPE KEY [END]; got %d", cmd.CommandPath(), len(args))}
	}
	typ, ok := permissionTypes[strings.ToLower(args[1])]
	if !ok {
		return "", nil, &usageError{cmd: cmd, msg: fmt.Sprintf("permission type %q: want read, write or readwrite", args[1])}
	}
	codec := f.keys().codec()
	key, err := codec.Parse(args[2])
	if err != nil {
		return "", nil, fmt.Errorf("KEY: %w", err)
	}
	p := &shalev1.Permission{Type: typ, Key: key, Prefix: prefix}
	if len(args) == 4 {
		if prefix {
			return "", nil, &usageError{cmd: cmd, msg: "--prefix takes no END"}
		}
		if p.RangeEnd, err = codec.Parse(args[3]); err != nil {
			return "", nil, fmt.Errorf("END: %w", err)
		}
		if bytes.Compare(p.RangeEnd, key) <= 0 {
			return "", nil, &usageError{cmd: cmd, msg: fmt.Sprintf("END %s does not sort after KEY %s", f.keys().format(p.RangeEnd), f.keys().format(key))}
		}
	}
	return args[0], p, nil
}

// quoted prints a key of a permission: quoted (Go syntax), or 0x-hex.
func (k keyFormat) quoted(b []byte) string {
	if k.hex {
		return "0x" + fmt.Sprintf("%x", b)
	}
	return strconv.Quote(string(b))
}

// permission prints a permission: `readwrite [a, b)`, `read prefix "user/"`,
// `write key "x"`.
func (k keyFormat) permission(p *shalev1.Permission) string {
	t := permissionTypeName(p.GetType())
	switch {
	case p.GetPrefix() && len(p.GetKey()) == 0:
		return t + ` prefix "" (every key)`
	case p.GetPrefix():
		return t + " prefix " + k.quoted(p.GetKey())
	case len(p.GetRangeEnd()) > 0:
		return fmt.Sprintf("%s [%s, %s)", t, k.format(p.GetKey()), k.format(p.GetRangeEnd()))
	}
	return t + " key " + k.quoted(p.GetKey())
}

// rolePermissions prints a role's permissions, one a line.
func (k keyFormat) rolePermissions(r *shalev1.Role) []string {
	if r.GetName() == "root" && len(r.GetPermissions()) == 0 {
		return []string{"everything (built-in role)"}
	}
	var out []string
	for _, p := range r.GetPermissions() {
		out = append(out, k.permission(p))
	}
	return out
}

// permissionRecord is the JSON form of a permission given on the command
// line: keys in the spelling of the kv commands.
type permissionRecord struct {
	Type     string `json:"type"`
	Key      string `json:"key"`
	RangeEnd string `json:"range_end,omitempty"`
	Prefix   bool   `json:"prefix"`
}

func (k keyFormat) permissionRecord(p *shalev1.Permission) permissionRecord {
	r := permissionRecord{Type: permissionTypeName(p.GetType()), Key: k.format(p.GetKey()), Prefix: p.GetPrefix()}
	if len(p.GetRangeEnd()) > 0 {
		r.RangeEnd = k.format(p.GetRangeEnd())
	}
	return r
}

func newRoleCmd(cf *clusterFlags) *cobra.Command {
	f := &authFlags{clusterFlags: cf}
	add := &cobra.Command{
		Use:   "add ROLE",
		Short: "Add a role",
		Long: `add adds role ROLE, without permissions (grant them with "role grant"). The role
root is built in. Needs the role root once authentication is enabled. -o json
prints {"role": ROLE, "added": true}.`,
		Example: `  shalectl --user root role add reader`,
		Args:    exactArgs("ROLE"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			if err := c.RoleAdd(ctx, args[0]); err != nil {
				return fmt.Errorf("role add %s: %w", args[0], err)
			}
			return done(cmd, asJSON, struct {
				Role  string `json:"role"`
				Added bool   `json:"added"`
			}{args[0], true}, "role "+args[0]+" added")
		}),
	}
	del := &cobra.Command{
		Use:   "delete ROLE",
		Short: "Delete a role",
		Long: `delete removes role ROLE and takes it from every user that held it. Needs the
role root. -o json prints {"role": ROLE, "deleted": true}.`,
		Example: `  shalectl --user root role delete reader`,
		Args:    exactArgs("ROLE"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			if err := c.RoleDelete(ctx, args[0]); err != nil {
				return fmt.Errorf("role delete %s: %w", args[0], err)
			}
			return done(cmd, asJSON, struct {
				Role    string `json:"role"`
				Deleted bool   `json:"deleted"`
			}{args[0], true}, "role "+args[0]+" deleted")
		}),
	}
	permCmd := func(grant bool) *cobra.Command {
		var (
			prefix bool
			role   string
			perm   *shalev1.Permission
		)
		use, verb, alias := "grant", "granted", "grant-permission"
		short := "Allow a role to read or write keys"
		long := `grant gives role ROLE permission TYPE (read, write or readwrite) on the key KEY,
on the range [KEY, END), or with --prefix on every key starting with KEY (""
with --prefix: every key). With --hex, KEY and END are hexadecimal. A user may
do what any of its roles allows. Needs the role root. -o json prints
{"role": ROLE, "permission": {"type", "key", "range_end", "prefix"}, "granted": true}.`
		example := `  shalectl --user root role grant reader read user/ --prefix
  shalectl --user root role grant app readwrite app/a app/m
  shalectl --user root role grant app write config/flag
  shalectl --user root role grant --hex raw read 00ff 0100`
		if !grant {
			use, verb, alias = "revoke", "revoked", "revoke-permission"
			short = "Take a permission from a role"
			long = `revoke removes role ROLE's permission TYPE on exactly the keys given (the same
KEY, END and --prefix it was granted with; it fails when the role has no such
permission). With --hex, KEY and END are hexadecimal. Needs the role root.
-o json prints {"role": ROLE, "permission": {...}, "revoked": true}.`
			example = `  shalectl --user root role revoke reader read user/ --prefix`
		}
		cmd := &cobra.Command{
			Use:     use + " ROLE read|write|readwrite KEY [END]",
			Aliases: []string{alias},
			Short:   short,
			Long:    long,
			Example: example,
			Args:    cobra.ArbitraryArgs,
			RunE: f.authRun(func(cmd *cobra.Command, args []string) error {
				var err error
				role, perm, err = f.permissionArgs(cmd, args, prefix)
				return err
			}, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
				var err error
				if grant {
					err = c.RoleGrantPermission(ctx, role, perm)
				} else {
					err = c.RoleRevokePermission(ctx, role, perm)
				}
				k := f.keys()
				if err != nil {
					return fmt.Errorf("role %s %s %s: %w", use, role, k.permission(perm), err)
				}
				rec := map[string]any{"role": role, "permission": k.permissionRecord(perm), verb: true}
				return done(cmd, asJSON, rec, fmt.Sprintf("role %s: %s %s", role, verb, k.permission(perm)))
			}),
		}
		cmd.Flags().BoolVar(&prefix, "prefix", false, "the keys starting with KEY")
		return cmd
	}
	ls := &cobra.Command{
		Use:   "list",
		Short: "List the roles with their permissions",
		Long: `list prints one row per permission of every role: ROLE and PERMISSION, as
"readwrite [a, b)" (a range), "read prefix "user/"" (a prefix) or
"write key "x"" (one key); "-" for a role without permissions. Needs the role
root. -o json prints the RoleListResponse message.`,
		Example: `  shalectl --user root role list`,
		Args:    noArgs,
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string, asJSON bool) error {
			roles, err := c.RoleList(ctx)
			if err != nil {
				return fmt.Errorf("role list: %w", err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.RoleListResponse{Roles: roles})
			}
			k := f.keys()
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "ROLE\tPERMISSION")
			for _, r := range roles {
				perms := k.rolePermissions(r)
				if len(perms) == 0 {
					perms = []string{"-"}
				}
				for _, p := range perms {
					fmt.Fprintf(tw, "%s\t%s\n", r.GetName(), p)
				}
			}
			return tw.Flush()
		}),
	}
	get := &cobra.Command{
		Use:   "get ROLE",
		Short: "Show a role's permissions",
		Long: `get prints role ROLE's permissions, one a line (as in "role list"). Needs the
role root. -o json prints the RoleGetResponse message.`,
		Example: `  shalectl --user root role get reader`,
		Args:    exactArgs("ROLE"),
		RunE: f.authRun(nil, func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string, asJSON bool) error {
			r, err := c.RoleGet(ctx, args[0])
			if err != nil {
				return fmt.Errorf("role get %s: %w", args[0], err)
			}
			if asJSON {
				return writeProtoJSON(cmd.OutOrStdout(), &shalev1.RoleGetResponse{Role: r})
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "role: %s\npermissions:", r.GetName())
			perms := f.keys().rolePermissions(r)
			if len(perms) == 0 {
				fmt.Fprint(out, " none")
			}
			fmt.Fprintln(out)
			for _, p := range perms {
				fmt.Fprintf(out, "  %s\n", p)
			}
			return nil
		}),
	}
	cmd := &cobra.Command{Use: "role", Short: "Add, delete and list roles, grant and revoke their permissions",
		Args: noArgs, RunE: groupHelp}
	cmd.PersistentFlags().BoolVar(&f.hex, "hex", false, "read KEY and END as hexadecimal and print permission keys as hexadecimal")
	cmd.AddCommand(add, del, permCmd(true), permCmd(false), ls, get)
	return cmd
}

// list prints names joined by ", ", "-" for none.
func list(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ", ")
}
