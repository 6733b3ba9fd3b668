package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/backup"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

// The backup commands (create, list, describe, verify, delete) on top of
// package backup. Only create talks to a cluster; the others read the
// location alone.

// locationHelp is the help of the backup commands' and restore's
// --location.
const locationHelp = "the backup location `LOC` (required): a directory PATH, or s3://BUCKET/PREFIX " +
	"(?endpoint=URL for an S3-compatible server; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"

// backupFlags are the backup commands' flags.
type backupFlags struct {
	*clusterFlags
	location string
	hex      bool
	// throughClient and nodeCredentials are create's and stream's
	// --through-client and --node-credentials (backup.CreateOptions).
	throughClient, nodeCredentials bool
}

// addWriteFlags adds --through-client and --node-credentials to cmd.
func (f *backupFlags) addWriteFlags(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.throughClient, "through-client", false,
		"have the nodes stream their checkpoints through shalectl, which writes them (for nodes that cannot reach the location)")
	cmd.Flags().BoolVar(&f.nodeCredentials, "node-credentials", false,
		"have the nodes sign their S3 requests with their own credentials (their environment, AWS credentials file or instance role) instead of shalectl's")
}

// createOptions are the backup.CreateOptions the flags set.
func (f *backupFlags) createOptions(id, base string) backup.CreateOptions {
	return backup.CreateOptions{ID: id, Base: base, ThroughClient: f.throughClient, NodeCredentials: f.nodeCredentials}
}

// backupCreateRecord is the JSON output of backup create.
type backupCreateRecord struct {
	ID string `json:"id"`
	// Base is the backup an incremental one extends (null: a full
	// backup).
	Base         *string `json:"base"`
	Shards       int     `json:"shards"`
	FilesCopied  int     `json:"files_copied"`
	FilesSkipped int     `json:"files_skipped"`
	BytesCopied  int64   `json:"bytes_copied"`
	BytesSkipped int64   `json:"bytes_skipped"`
	// Checkpoints counts the parts copied from a new checkpoint, Logs
	// those extended from the base with their log, LogEntries the entries
	// those logs added.
	Checkpoints int `json:"checkpoints"`
	Logs        int `json:"logs"`
	LogEntries  int `json:"log_entries"`
	// NodeWritten counts the checkpoints their nodes wrote into the
	// location themselves (the others came through shalectl).
	NodeWritten int              `json:"node_written"`
	Manifest    *backup.Manifest `json:"manifest"`
}

// backupStreamRecord is one line of the JSON output of backup stream: one
// backup taken.
type backupStreamRecord struct {
	ID string `json:"id"`
	// Base is the backup this one extends (null: a full backup).
	Base        *string   `json:"base"`
	Started     time.Time `json:"started"`
	Finished    time.Time `json:"finished"`
	Checkpoints int       `json:"checkpoints"`
	Logs        int       `json:"logs"`
	LogEntries  int       `json:"log_entries"`
	BytesCopied int64     `json:"bytes_copied"`
	// RecoveryPoint is the latest time a restore of this backup can reach
	// (the earliest of its parts' Until).
	RecoveryPoint time.Time `json:"recovery_point"`
	// Deleted are the older stream backups --keep deleted after this one.
	Deleted []string `json:"deleted,omitempty"`
}

// backupListRecord is one backup in the JSON output of backup list.
type backupListRecord struct {
	ID    string       `json:"id"`
	State backup.State `json:"state"`
	// Started, Finished, Shards and Bytes are null for a backup that is
	// not complete.
	Started  *time.Time `json:"started"`
	Finished *time.Time `json:"finished"`
	Shards   *int       `json:"shards"`
	Bytes    *uint64    `json:"bytes"`
	// Error says why a backup is corrupt (null otherwise).
	Error *string `json:"error"`
}

// backupVerifyRecord is the JSON output of backup verify.
type backupVerifyRecord struct {
	ID       string   `json:"id"`
	Files    int      `json:"files"`
	Bytes    int64    `json:"bytes"`
	Problems []string `json:"problems"`
	OK       bool     `json:"ok"`
}

// backupDeleteRecord is the JSON output of backup delete.
type backupDeleteRecord struct {
	ID           string `json:"id"`
	FilesRemoved int    `json:"files_removed"`
	BytesRemoved int64  `json:"bytes_removed"`
}

