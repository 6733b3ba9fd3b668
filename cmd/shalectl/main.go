// Command shalectl is Shale's command-line tool. It has the cluster
// commands, which talk to a running cluster through the Go SDK (package
// client), and the debug commands, modelled on RocksDB's sst_dump and ldb,
// that inspect and edit a storage engine directory or a single SST file
// offline:
//
//	shalectl [--endpoints A,B,C] [--timeout D] [--user NAME[:PASSWORD]] kv get|put|del|scan|cas ...
//	shalectl watch PREFIX
//	shalectl cluster status
//	shalectl shard list|info ID|checksum ID|split KEY|merge KEY|directory|move SHARD FROM TO
//	shalectl node list|add ADDR|remove ID|status ID|decommission ID|recommission ID|drain-leaders [ID]
//	shalectl leader transfer SHARD NODE
//	shalectl placement status|history
//	shalectl auth enable|disable|status|rotate-key
//	shalectl user add NAME[:PASSWORD]|delete NAME|passwd NAME|grant-role USER ROLE|revoke-role USER ROLE|list|get NAME
//	shalectl role add ROLE|delete ROLE|grant|revoke ROLE read|write|readwrite KEY [END] [--prefix]|list|get ROLE
//	shalectl backup create [--base ID]|stream|list|describe ID|verify ID|delete ID --location LOC
//	shalectl restore ID --location LOC --data-dir DIR [--as-of TIME]
//	shalectl cert create-ca|create-node NAME HOST...|create-client USER|list --certs-dir DIR
//	shalectl debug sst-dump FILE
//	shalectl debug ldb --db DIR get|put|delete|delete-range|scan|manifest|
//	                            compact|checkpoint|updates-since|metrics|live-files
//
// Every command prints its results to stdout and its errors to stderr, and
// exits with status 0 on success and 1 on any error (including a key that is
// not found). See docs/shalectl.md for the full reference.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes shalectl with args and returns the process exit status: 0 on
// success, 1 on any error (after printing it to stderr).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	errw := &output.SyncWriter{W: stderr}
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(errw)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(errw, "shalectl: %v\n", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(errw, "Run '%s --help' for usage.\n", ue.cmd.CommandPath())
	}
	return 1
}

// globalFlags are the flags every command inherits from the root.
type globalFlags struct {
	output string
}

// format returns the validated -o/--output format.
func (g *globalFlags) format() (output.Format, error) {
	return output.ParseFormat(g.output)
}

// textOnly fails when -o json was requested from a command without JSON
// output.
func (g *globalFlags) textOnly(cmd *cobra.Command) error {
	f, err := g.format()
	if err != nil {
		return err
	}
	if f != output.Text {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("%s does not support -o %s", cmd.CommandPath(), f)}
	}
	return nil
}

// newRootCmd builds the shalectl command tree. Each call returns a fresh
// tree with its own flag state, so tests can run commands in-process.
func newRootCmd() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "shalectl",
		Short: "Shale's command-line tool",
		Long: `shalectl operates Shale databases.

The cluster commands (kv, watch, cluster, shard, node, leader, placement, and
auth, user and role) talk to a running cluster through any of the nodes in --endpoints (default: $SHALE_ENDPOINTS,
else 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003).

The backup commands write backups of the cluster to a location, a directory
or s3://BUCKET/PREFIX (backup create and stream), and list, describe, verify
and delete them offline; restore prepares a new node's data directory to found
a cluster from a backup, offline too.

The debug commands inspect and edit a storage engine directory or an SST file
offline, in the manner of RocksDB's sst_dump and ldb.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE:          groupHelp,
	}
	root.PersistentFlags().StringVarP(&g.output, "output", "o", string(output.Text),
		"output format: text or json (json is supported by the cluster, backup and restore commands and by ldb get, scan, live-files, updates-since and sst-dump)")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{cmd: cmd, msg: err.Error()}
	})
	addClusterCommands(root, g)
	root.AddCommand(newDebugCmd(g))
	root.AddCommand(newCertCmd(g))
	return root
}

// usageError is a command-line mistake (wrong arguments, bad flags); run
// follows it with a pointer to the command's help.
type usageError struct {
	cmd *cobra.Command
	msg string
}

func (e *usageError) Error() string { return e.msg }

// exactArgs is cobra.ExactArgs naming the expected arguments in its error.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes %d argument(s), %s; got %d",
				cmd.CommandPath(), len(names), strings.Join(names, " "), len(args))}
		}
		return nil
	}
}

// noArgs rejects positional arguments (an unknown subcommand of a group
// lands here, and gets cobra's "did you mean" suggestions: a subcommand
// within two edits, or one it starts).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if cmd.SuggestionsMinimumDistance <= 0 {
				cmd.SuggestionsMinimumDistance = 2 // cobra's default, which it sets only on its own path
			}
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
			}
			return &usageError{cmd: cmd, msg: msg}
		}
		return &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

// groupHelp is the RunE of command groups: run bare, they print their
// help.
func groupHelp(cmd *cobra.Command, args []string) error {
	return cmd.Help()
}
