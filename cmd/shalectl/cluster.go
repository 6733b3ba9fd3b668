package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

// defaultEndpoints are the nodes the cluster commands contact when neither
// --endpoints nor SHALE_ENDPOINTS says otherwise.
const defaultEndpoints = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

// endpointsEnv is the environment variable that overrides defaultEndpoints.
const endpointsEnv = "SHALE_ENDPOINTS"

// clusterFlags are the root's flags for the commands that talk to a
// running cluster.
type clusterFlags struct {
	*globalFlags
	endpoints string
	timeout   time.Duration
	// caFile, certFile and keyFile turn on TLS (--cacert, --cert, --key).
	caFile, certFile, keyFile string
	// user (NAME or NAME:PASSWORD) and passwordFile authenticate (--user,
	// --password-file; see credentials).
	user, passwordFile string
}

// addClusterCommands registers the cluster commands (kv, watch, cluster,
// shard, node, leader, placement, backup, restore, auth, user, role) and
// their persistent flags on the root.
func addClusterCommands(root *cobra.Command, g *globalFlags) {
	f := &clusterFlags{globalFlags: g}
	def := defaultEndpoints
	if env := strings.TrimSpace(os.Getenv(endpointsEnv)); env != "" {
		def = env
	}
	pf := root.PersistentFlags()
	pf.StringVar(&f.endpoints, "endpoints", def,
		"cluster commands: comma-separated host:port addresses of cluster nodes ($"+endpointsEnv+" sets the default)")
	pf.DurationVar(&f.timeout, "timeout", 10*time.Second,
		"cluster commands: time limit for the whole command, including retries (0: none)")
	pf.StringVar(&f.caFile, "cacert", os.Getenv("SHALE_CACERT"),
		"cluster commands: connect with TLS, trusting the CA certificates in this PEM file ($SHALE_CACERT sets the default)")
	pf.StringVar(&f.certFile, "cert", os.Getenv("SHALE_CERT"),
		"cluster commands: client certificate (PEM) to present to the nodes, with --key ($SHALE_CERT sets the default)")
	pf.StringVar(&f.keyFile, "key", os.Getenv("SHALE_KEY"),
		"cluster commands: private key (PEM) of --cert ($SHALE_KEY sets the default)")
	pf.StringVar(&f.user, "user", os.Getenv(userEnv),
		"cluster commands: authenticate as this user, NAME or NAME:PASSWORD ($"+userEnv+" sets the default); without PASSWORD the password comes from --password-file, $"+passwordEnv+" or a prompt")
	pf.StringVar(&f.passwordFile, "password-file", "",
		"cluster commands: read --user's password from the first line of this file")
	root.AddCommand(newKVCmd(f), newWatchCmd(f), newClusterCmd(f), newShardCmd(f), newNodeCmd(f), newLeaderCmd(f), newPlacementCmd(f), newBackupCmd(f), newRestoreCmd(f))
	root.AddCommand(newAuthCmd(f), newUserCmd(f), newRoleCmd(f))
}

// endpointList splits --endpoints.
func (f *clusterFlags) endpointList() []string {
	var eps []string
	for _, e := range strings.Split(f.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}

// withClient connects to the cluster, runs fn under the --timeout and
// closes the connection.
func (f *clusterFlags) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	eps := f.endpointList()
	if len(eps) == 0 {
		return &usageError{cmd: cmd, msg: "--endpoints is empty"}
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	c, err := f.connect(ctx, cmd, eps)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

// connect opens a client of the cluster at eps, logging its warnings to
// the command's stderr.
func (f *clusterFlags) connect(ctx context.Context, cmd *cobra.Command, eps []string) (*client.Client, error) {
	h := slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})
	opts := []client.Option{client.WithLogger(slog.New(h))}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, &usageError{cmd: cmd, msg: "--cert and --key go together"}
	}
	if f.caFile != "" || f.certFile != "" {
		opts = append(opts, client.WithTLSFiles(f.caFile, f.certFile, f.keyFile))
	}
	creds, err := f.credentials(cmd)
	if err != nil {
		return nil, err
	}
	opts = append(opts, creds...)
	c, err := client.New(ctx, eps, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(eps, ","), err)
	}
	return c, nil
}