func newBackupCmd(cf *clusterFlags) *cobra.Command {
	f := &backupFlags{clusterFlags: cf}
	var id, base string
	create := &cobra.Command{
		Use:   "create --location LOC [--id ID] [--base ID|latest]",
		Short: "Take a full or incremental backup of the cluster into a location",
		Long: `create takes a backup of the cluster into the location LOC (a directory,
created if missing, or a prefix of an existing S3 bucket): for every shard, a
checkpoint of one of its replicas (a follower's first). Files the location
already holds (from an earlier backup) are not copied again. The manifest is written last: a backup
that fails or is interrupted stays incomplete and is never listed as complete.

Each node writes its checkpoints into the location itself, and shalectl only
coordinates and writes the manifest: the location must then be reachable from
every node under the same name (the same S3 endpoint and bucket, or a
directory every node mounts at the same path; a relative directory is made
absolute). For S3, shalectl sends the nodes the credentials it signs with, in
each request (over TLS when the cluster uses it; the nodes never log them);
--node-credentials makes the nodes use their own instead. A node that cannot
open the location, finds another one under its name, or runs a version
without this, streams its checkpoints through shalectl, which writes them;
--through-client does that for every node.

--base ID makes the backup incremental on top of backup ID, an earlier complete
backup of the same cluster in the location: a shard whose range is unchanged
gets the base's part plus the entries it applied since (its log); the others,
and those whose log no longer reaches back, get a new checkpoint. --base latest
takes the newest complete backup in the location (by start time).

--id names the backup (default: the start time, UTC, as 20060102T150405Z).
While it runs, a progress line is written to stderr after each shard; then the
backup's ID, base, shard count, parts checkpointed and extended with their log,
files and bytes copied and skipped (already stored) and the range of the
shards' dates are printed. --timeout bounds connecting only: the backup runs
until it is done or interrupted. With -o json: one object {id, base, shards,
files_copied, files_skipped, bytes_copied, bytes_skipped, checkpoints, logs,
log_entries, node_written (the checkpoints nodes wrote themselves), manifest}
(base null for a full backup) and no progress.`,
		Example: `  shalectl backup create --location /mnt/backups/shale
  shalectl backup create --location /mnt/backups/shale --id nightly-2026-11-22 -o json
  shalectl backup create --location /mnt/backups/shale --base latest`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			if err := f.needLocation(cmd); err != nil {
				return err
			}
			if cmd.Flags().Changed("id") {
				if err := backup.ValidID(id); err != nil {
					return &usageError{cmd: cmd, msg: "--id: " + err.Error()}
				}
			}
			if cmd.Flags().Changed("base") && base != "latest" {
				if err := backup.ValidID(base); err != nil {
					return &usageError{cmd: cmd, msg: "--base: " + err.Error()}
				}
			}
			return f.create(cmd, id, base, asJSON)
		},
	}
	create.Flags().StringVar(&id, "id", "", "name the backup `ID` (default: the start time, UTC, 20060102T150405Z)")
	create.Flags().StringVar(&base, "base", "", "take an incremental backup on top of backup `ID` (latest: the newest complete backup in the location)")
	f.addWriteFlags(create)

	sf := streamFlags{interval: 10 * time.Second, prefix: "stream"}
	stream := &cobra.Command{
		Use:   "stream --location LOC [--interval DURATION] [--id-prefix PREFIX] [--keep N] [--full-every N]",
		Short: "Take incremental backups continuously, until interrupted",
		Long: `stream runs until interrupted (SIGINT or SIGTERM), backing the cluster up into
the location LOC: first a full backup if the location holds no complete backup
of this cluster (else an incremental one on top of the newest), then every
--interval (default 10s) an incremental backup on top of the previous one.
--full-every N takes a full backup again after N incremental ones (default 0:
never). The backups are named PREFIX-<UTC start time, 20060102T150405.000Z>
(--id-prefix, default "stream").

After each backup one line is printed: its ID, its base, the parts
checkpointed and extended with their log, the bytes copied and its recovery
point (the latest time a restore of it can reach: shale-server --restore-as-of
up to then). With -o json: one object per line {id, base, started, finished,
checkpoints, logs, log_entries, bytes_copied, recovery_point} (base null for a
full backup).

--keep N (default 0: keep all) deletes, after each backup, the oldest complete
backups named PREFIX-... beyond the newest N (never the one the next backup
extends; other backups are not touched). Deleting a backup only removes stored
files no remaining backup uses, and each backup lists every file it needs, so
the ones kept stay complete.

A round that fails (the cluster unreachable for a moment) is reported on
stderr, its incomplete backup removed, and retried at the next interval on
the same base; it does not end the command. Stopped (SIGINT, SIGTERM), the
command ends its round's backup at once but still removes it if incomplete,
or deletes what --keep says after it if complete; stopped between rounds, it
starts no other. --timeout bounds connecting only.
--through-client and --node-credentials are create's.

--metrics-addr HOST:PORT serves Prometheus metrics of the stream at /metrics:
shale_backup_stream_backups_total{type}, _failures_total, _copied_bytes_total,
_last_success_timestamp_seconds and _recovery_point_timestamp_seconds, to alert
on a stream that stopped backing up or a recovery point falling behind.`,
		Example: `  shalectl backup stream --location /mnt/backups/shale
  shalectl backup stream --location /mnt/backups/shale --interval 1m --keep 60 --full-every 1440 -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			if err := f.needLocation(cmd); err != nil {
				return err
			}
			if err := sf.validate(cmd); err != nil {
				return err
			}
			return f.stream(cmd, sf, asJSON)
		},
	}
	stream.Flags().DurationVar(&sf.interval, "interval", sf.interval, "take a backup every `DURATION`")
	stream.Flags().StringVar(&sf.prefix, "id-prefix", sf.prefix, "name the backups `PREFIX`-<UTC time>")
	stream.Flags().IntVar(&sf.keep, "keep", 0, "keep the newest `N` backups of the stream, delete older ones (0: keep all)")
	stream.Flags().IntVar(&sf.fullEvery, "full-every", 0, "take a full backup after `N` incremental ones (0: never)")
	f.addWriteFlags(stream)
	stream.Flags().StringVar(&sf.metricsAddr, "metrics-addr", "", "serve Prometheus metrics of the stream (backups, failures, bytes copied, last success, recovery point) at http://`HOST:PORT`/metrics")

	list := &cobra.Command{
		Use:   "list --location LOC",
		Short: "List the backups in a location",
		Long: `list prints a table of the backups in the location LOC, oldest first: ID,
STATE (complete; incomplete: no manifest, being written or failed; corrupt: the
manifest does not read back), STARTED (UTC), SHARDS and SIZE. It does not
contact the cluster. With -o json: an array of {id, state, started, finished,
shards, bytes, error} (null where not known).`,
		Example: `  shalectl backup list --location /mnt/backups/shale`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, loc, err := f.open(cmd)
			if err != nil {
				return err
			}
			entries, err := loc.List(cmd.Context())
			if err != nil {
				return fmt.Errorf("backup list: %w", err)
			}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), listRecords(entries))
			}
			return writeBackupList(cmd.OutOrStdout(), loc.String(), entries)
		},
	}

	describe := &cobra.Command{
		Use:   "describe ID --location LOC",
		Short: "Show a backup's manifest",
		Long: `describe prints backup ID's manifest: the cluster ID, when the backup started
and finished, and a table of its parts, one per shard: SHARD, RANGE (the user
keys it holds, printed as by "shard list"; --hex prints them as hexadecimal),
NODE (whose replica was copied), APPLIED (the Raft index the copy holds), DATE
(the wall time of the copy's hybrid logical clock, UTC), FILES and SIZE. It
does not contact the cluster. With -o json: the manifest itself.`,
		Example: `  shalectl backup describe 20261122T100000Z --location /mnt/backups/shale`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, loc, err := f.openFor(cmd, args[0])
			if err != nil {
				return err
			}
			m, err := loc.Describe(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("backup describe %s: %w", args[0], err)
			}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), m)
			}
			return f.writeManifest(cmd.OutOrStdout(), m)
		},
	}
	describe.Flags().BoolVar(&f.hex, "hex", false, "print the parts' boundary keys as hexadecimal")

	verify := &cobra.Command{
		Use:   "verify ID --location LOC",
		Short: "Check every file of a backup against its size and checksum",
		Long: `verify reads backup ID's manifest and every file it lists, and checks each
file's size and CRC-32C, with a progress line on stderr. It prints "backup ID
verified: N files, B bytes, every checksum matches", or every problem (a file
missing, cut short or with a wrong checksum), one per line, and fails. It does
not contact the cluster. With -o json: {id, files, bytes, problems, ok}, and
the command still fails when ok is false.`,
		Example: `  shalectl backup verify 20261122T100000Z --location /mnt/backups/shale`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, loc, err := f.openFor(cmd, args[0])
			if err != nil {
				return err
			}
			return f.verify(cmd, loc, args[0], asJSON)
		},
	}

	del := &cobra.Command{
		Use:   "delete ID --location LOC",
		Short: "Delete a backup and the stored files no other backup uses",
		Long: `delete removes backup ID (complete or not) from the location LOC, then every
stored file that no complete backup left there uses, and prints how many files
and bytes were removed. While a backup of the location is corrupt, no stored
file is removed. It does not contact the cluster. With -o json: {id,
files_removed, bytes_removed}.`,
		Example: `  shalectl backup delete 20261122T100000Z --location /mnt/backups/shale`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, loc, err := f.openFor(cmd, args[0])
			if err != nil {
				return err
			}
			res, err := loc.Delete(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("backup delete %s: %w", args[0], err)
			}
			rec := backupDeleteRecord{ID: args[0], FilesRemoved: res.FilesRemoved, BytesRemoved: res.BytesRemoved}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), rec)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "deleted backup %s: %d files, %s removed (no backup left uses them)\n",
				rec.ID, rec.FilesRemoved, bytesAndSize(rec.BytesRemoved))
			return err
		},
	}

	for _, c := range []*cobra.Command{create, stream, list, describe, verify, del} {
		c.Flags().StringVar(&f.location, "location", "", locationHelp)
	}
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Take, stream, list, describe, verify and delete backups",
		Long: `The backup commands write backups of the cluster to a location, given with
--location LOC, and list, describe, verify and delete them. Only create and
stream contact the cluster; the others read the location alone. "shalectl
restore" prepares a new cluster's founding nodes from a backup.

A location is a directory PATH (local or mounted), or an S3 bucket and prefix,
s3://BUCKET[/PREFIX][?endpoint=URL][&region=REGION]: endpoint for an
S3-compatible server (else AWS_ENDPOINT_URL, else AWS), region else AWS_REGION.
S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, else the
AWS credentials file or the instance role; never from the URL. Objects go with
an unsigned body and its CRC-32C, which the server checks: over http:// the
signature does not cover the body, so use https:// on an untrusted network.`,
		Args: noArgs,
		RunE: groupHelp,
	}
	cmd.AddCommand(create, stream, list, describe, verify, del)
	return cmd
}

