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

// backupFlags are the backup commands' flags.
type backupFlags struct {
	*clusterFlags
	location string
	hex      bool
}

// backupCreateRecord is the JSON output of backup create.
type backupCreateRecord struct {
	ID           string           `json:"id"`
	Shards       int              `json:"shards"`
	FilesCopied  int              `json:"files_copied"`
	FilesSkipped int              `json:"files_skipped"`
	BytesCopied  int64            `json:"bytes_copied"`
	BytesSkipped int64            `json:"bytes_skipped"`
	Manifest     *backup.Manifest `json:"manifest"`
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
	var id string
	create := &cobra.Command{
		Use:   "create --location PATH [--id ID]",
		Short: "Take a full backup of the cluster into a location",
		Long: `create takes a full backup of the cluster into the location PATH (a local or
mounted directory, created if missing): for every shard, a checkpoint of one of
its replicas (a follower's first). Files the location already holds (from an
earlier backup) are not copied again. The manifest is written last: a backup
that fails or is interrupted stays incomplete and is never listed as complete.

--id names the backup (default: the start time, UTC, as 20060102T150405Z).
While it runs, a progress line is written to stderr after each shard; then the
backup's ID, shard count, files and bytes copied and skipped (already stored)
and the range of the shards' dates are printed. --timeout bounds connecting
only: the backup runs until it is done or interrupted. With -o json: one object
{id, shards, files_copied, files_skipped, bytes_copied, bytes_skipped,
manifest} and no progress.`,
		Example: `  shalectl backup create --location /mnt/backups/shale
  shalectl backup create --location /mnt/backups/shale --id nightly-2026-11-22 -o json`,
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
			return f.create(cmd, id, asJSON)
		},
	}
	create.Flags().StringVar(&id, "id", "", "name the backup `ID` (default: the start time, UTC, 20060102T150405Z)")

	list := &cobra.Command{
		Use:   "list --location PATH",
		Short: "List the backups in a location",
		Long: `list prints a table of the backups in the location PATH, oldest first: ID,
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
			entries, err := loc.List()
			if err != nil {
				return fmt.Errorf("backup list: %w", err)
			}
			if asJSON {
				return output.WriteJSON(cmd.OutOrStdout(), listRecords(entries))
			}
			return writeBackupList(cmd.OutOrStdout(), loc.Dir(), entries)
		},
	}

	describe := &cobra.Command{
		Use:   "describe ID --location PATH",
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
			m, err := loc.Describe(args[0])
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
		Use:   "verify ID --location PATH",
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
		Use:   "delete ID --location PATH",
		Short: "Delete a backup and the stored files no other backup uses",
		Long: `delete removes backup ID (complete or not) from the location PATH, then every
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
			res, err := loc.Delete(args[0])
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

	for _, c := range []*cobra.Command{create, list, describe, verify, del} {
		c.Flags().StringVar(&f.location, "location", "", "the backup location: a local or mounted directory `PATH` (required)")
	}
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Take, list, describe, verify and delete backups",
		Long: `The backup commands write backups of the cluster to a location (a local or
mounted directory, given with --location) and list, describe, verify and delete
them. Only create contacts the cluster; the others read the location alone.`,
		Args: noArgs,
		RunE: groupHelp,
	}
	cmd.AddCommand(create, list, describe, verify, del)
	return cmd
}

// needLocation fails unless --location was given.
func (f *backupFlags) needLocation(cmd *cobra.Command) error {
	if strings.TrimSpace(f.location) == "" {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("%s needs --location PATH (the backup directory)", cmd.CommandPath())}
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
	loc, err = backup.Open(f.location, false)
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
func (f *backupFlags) create(cmd *cobra.Command, id string, asJSON bool) error {
	ctx, c, cleanup, err := f.connectUntilDone(cmd, 0)
	if err != nil {
		return err
	}
	defer cleanup()
	loc, err := backup.Open(f.location, true)
	if err != nil {
		return fmt.Errorf("backup create: %w", err)
	}
	opts := backup.CreateOptions{ID: id}
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
			ID: m.ID, Shards: len(m.Shards), FilesCopied: stats.FilesCopied, FilesSkipped: stats.FilesSkipped,
			BytesCopied: stats.BytesCopied, BytesSkipped: stats.BytesSkipped, Manifest: m,
		})
	}
	tw := newTable(cmd.OutOrStdout())
	fmt.Fprintf(tw, "backup:\t%s (in %s)\n", m.ID, loc.Dir())
	fmt.Fprintf(tw, "cluster:\t%s\n", m.ClusterID)
	fmt.Fprintf(tw, "shards:\t%d\n", len(m.Shards))
	fmt.Fprintf(tw, "files:\t%d copied, %d skipped (already stored)\n", stats.FilesCopied, stats.FilesSkipped)
	fmt.Fprintf(tw, "bytes:\t%s copied, %s skipped\n", bytesAndSize(stats.BytesCopied), bytesAndSize(stats.BytesSkipped))
	fmt.Fprintf(tw, "dates:\t%s\n", dateRange(m))
	fmt.Fprintf(tw, "took:\t%s\n", m.Finished.Sub(m.Started).Round(time.Millisecond))
	return tw.Flush()
}

// verify runs backup verify.
func (f *backupFlags) verify(cmd *cobra.Command, loc *backup.Location, id string, asJSON bool) error {
	var prog *progressLine
	var progress func(backup.VerifyProgress)
	if !asJSON {
		// Per file: on a terminal only (a log would get a line per file).
		prog = newProgressLine(cmd.ErrOrStderr(), false)
		progress = func(p backup.VerifyProgress) {
			prog.update(fmt.Sprintf("files %d/%d, %s of %s checked",
				p.FilesDone, p.Files, output.Bytes(uint64(p.BytesDone)), output.Bytes(uint64(p.Bytes))), p.FilesDone == p.Files)
		}
	}
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
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "SHARD\tRANGE\tNODE\tAPPLIED\tDATE\tFILES\tSIZE")
	for _, p := range m.Shards {
		id, rng := strconv.FormatUint(p.ShardID, 10), "-"
		if p.System {
			id += " (system)"
		} else {
			rng = "[" + k.rangeBound(p.Start, false) + ", " + k.rangeBound(p.End, true) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%s\n", id, rng, p.NodeID, p.AppliedIndex,
			hlcDate(p.Date), len(p.Files), output.Bytes(p.Bytes()))
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