// connectUntilDone connects for a command that runs until it is done or
// interrupted (watch, backup create): the context it returns ends on
// SIGINT or SIGTERM, or after limit when positive; --timeout bounds only
// the connecting. Call cleanup when done.
func (f *clusterFlags) connectUntilDone(cmd *cobra.Command, limit time.Duration) (ctx context.Context, c *client.Client, cleanup func(), err error) {
	eps := f.endpointList()
	if len(eps) == 0 {
		return nil, nil, nil, &usageError{cmd: cmd, msg: "--endpoints is empty"}
	}
	ctx = cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	cancelLimit := func() {}
	if limit > 0 {
		ctx, cancelLimit = context.WithTimeout(ctx, limit)
	}
	cctx, cancelConnect := ctx, context.CancelFunc(func() {})
	if f.timeout > 0 {
		cctx, cancelConnect = context.WithTimeout(ctx, f.timeout)
	}
	defer cancelConnect()
	if c, err = f.connect(cctx, cmd, eps); err != nil {
		cancelLimit()
		stop()
		return nil, nil, nil, err
	}
	return ctx, c, func() { _ = c.Close(); cancelLimit(); stop() }, nil
}

// jsonOutput returns whether -o json was requested (validating -o).
func (f *clusterFlags) jsonOutput(cmd *cobra.Command) (bool, error) {
	format, err := f.format()
	if err != nil {
		return false, &usageError{cmd: cmd, msg: err.Error()}
	}
	return format == output.JSON, nil
}

// keyFormat prints keys and values: as 0x-prefixed hex with --hex;
// otherwise as they are when they are printable UTF-8 (and not empty), and
// as a double-quoted Go string literal with escapes when not.
type keyFormat struct{ hex bool }

func (k keyFormat) codec() output.Codec { return output.Codec{Hex: k.hex} }

// format returns the printed form of b.
func (k keyFormat) format(b []byte) string {
	if k.hex {
		return "0x" + hex.EncodeToString(b)
	}
	if len(b) == 0 || !utf8.Valid(b) {
		return strconv.Quote(string(b))
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) {
			return strconv.Quote(string(b))
		}
	}
	return string(b)
}

// truncated is format of at most max bytes of b (all when max <= 0), with
// a note of the full length when cut.
func (k keyFormat) truncated(b []byte, max int) string {
	if max <= 0 || len(b) <= max {
		return k.format(b)
	}
	cut := b[:max]
	if !k.hex && utf8.Valid(b) {
		// Do not cut a UTF-8 sequence in two (at most 3 bytes go).
		for len(cut) > 0 && !utf8.Valid(cut) {
			cut = cut[:len(cut)-1]
		}
	}
	return fmt.Sprintf("%s...(%d bytes)", k.format(cut), len(b))
}

// rangeBound prints a shard boundary: an empty start or end is the
// beginning or end of the key space.
func (k keyFormat) rangeBound(b []byte, isEnd bool) string {
	if len(b) == 0 {
		if isEnd {
			return "(max)"
		}
		return "(min)"
	}
	return k.format(b)
}

// newTable returns a tabwriter for an aligned table.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// writeProtoJSON prints m as indented protojson (field names as in the
// .proto files, every field present; 64-bit integers are JSON strings and
// bytes base64, per the protobuf JSON mapping).
func writeProtoJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	// Re-indent: protojson's own spacing is deliberately unstable.
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}

// parseID parses a node or shard ID argument.
func parseID(cmd *cobra.Command, what, s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, &usageError{cmd: cmd, msg: fmt.Sprintf("%s must be a positive integer, got %q", what, s)}
	}
	return id, nil
}

// ago prints how long ago t was, "-" for the zero time.
func ago(unixNanos int64) string {
	if unixNanos == 0 {
		return "-"
	}
	d := time.Since(time.Unix(0, unixNanos))
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String() + " ago"
}