// needLocation fails unless --location was given.
func (f *backupFlags) needLocation(cmd *cobra.Command) error {
	if strings.TrimSpace(f.location) == "" {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("%s needs --location LOC (a directory or s3://BUCKET/PREFIX)", cmd.CommandPath())}
	}
	return nil
}

// open validates -o and --location and opens the location, which must
// exist.
func (f *backupFlags) open(cmd *cobra.Command) (asJSON bool, loc *backup.Location, err error) {
	if asJSON, err = f.jsonOutput(cmd); err != nil {
		return false, nil, err
	}
	if err := f.needLocation(cmd); err != nil {
		return false, nil, err
	}
	loc, err = backup.Open(cmd.Context(), f.location, false)
	if err != nil {
		return false, nil, fmt.Errorf("%s: %w", strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), err)
	}
	return asJSON, loc, nil
}

// openFor is open for a command about backup id, which must be a valid ID.
func (f *backupFlags) openFor(cmd *cobra.Command, id string) (asJSON bool, loc *backup.Location, err error) {
	if asJSON, loc, err = f.open(cmd); err != nil {
		return false, nil, err
	}
	if err := backup.ValidID(id); err != nil {
		return false, nil, &usageError{cmd: cmd, msg: "ID: " + err.Error()}
	}
	return asJSON, loc, nil
}

// create runs backup create: connecting is bounded by --timeout, the
// backup itself only by an interrupt.
func (f *backupFlags) create(cmd *cobra.Command, id, base string, asJSON bool) error {
	ctx, c, cleanup, err := f.connectUntilDone(cmd, 0)
	if err != nil {
		return err
	}
	defer cleanup()
	loc, err := backup.Open(ctx, f.location, true)
	if err != nil {
		return fmt.Errorf("backup create: %w", err)
	}
	if base == "latest" {
		if base, err = latestComplete(ctx, loc, ""); err != nil {
			return fmt.Errorf("backup create: --base latest: %w", err)
		}
	}
	opts := f.createOptions(id, base)
	var prog *progressLine
	if !asJSON {
		prog = newProgressLine(cmd.ErrOrStderr(), true)
		opts.Progress = func(p backup.Progress) {
			prog.update(fmt.Sprintf("shards %d/%d, %s copied, %s already stored",
				p.ShardsDone, p.Shards, output.Bytes(uint64(p.BytesCopied)), output.Bytes(uint64(p.BytesSkipped))), p.ShardsDone == p.Shards)
		}
	}
	m, stats, err := backup.Create(ctx, c, loc, opts)
	prog.done()
	if err != nil {
		return fmt.Errorf("backup create: %w", err)
	}
	if asJSON {
		return output.WriteJSON(cmd.OutOrStdout(), backupCreateRecord{
			ID: m.ID, Base: optString(base), Shards: len(m.Shards), FilesCopied: stats.FilesCopied, FilesSkipped: stats.FilesSkipped,
			BytesCopied: stats.BytesCopied, BytesSkipped: stats.BytesSkipped,
			Checkpoints: stats.Checkpoints, Logs: stats.Logs, LogEntries: stats.LogEntries, NodeWritten: stats.NodeWritten, Manifest: m,
		})
	}
	tw := newTable(cmd.OutOrStdout())
	fmt.Fprintf(tw, "backup:\t%s (in %s)\n", m.ID, loc.String())
	if base != "" {
		fmt.Fprintf(tw, "base:\t%s (incremental)\n", base)
	} else {
		fmt.Fprintf(tw, "base:\t- (full)\n")
	}
	fmt.Fprintf(tw, "cluster:\t%s\n", m.ClusterID)
	fmt.Fprintf(tw, "shards:\t%d\n", len(m.Shards))
	fmt.Fprintf(tw, "parts:\t%d new checkpoints (%d written by their nodes), %d extended with their log (%d entries)\n", stats.Checkpoints, stats.NodeWritten, stats.Logs, stats.LogEntries)
	fmt.Fprintf(tw, "files:\t%d copied, %d skipped (already stored)\n", stats.FilesCopied, stats.FilesSkipped)
	fmt.Fprintf(tw, "bytes:\t%s copied, %s skipped\n", bytesAndSize(stats.BytesCopied), bytesAndSize(stats.BytesSkipped))
	fmt.Fprintf(tw, "dates:\t%s\n", dateRange(m))
	fmt.Fprintf(tw, "restorable:\t%s\n", restorable(m))
	fmt.Fprintf(tw, "took:\t%s\n", m.Finished.Sub(m.Started).Round(time.Millisecond))
	return tw.Flush()
}

// streamFlags are backup stream's own flags.
type streamFlags struct {
	interval    time.Duration
	prefix      string
	keep        int
	fullEvery   int
	metricsAddr string
}

// streamTimeFormat is the UTC start time in a stream backup's ID.
const streamTimeFormat = "20060102T150405.000Z"

// streamID names a stream backup started at t.
func streamID(prefix string, t time.Time) string {
	return prefix + "-" + t.UTC().Format(streamTimeFormat)
}

// isStreamID reports whether id names a backup of the stream with prefix.
func isStreamID(prefix, id string) bool {
	rest, ok := strings.CutPrefix(id, prefix+"-")
	if !ok {
		return false
	}
	_, err := time.Parse(streamTimeFormat, rest)
	return err == nil
}

// validate checks backup stream's flags.
func (s *streamFlags) validate(cmd *cobra.Command) error {
	switch {
	case s.interval <= 0:
		return &usageError{cmd: cmd, msg: fmt.Sprintf("--interval %s: want a positive duration", s.interval)}
	case s.keep < 0:
		return &usageError{cmd: cmd, msg: fmt.Sprintf("--keep %d: want 0 (keep all) or more", s.keep)}
	case s.fullEvery < 0:
		return &usageError{cmd: cmd, msg: fmt.Sprintf("--full-every %d: want 0 (never) or more", s.fullEvery)}
	}
	if err := backup.ValidID(streamID(s.prefix, time.Now())); err != nil {
		return &usageError{cmd: cmd, msg: "--id-prefix: " + err.Error()}
	}
	return nil
}

// errNoComplete is returned by latestComplete when the location holds no
// complete backup (of the cluster asked for).
var errNoComplete = errors.New("no complete backup")

// latestComplete returns the ID of the newest complete backup in loc (by
// start time) of cluster clusterID, or of any cluster when clusterID is
// empty; with none, an error wrapping errNoComplete.
func latestComplete(ctx context.Context, loc *backup.Location, clusterID string) (string, error) {
	entries, err := loc.List(ctx)
	if err != nil {
		return "", err
	}
	latest := ""
	for _, e := range entries {
		if e.State == backup.Complete && (clusterID == "" || e.Manifest.ClusterID == clusterID) {
			latest = e.ID
		}
	}
	if latest == "" {
		if clusterID != "" {
			return "", fmt.Errorf("%w of cluster %s in %s", errNoComplete, clusterID, loc.String())
		}
		return "", fmt.Errorf("%w in %s", errNoComplete, loc.String())
	}
	return latest, nil
}

// stream runs backup stream until interrupted: connecting is bounded by
// --timeout; a round that fails is reported and retried at the next
// interval.
func (f *backupFlags) stream(cmd *cobra.Command, sf streamFlags, asJSON bool) error {
	ctx, c, cleanup, err := f.connectUntilDone(cmd, 0)
	if err != nil {
		return err
	}
	defer cleanup()
	loc, err := backup.Open(ctx, f.location, true)
	if err != nil {
		return fmt.Errorf("backup stream: %w", err)
	}
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	metrics := newStreamMetrics()
	if sf.metricsAddr != "" {
		if err := metrics.serve(ctx, sf.metricsAddr, errw); err != nil {
			return &usageError{cmd: cmd, msg: err.Error()}
		}
	}
	var (
		base      string // the backup the next round extends ("": none yet)
		resolved  bool   // base was looked up in the location
		sinceFull int    // incremental backups since the last full one
		next      = time.Now()
	)
	for {
		if !waitRound(ctx, next) {
			return nil
		}
		started := time.Now()
		next = started.Add(sf.interval)
		if !resolved {
			st, err := c.ClusterStatus(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				fmt.Fprintf(errw, "shalectl: backup stream: cluster status (retrying in %s): %v\n", sf.interval, err)
				continue
			}
			base, err = latestComplete(ctx, loc, st.GetClusterId())
			if err != nil && !errors.Is(err, errNoComplete) {
				return fmt.Errorf("backup stream: %w", err)
			}
			resolved = true
		}
		roundBase := base
		if sf.fullEvery > 0 && sinceFull >= sf.fullEvery {
			roundBase = ""
		}
		id := streamID(sf.prefix, started)
		if exists, err := loc.Exists(ctx, id); err != nil || exists {
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				fmt.Fprintf(errw, "shalectl: backup stream: %v (retrying in %s)\n", err, sf.interval)
				continue
			}
			fmt.Fprintf(errw, "shalectl: backup stream: %s already holds a backup %s (retrying in %s)\n", loc.String(), id, sf.interval)
			continue
		}
		m, stats, err := backup.Create(ctx, c, loc, f.createOptions(id, roundBase))
		if err != nil {
			// The round's backup is incomplete: remove it (and only it:
			// the ID is new, checked above).
			// Also when the stream is stopping: that is what ended it.
			cctx, cancel := roundCleanupContext(ctx)
			if exists, _ := loc.Exists(cctx, id); exists {
				if _, derr := loc.Delete(cctx, id); derr != nil {
					fmt.Fprintf(errw, "shalectl: backup stream: remove the incomplete backup %s: %v\n", id, derr)
				}
			}
			cancel()
			if ctx.Err() != nil {
				return nil
			}
			metrics.failed()
			fmt.Fprintf(errw, "shalectl: backup stream: backup %s failed (retrying in %s): %v\n", id, sf.interval, err)
			if roundBase != "" {
				if _, derr := loc.Describe(ctx, roundBase); derr != nil {
					// The base is gone (deleted by hand): start again
					// from the newest complete backup, or a full one.
					resolved = false
				}
			}
			continue
		}
		if roundBase == "" {
			sinceFull = 0
		} else {
			sinceFull++
		}
		base = m.ID
		metrics.succeeded(roundBase == "", stats.BytesCopied, recoveryPoint(m))
		var deleted []string
		if sf.keep > 0 {
			// A stream stopped after a round's backup still prunes for it.
			pctx, cancel := roundCleanupContext(ctx)
			deleted, err = pruneStream(pctx, loc, sf.prefix, sf.keep, m)
			cancel()
			if err != nil {
				fmt.Fprintf(errw, "shalectl: backup stream: --keep %d: %v\n", sf.keep, err)
			}
		}
		rec := backupStreamRecord{
			ID: m.ID, Base: optString(roundBase), Started: m.Started, Finished: m.Finished,
			Checkpoints: stats.Checkpoints, Logs: stats.Logs, LogEntries: stats.LogEntries,
			BytesCopied: stats.BytesCopied, RecoveryPoint: recoveryPoint(m), Deleted: deleted,
		}
		if asJSON {
			err = output.WriteJSONLine(out, rec)
		} else {
			err = writeStreamLine(out, rec)
		}
		if err != nil {
			return fmt.Errorf("backup stream: %w", err)
		}
	}
}

// waitRound waits until next, the start of a stream's next round, and
// reports whether the round should run: false once ctx is done, also when
// next has passed too (a stream stopped between rounds starts none).
func waitRound(ctx context.Context, next time.Time) bool {
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	return ctx.Err() == nil
}

// roundCleanupContext is the context of a stream round's last step (the
// removal of its incomplete backup, the prune after a complete one): it
// is not ended by the stream's stop, so a stop never leaves a round half
// done, but it ends after a minute.
func roundCleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// pruneStream deletes the oldest complete backups of the stream with
// prefix (of latest's cluster) beyond the newest keep, never latest (the
// next round's base), and returns the IDs deleted.
func pruneStream(ctx context.Context, loc *backup.Location, prefix string, keep int, latest *backup.Manifest) ([]string, error) {
	entries, err := loc.List(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string // oldest first
	for _, e := range entries {
		if e.State == backup.Complete && e.ID != latest.ID && e.Manifest.ClusterID == latest.ClusterID && isStreamID(prefix, e.ID) {
			ids = append(ids, e.ID)
		}
	}
	// latest counts as one of the kept.
	var deleted []string
	for n := len(ids) + 1; n > keep && len(ids) > 0; n-- {
		if _, err := loc.Delete(ctx, ids[0]); err != nil {
			return deleted, fmt.Errorf("delete %s: %w", ids[0], err)
		}
		deleted = append(deleted, ids[0])
		ids = ids[1:]
	}
	return deleted, nil
}

// writeStreamLine prints backup stream's text line for one backup.
func writeStreamLine(w io.Writer, r backupStreamRecord) error {
	kind := "full"
	if r.Base != nil {
		kind = "incremental on " + *r.Base
	}
	line := fmt.Sprintf("%s %s: %d checkpoints, %d logs (%d entries), %s copied, recovery point %s",
		r.ID, kind, r.Checkpoints, r.Logs, r.LogEntries, output.Bytes(uint64(r.BytesCopied)), utcDate(r.RecoveryPoint))
	if len(r.Deleted) > 0 {
		line += fmt.Sprintf(", deleted %s", strings.Join(r.Deleted, " "))
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// optString is s, or nil when empty.
func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// recoveryPoint is the latest time a restore of m can reach: the earliest
// of its parts' Until (zero if none is set).
func recoveryPoint(m *backup.Manifest) time.Time {
	var t time.Time
	for _, p := range m.Shards {
		if !p.Until.IsZero() && (t.IsZero() || p.Until.Before(t)) {
			t = p.Until
		}
	}
	return t.UTC()
}

// restorable prints the times a restore of m can be taken as of
// (shale-server --restore-as-of): from the latest of its parts'
// checkpoint dates to its recovery point, when that window is not empty.
func restorable(m *backup.Manifest) string {
	to := recoveryPoint(m)
	var from time.Time
	for _, p := range m.Shards {
		if p.Date.WallNanos != 0 && p.Date.Time().After(from) {
			from = p.Date.Time()
		}
	}
	if to.IsZero() || from.After(to) {
		// The shards were read one after the other with no log to bring
		// them to a common time.
		return "whole only (no time every part reaches; restore without --restore-as-of)"
	}
	if from.IsZero() {
		return "up to " + utcDate(to)
	}
	return "as of " + utcDate(from) + " to " + utcDate(to)
}

// logRange prints the entries a part's log holds, "-" when none.
func logRange(p *backup.Part) string {
	if len(p.Log) == 0 {
		return "-"
	}
	s := fmt.Sprintf("%d-%d", p.Log[0].FromIndex, p.Log[len(p.Log)-1].ToIndex)
	if len(p.Log) > 1 {
		s += fmt.Sprintf(" (%d segments)", len(p.Log))
	}
	return s
}

// utcDate prints t, UTC, to the millisecond; "-" when zero.
func utcDate(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// fileProgress is the progress line of a command that reads a backup's
// files (verify, restore): none with -o json; per file, on a terminal
// only (a log would get a line per file). done says what is done with
// the bytes ("checked").
func fileProgress(cmd *cobra.Command, asJSON bool, done string) (*progressLine, func(backup.VerifyProgress)) {
	if asJSON {
		return nil, nil
	}
	prog := newProgressLine(cmd.ErrOrStderr(), false)
	return prog, func(p backup.VerifyProgress) {
		prog.update(fmt.Sprintf("files %d/%d, %s of %s %s",
			p.FilesDone, p.Files, output.Bytes(uint64(p.BytesDone)), output.Bytes(uint64(p.Bytes)), done), p.FilesDone == p.Files)
	}
}

// verify runs backup verify.
func (f *backupFlags) verify(cmd *cobra.Command, loc *backup.Location, id string, asJSON bool) error {
	prog, progress := fileProgress(cmd, asJSON, "checked")
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	rep, err := backup.Verify(ctx, loc, id, progress)
	prog.done()
	if err != nil && (len(rep.Problems) == 0 || !errors.Is(err, backup.ErrCorrupt)) {
		// Not a verdict on the files (no such backup, a bad manifest, an
		// interrupt): only the error.
		return fmt.Errorf("backup verify %s: %w", id, err)
	}
	out := cmd.OutOrStdout()
	if asJSON {
		rec := backupVerifyRecord{ID: id, Files: rep.Files, Bytes: rep.Bytes, Problems: rep.Problems, OK: err == nil}
		if rec.Problems == nil {
			rec.Problems = []string{}
		}
		if werr := output.WriteJSON(out, rec); werr != nil {
			return werr
		}
	} else if err == nil {
		_, werr := fmt.Fprintf(out, "backup %s verified: %d files, %s, every checksum matches\n", id, rep.Files, bytesAndSize(rep.Bytes))
		return werr
	} else {
		for _, p := range rep.Problems {
			if _, werr := fmt.Fprintln(out, p); werr != nil {
				return werr
			}
		}
	}
	if err != nil {
		return fmt.Errorf("backup verify %s: %w", id, err)
	}
	return nil
}

// listRecords is the JSON form of a location's backups.
func listRecords(entries []backup.Entry) []backupListRecord {
	out := make([]backupListRecord, 0, len(entries))
	for _, e := range entries {
		r := backupListRecord{ID: e.ID, State: e.State}
		if m := e.Manifest; m != nil {
			started, finished, shards, bytes := m.Started, m.Finished, len(m.Shards), m.Bytes()
			r.Started, r.Finished, r.Shards, r.Bytes = &started, &finished, &shards, &bytes
		}
		if e.Err != nil {
			msg := e.Err.Error()
			r.Error = &msg
		}
		out = append(out, r)
	}
	return out
}

// writeBackupList prints the table of backup list.
func writeBackupList(w io.Writer, dir string, entries []backup.Entry) error {
	if len(entries) == 0 {
		_, err := fmt.Fprintf(w, "no backups in %s\n", dir)
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tSTARTED\tSHARDS\tSIZE")
	for _, e := range entries {
		started, shards, size := "-", "-", "-"
		if m := e.Manifest; m != nil {
			started = m.Started.UTC().Format(time.RFC3339)
			shards = strconv.Itoa(len(m.Shards))
			size = output.Bytes(m.Bytes())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.ID, e.State, started, shards, size)
	}
	return tw.Flush()
}

// writeManifest prints backup describe's text.
func (f *backupFlags) writeManifest(w io.Writer, m *backup.Manifest) error {
	k := keyFormat{hex: f.hex}
	tw := newTable(w)
	files := 0
	for _, p := range m.Shards {
		files += len(p.Files)
	}
	fmt.Fprintf(tw, "backup:\t%s\n", m.ID)
	fmt.Fprintf(tw, "cluster:\t%s\n", m.ClusterID)
	fmt.Fprintf(tw, "started:\t%s\n", m.Started.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "finished:\t%s (took %s)\n", m.Finished.UTC().Format(time.RFC3339), m.Finished.Sub(m.Started).Round(time.Millisecond))
	fmt.Fprintf(tw, "dates:\t%s\n", dateRange(m))
	fmt.Fprintf(tw, "size:\t%d shards, %d files, %s\n", len(m.Shards), files, output.Bytes(m.Bytes()))
	fmt.Fprintf(tw, "restorable:\t%s\n", restorable(m))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "SHARD\tRANGE\tNODE\tAPPLIED\tDATE\tFILES\tSIZE\tLOG\tLAST DATE\tUNTIL")
	for _, p := range m.Shards {
		id, rng := strconv.FormatUint(p.ShardID, 10), "-"
		if p.System {
			id += " (system)"
		} else {
			rng = "[" + k.rangeBound(p.Start, false) + ", " + k.rangeBound(p.End, true) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", id, rng, p.NodeID, p.AppliedIndex,
			hlcDate(p.Date), len(p.Files), output.Bytes(p.Bytes()), logRange(&p), hlcDate(p.LastDate()), utcDate(p.Until))
	}
	return tw.Flush()
}

// hlcDate prints an HLC reading's wall time, "-" when unset.
func hlcDate(h backup.HLC) string {
	if h.WallNanos == 0 {
		return "-"
	}
	return h.Time().Format("2006-01-02T15:04:05.000Z")
}

// dateRange prints the earliest and latest date of a backup's parts: the
// backup holds, for each shard, its data as of that shard's date.
func dateRange(m *backup.Manifest) string {
	var lo, hi backup.HLC
	for _, p := range m.Shards {
		if p.Date.WallNanos == 0 {
			continue
		}
		if lo.WallNanos == 0 || p.Date.WallNanos < lo.WallNanos {
			lo = p.Date
		}
		if p.Date.WallNanos > hi.WallNanos {
			hi = p.Date
		}
	}
	if lo.WallNanos == 0 {
		return "-"
	}
	if lo == hi {
		return hlcDate(lo)
	}
	return hlcDate(lo) + " to " + hlcDate(hi)
}

// bytesAndSize prints a byte count exactly and human-readably.
func bytesAndSize(n int64) string {
	if n < 1<<10 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%d bytes (%s)", n, output.Bytes(uint64(n)))
}

// progressLine writes a progress line to stderr: on a terminal, rewritten
// in place (with \r, at most every 100ms but always the last); elsewhere,
// one line per update when perUpdate is set, and none otherwise. A nil
// progressLine does nothing.
type progressLine struct {
	mu        sync.Mutex
	w         io.Writer
	tty       bool
	perUpdate bool
	last      time.Time
	width     int
	pending   string
}

// newProgressLine returns a progress line on w (usually the command's
// stderr).
func newProgressLine(w io.Writer, perUpdate bool) *progressLine {
	return &progressLine{w: w, tty: isTerminal(w), perUpdate: perUpdate}
}

// update shows s; final marks the last update of the run.
func (p *progressLine) update(s string, final bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty {
		if p.perUpdate {
			fmt.Fprintln(p.w, s)
		}
		return
	}
	if !final && time.Since(p.last) < 100*time.Millisecond {
		p.pending = s
		return
	}
	p.write(s)
}

// write rewrites the terminal line with s. The caller holds mu.
func (p *progressLine) write(s string) {
	pad := ""
	if n := p.width - len(s); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	fmt.Fprint(p.w, "\r"+s+pad)
	p.width, p.last, p.pending = len(s), time.Now(), ""
}

// done shows the last update held back and ends the terminal line.
func (p *progressLine) done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty {
		return
	}
	if p.pending != "" {
		p.write(p.pending)
	}
	if p.width > 0 {
		fmt.Fprintln(p.w)
		p.width = 0
	}
}

// isTerminal reports whether w (or the writer an output.SyncWriter wraps)
// is a terminal.
func isTerminal(w io.Writer) bool {
	if sw, ok := w.(*output.SyncWriter); ok {
		w = sw.W
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
