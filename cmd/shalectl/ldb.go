package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/vfs"
)

// ldbFlags are the flags shared by the "debug ldb" commands.
type ldbFlags struct {
	*debugFlags
	db              string
	createIfMissing bool
}

func newLDBCmd(d *debugFlags) *cobra.Command {
	f := &ldbFlags{debugFlags: d}
	cmd := &cobra.Command{
		Use:   "ldb --db DIR <command>",
		Short: "Read and write a storage engine directory (like RocksDB's ldb)",
		Long: `ldb runs one operation on the storage engine database in --db.

Every command opens the database with the options its OPTIONS file records
(see the options command), so a writing command keeps its settings.

Read-only commands (get, scan, manifest, updates-since, metrics, live-files,
options) open the database read-only: they take no lock and write nothing to the
directory (the WAL is replayed into memory). Do not run them while another
process writes the database: they would see a changing set of files.

Writing commands (put, delete, delete-range, compact, checkpoint) open the
database for writing, which takes its lock (failing if another process has
it open) and, like every open, flushes the WAL it recovers into an L0 SST.
They fail on a directory without a database unless --create-if-missing.`,
		Args: noArgs,
		RunE: groupHelp,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.db, "db", "", "database `DIR`ectory (required)")
	pf.BoolVar(&f.createIfMissing, "create-if-missing", false, "writing commands: create the database if it does not exist")
	cmd.AddCommand(
		newLDBGetCmd(f),
		newLDBPutCmd(f),
		newLDBDeleteCmd(f),
		newLDBDeleteRangeCmd(f),
		newLDBScanCmd(f),
		newLDBManifestCmd(f),
		newLDBCompactCmd(f),
		newLDBCheckpointCmd(f),
		newLDBUpdatesSinceCmd(f),
		newLDBMetricsCmd(f),
		newLDBLiveFilesCmd(f),
		newLDBOptionsCmd(f),
	)
	return cmd
}

// dir returns --db, which every ldb command needs.
func (f *ldbFlags) dir(cmd *cobra.Command) (string, error) {
	if f.db == "" {
		return "", &usageError{cmd: cmd, msg: "--db DIR is required"}
	}
	return f.db, nil
}

// options returns the engine options of the database in dir: those its
// OPTIONS file records (defaults for a directory without one), with the
// engine's log (warnings and errors only) going to stderr. A writing command
// then keeps the database's settings, and its record of them, as they were.
func (f *ldbFlags) options(cmd *cobra.Command, dir string) (*storage.Options, error) {
	opts := &storage.Options{}
	stored, err := storage.ReadOptionsFile(vfs.Default, dir)
	switch {
	case err == nil:
		opts = &stored.Options
	case !errors.Is(err, storage.ErrNoOptionsFile) && !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("read the database's options: %w", err)
	}
	h := slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})
	opts.Logger = slog.New(h)
	return opts, nil
}

// withDB opens the database (read-only or for writing), runs fn and closes
// the database, returning the first error.
func (f *ldbFlags) withDB(cmd *cobra.Command, readOnly bool, fn func(db *storage.DB) error) (err error) {
	dir, err := f.dir(cmd)
	if err != nil {
		return err
	}
	opts, err := f.options(cmd, dir)
	if err != nil {
		return err
	}
	var db *storage.DB
	if readOnly {
		db, err = storage.OpenReadOnly(dir, opts)
		if err != nil {
			return fmt.Errorf("open database read-only: %w", err)
		}
	} else {
		if !f.createIfMissing {
			// Open creates the directory and its LOCK file before it
			// notices there is no database; check first so a mistyped --db
			// leaves nothing behind.
			if _, serr := vfs.Default.Stat(vfs.Default.Join(dir, "CURRENT")); errors.Is(serr, os.ErrNotExist) {
				return fmt.Errorf("open database %s: no database there (no CURRENT file); use --create-if-missing to create one", dir)
			}
			opts.ErrorIfNotExists = true
		}
		unlock, lerr := lockOwningNode(dir)
		if lerr != nil {
			return lerr
		}
		defer unlock.Close()
		db, err = storage.Open(dir, opts)
		if err != nil {
			return fmt.Errorf("open database: %w", err)
		}
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close database %s: %w", dir, cerr)
		}
	}()
	return fn(db)
}

// lockOwningNode keeps ldb from writing to a shard engine of a running node.
// Shard engines take no LOCK file of their own: a node's lock on its raft log
// engine (<data>/raftlog/LOCK) covers its whole data directory. So for a
// directory <data>/shards/<id> beside a raft log, that lock is taken for as
// long as the database is open; for any other directory it does nothing.
func lockOwningNode(dir string) (io.Closer, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", dir, err)
	}
	if filepath.Base(filepath.Dir(abs)) != "shards" {
		return io.NopCloser(nil), nil
	}
	raftlog := filepath.Join(filepath.Dir(filepath.Dir(abs)), "raftlog")
	if _, err := os.Stat(filepath.Join(raftlog, "CURRENT")); err != nil {
		return io.NopCloser(nil), nil
	}
	l, err := vfs.Default.Lock(filepath.Join(raftlog, "LOCK"))
	if errors.Is(err, vfs.ErrLocked) {
		return nil, fmt.Errorf("open database %s: it is a shard engine of a running node (%s is locked); stop the node first, or use a read-only command", dir, raftlog)
	}
	if err != nil {
		return nil, fmt.Errorf("open database %s: lock the owning node's data directory: %w", dir, err)
	}
	return l, nil
}

// writeOptions returns the options of a write with or without --sync.
func writeOptions(sync bool) storage.WriteOptions {
	return storage.WriteOptions{Sync: sync}
}

// kvJSON is the JSON form of a key and its value.
type kvJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

func newLDBGetCmd(f *ldbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "get KEY",
		Short: "Print the value of KEY (exit status 1 and \"not found\" when it has none)",
		Example: `  shalectl debug ldb --db /data/db get user/42
  shalectl debug ldb --db /data/db --hex get 0x75736572`,
		Args: exactArgs("KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := f.format()
			if err != nil {
				return &usageError{cmd: cmd, msg: err.Error()}
			}
			c := f.codec()
			key, err := c.Parse(args[0])
			if err != nil {
				return fmt.Errorf("KEY: %w", err)
			}
			return f.withDB(cmd, true, func(db *storage.DB) error {
				v, err := db.Get(key)
				if errors.Is(err, storage.ErrNotFound) {
					return fmt.Errorf("key %s: not found", c.Format(key))
				}
				if err != nil {
					return fmt.Errorf("get %s: %w", c.Format(key), err)
				}
				out := cmd.OutOrStdout()
				if format == output.JSON {
					return output.WriteJSON(out, kvJSON{Key: c.Format(key), Value: c.Format(v)})
				}
				_, err = fmt.Fprintln(out, c.Format(v))
				return err
			})
		},
	}
}

// newWriteCmd builds a writing command taking len(argNames) arguments and
// a --sync flag; apply performs the write on the parsed arguments.
func newWriteCmd(f *ldbFlags, use, short, example string, argNames []string,
	apply func(db *storage.DB, args [][]byte, wo storage.WriteOptions) error) *cobra.Command {
	var sync bool
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    exactArgs(argNames...),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.textOnly(cmd); err != nil {
				return err
			}
			c := f.codec()
			parsed := make([][]byte, len(args))
			for i, a := range args {
				b, err := c.Parse(a)
				if err != nil {
					return fmt.Errorf("%s: %w", argNames[i], err)
				}
				parsed[i] = b
			}
			// OK only once the database is closed: Close syncs the WAL.
			err := f.withDB(cmd, false, func(db *storage.DB) error {
				return apply(db, parsed, writeOptions(sync))
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "OK")
			return err
		},
	}
	cmd.Flags().BoolVar(&sync, "sync", false, "sync the WAL before returning (the write is durable when OK is printed)")
	return cmd
}

func newLDBPutCmd(f *ldbFlags) *cobra.Command {
	return newWriteCmd(f, "put KEY VALUE", "Set KEY to VALUE",
		`  shalectl debug ldb --db /data/db put user/42 alice --sync
  shalectl debug ldb --db /data/db --create-if-missing put k v`,
		[]string{"KEY", "VALUE"},
		func(db *storage.DB, a [][]byte, wo storage.WriteOptions) error {
			if err := db.Set(a[0], a[1], wo); err != nil {
				return fmt.Errorf("put: %w", err)
			}
			return nil
		})
}

func newLDBDeleteCmd(f *ldbFlags) *cobra.Command {
	return newWriteCmd(f, "delete KEY", "Delete KEY",
		`  shalectl debug ldb --db /data/db delete user/42`,
		[]string{"KEY"},
		func(db *storage.DB, a [][]byte, wo storage.WriteOptions) error {
			if err := db.Delete(a[0], wo); err != nil {
				return fmt.Errorf("delete: %w", err)
			}
			return nil
		})
}

func newLDBDeleteRangeCmd(f *ldbFlags) *cobra.Command {
	return newWriteCmd(f, "delete-range START END", "Delete every key in [START, END)",
		`  shalectl debug ldb --db /data/db delete-range user/ user0`,
		[]string{"START", "END"},
		func(db *storage.DB, a [][]byte, wo storage.WriteOptions) error {
			if err := db.DeleteRange(a[0], a[1], wo); err != nil {
				return fmt.Errorf("delete-range: %w", err)
			}
			return nil
		})
}

func newLDBScanCmd(f *ldbFlags) *cobra.Command {
	var start, end, prefix string
	var reverse, keysOnly bool
	var limit int
	cmd := &cobra.Command{
		Use:   "scan",
		Short: "Print the keys and values in a range, in order",
		Long: `scan prints "key => value" per line (or only the key with --keys-only), in
key order or, with --reverse, in reverse order. --start is inclusive, --end
exclusive; --prefix restricts the scan to keys with that prefix (combined
with the bounds). With -o json it prints one JSON object per line.`,
		Example: `  shalectl debug ldb --db /data/db scan --prefix user/ --limit 10
  shalectl debug ldb --db /data/db scan --start a --end m --reverse -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := f.format()
			if err != nil {
				return &usageError{cmd: cmd, msg: err.Error()}
			}
			if limit < 0 {
				return &usageError{cmd: cmd, msg: "--limit must not be negative"}
			}
			c := f.codec()
			var opts storage.IterOptions
			if opts.LowerBound, err = c.ParseOptional(start); err != nil {
				return fmt.Errorf("--start: %w", err)
			}
			if opts.UpperBound, err = c.ParseOptional(end); err != nil {
				return fmt.Errorf("--end: %w", err)
			}
			if opts.Prefix, err = c.ParseOptional(prefix); err != nil {
				return fmt.Errorf("--prefix: %w", err)
			}
			return f.withDB(cmd, true, func(db *storage.DB) error {
				return scan(cmd.OutOrStdout(), db, &opts, c, format, reverse, keysOnly, limit)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&start, "start", "", "first `KEY` (inclusive)")
	fl.StringVar(&end, "end", "", "end `KEY` (exclusive)")
	fl.StringVar(&prefix, "prefix", "", "only keys starting with `PREFIX`")
	fl.BoolVar(&reverse, "reverse", false, "scan from the last key backwards")
	fl.BoolVar(&keysOnly, "keys-only", false, "print keys without values")
	fl.IntVar(&limit, "limit", 0, "print at most N keys (0: no limit)")
	return cmd
}

func scan(out io.Writer, db *storage.DB, opts *storage.IterOptions, c output.Codec, format output.Format,
	reverse, keysOnly bool, limit int) (err error) {
	it, err := db.NewIter(opts)
	if err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("scan: %w", cerr)
		}
	}()
	ok := it.First()
	if reverse {
		ok = it.Last()
	}
	for n := 0; ok && (limit == 0 || n < limit); n++ {
		k, v := c.Format(it.Key()), c.Format(it.Value())
		switch {
		case format == output.JSON && keysOnly:
			err = output.WriteJSONLine(out, struct {
				Key string `json:"key"`
			}{k})
		case format == output.JSON:
			err = output.WriteJSONLine(out, kvJSON{Key: k, Value: v})
		case keysOnly:
			_, err = fmt.Fprintln(out, k)
		default:
			_, err = fmt.Fprintf(out, "%s => %s\n", k, v)
		}
		if err != nil {
			return err
		}
		if reverse {
			ok = it.Prev()
		} else {
			ok = it.Next()
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	return nil
}

func newLDBCompactCmd(f *ldbFlags) *cobra.Command {
	var start, end string
	cmd := &cobra.Command{
		Use:   "compact",
		Short: "Flush the memtable and compact the files overlapping [--start, --end]",
		Long: `compact flushes the memtable and compacts every file overlapping the range
[--start, --end] (both inclusive; unbounded when omitted) down through the
levels, dropping deleted and overwritten data. It waits until done.`,
		Example: `  shalectl debug ldb --db /data/db compact
  shalectl debug ldb --db /data/db compact --start user/ --end user0`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.textOnly(cmd); err != nil {
				return err
			}
			c := f.codec()
			lo, err := c.ParseOptional(start)
			if err != nil {
				return fmt.Errorf("--start: %w", err)
			}
			hi, err := c.ParseOptional(end)
			if err != nil {
				return fmt.Errorf("--end: %w", err)
			}
			err = f.withDB(cmd, false, func(db *storage.DB) error {
				if err := db.CompactRange(lo, hi); err != nil {
					return fmt.Errorf("compact: %w", err)
				}
				return nil
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "OK")
			return err
		},
	}
	cmd.Flags().StringVar(&start, "start", "", "first `KEY` of the range (inclusive)")
	cmd.Flags().StringVar(&end, "end", "", "last `KEY` of the range (inclusive)")
	return cmd
}

func newLDBCheckpointCmd(f *ldbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "checkpoint DEST",
		Short: "Write an openable copy of the database into DEST (which must not exist)",
		Long: `checkpoint writes an openable copy of the database into the directory DEST,
which must not exist: SSTs are hard-linked when possible (copied otherwise),
the WAL still needed is copied and a new MANIFEST describes the live files.
It prints the checkpoint's sequence number and the files written.`,
		Example: `  shalectl debug ldb --db /data/db checkpoint /backup/db-2024-01-01`,
		Args:    exactArgs("DEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.textOnly(cmd); err != nil {
				return err
			}
			return f.withDB(cmd, false, func(db *storage.DB) error {
				info, err := db.Checkpoint(args[0])
				if err != nil {
					return fmt.Errorf("checkpoint: %w", err)
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "checkpoint %s at seq %d, %d files:\n", args[0], info.SeqNum, len(info.Files))
				for _, name := range info.Files {
					fmt.Fprintf(out, "  %s\n", name)
				}
				return nil
			})
		},
	}
}

// updateRecord is the JSON form of one record of a batch. Seq is absent for
// LOGDATA records, which consume no sequence number; End is the exclusive
// end of a RANGEDEL.
type updateRecord struct {
	Seq   *uint64 `json:"seq,omitempty"`
	Kind  string  `json:"kind"`
	Key   string  `json:"key,omitempty"`
	Value *string `json:"value,omitempty"`
	End   *string `json:"end,omitempty"`
	Data  *string `json:"data,omitempty"`
}

// updateBatch is the JSON form of one batch of updates-since.
type updateBatch struct {
	Seq     uint64         `json:"seq"`
	Count   uint32         `json:"count"`
	Records []updateRecord `json:"records"`
}

func newLDBUpdatesSinceCmd(f *ldbFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "updates-since SEQ",
		Short: "Print the batches committed since sequence number SEQ, from the WAL",
		Long: `updates-since prints, in commit order, every batch in the (live and archived)
WAL that holds a sequence number >= SEQ: its first sequence number, its count
of sequenced records, and each record: SET, DEL, MERGE, RANGEDEL with its
sequence number, and LOGDATA blobs (which have none). With -o json it prints
one JSON object per batch per line. It fails when the WAL holding SEQ is gone.`,
		Example: `  shalectl debug ldb --db /data/db updates-since 1
  shalectl debug ldb --db /data/db updates-since 1200 --limit 10 -o json`,
		Args: exactArgs("SEQ"),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := f.format()
			if err != nil {
				return &usageError{cmd: cmd, msg: err.Error()}
			}
			if limit < 0 {
				return &usageError{cmd: cmd, msg: "--limit must not be negative"}
			}
			seq, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("SEQ %q is not a sequence number", args[0])}
			}
			return f.withDB(cmd, true, func(db *storage.DB) error {
				return updatesSince(cmd.OutOrStdout(), db, storage.SeqNum(seq), f.codec(), format, limit)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most N batches (0: no limit)")
	return cmd
}

func updatesSince(out io.Writer, db *storage.DB, seq storage.SeqNum, c output.Codec, format output.Format, limit int) (err error) {
	it, err := db.UpdatesSince(seq)
	if err != nil {
		return fmt.Errorf("updates-since %d: %w", seq, err)
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("updates-since %d: close: %w", seq, cerr)
		}
	}()
	for n := 0; (limit == 0 || n < limit) && it.Next(); n++ {
		b := it.Batch()
		ub := updateBatch{Seq: uint64(b.SeqNum()), Count: b.Count(), Records: []updateRecord{}}
		r := b.Reader()
		next := uint64(b.SeqNum())
		for {
			kind, key, value, ok := r.Next()
			if !ok {
				break
			}
			rec := updateRecord{Kind: kind.String()}
			str := func(b []byte) *string { s := c.Format(b); return &s }
			switch kind {
			case storage.KindLogData:
				rec.Data = str(key)
			case storage.KindRangeDelete:
				rec.Key, rec.End = c.Format(key), str(value)
			case storage.KindDelete:
				rec.Key = c.Format(key)
			default:
				rec.Key, rec.Value = c.Format(key), str(value)
			}
			if kind != storage.KindLogData {
				s := next
				rec.Seq = &s
				next++
			}
			ub.Records = append(ub.Records, rec)
		}
		if err := r.Err(); err != nil {
			return fmt.Errorf("updates-since: batch at seq %d: %w", ub.Seq, err)
		}
		if format == output.JSON {
			if err := output.WriteJSONLine(out, ub); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(out, "batch seq=%d count=%d records=%d\n", ub.Seq, ub.Count, len(ub.Records))
		for _, rec := range ub.Records {
			switch {
			case rec.Data != nil:
				fmt.Fprintf(out, "  LOGDATA %s\n", *rec.Data)
			case rec.End != nil:
				fmt.Fprintf(out, "  #%d %s [%s, %s)\n", *rec.Seq, rec.Kind, rec.Key, *rec.End)
			case rec.Value != nil:
				fmt.Fprintf(out, "  #%d %s %s => %s\n", *rec.Seq, rec.Kind, rec.Key, *rec.Value)
			default:
				fmt.Fprintf(out, "  #%d %s %s\n", *rec.Seq, rec.Kind, rec.Key)
			}
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("updates-since %d: %w", seq, err)
	}
	return nil
}

func newLDBMetricsCmd(f *ldbFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "metrics",
		Short:   "Print the database's metrics (per-level table and totals)",
		Example: `  shalectl debug ldb --db /data/db metrics`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.textOnly(cmd); err != nil {
				return err
			}
			return f.withDB(cmd, true, func(db *storage.DB) error {
				_, err := io.WriteString(cmd.OutOrStdout(), db.Metrics().String())
				return err
			})
		},
	}
}

// liveFileJSON is the JSON form of a storage.LiveFile.
type liveFileJSON struct {
	Name             string `json:"name"`
	FileNum          uint64 `json:"file_num"`
	Level            int    `json:"level"`
	Size             uint64 `json:"size"`
	Smallest         string `json:"smallest"`
	Largest          string `json:"largest"`
	LargestExclusive bool   `json:"largest_exclusive"`
	SmallestSeq      uint64 `json:"smallest_seq"`
	LargestSeq       uint64 `json:"largest_seq"`
}

func newLDBLiveFilesCmd(f *ldbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "live-files",
		Short: "List the SST files of the current version and the current MANIFEST",
		Example: `  shalectl debug ldb --db /data/db live-files
  shalectl debug ldb --db /data/db live-files -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := f.format()
			if err != nil {
				return &usageError{cmd: cmd, msg: err.Error()}
			}
			c := f.codec()
			return f.withDB(cmd, true, func(db *storage.DB) error {
				files, manifestName, err := db.LiveFiles()
				if err != nil {
					return fmt.Errorf("live-files: %w", err)
				}
				js := make([]liveFileJSON, 0, len(files))
				var total uint64
				for _, lf := range files {
					total += lf.Size
					js = append(js, liveFileJSON{
						Name: lf.Name, FileNum: lf.FileNum, Level: lf.Level, Size: lf.Size,
						Smallest: c.Format(lf.Smallest), Largest: c.Format(lf.Largest),
						LargestExclusive: lf.LargestExclusive,
						SmallestSeq:      uint64(lf.SmallestSeq), LargestSeq: uint64(lf.LargestSeq),
					})
				}
				out := cmd.OutOrStdout()
				if format == output.JSON {
					return output.WriteJSON(out, struct {
						Manifest string         `json:"manifest"`
						Files    []liveFileJSON `json:"files"`
					}{manifestName, js})
				}
				fmt.Fprintf(out, "manifest: %s\n", manifestName)
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "level\tfile\tsize\tseqs\tsmallest\tlargest\n")
				for _, lf := range js {
					largest := lf.Largest
					if lf.LargestExclusive {
						largest += " (exclusive)"
					}
					fmt.Fprintf(tw, "L%d\t%s\t%d\t[%d, %d]\t%s\t%s\n",
						lf.Level, lf.Name, lf.Size, lf.SmallestSeq, lf.LargestSeq, lf.Smallest, largest)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "total: %d files, %s\n", len(files), output.Bytes(total))
				return err
			})
		},
	}
}

func newLDBOptionsCmd(f *ldbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "options",
		Short: "Print the options the database was last opened for writing with (its OPTIONS file)",
		Long: `options prints the newest OPTIONS file of the database: the settings
(memtable, level and WAL sizes, per-level block and compression settings) and
the comparator, merge operator, compaction filter and prefix extractor names
the database was last opened for writing with. The file's checksum is
verified. It does not open the database.`,
		Example: `  shalectl debug ldb --db /data/db options`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.textOnly(cmd); err != nil {
				return err
			}
			dir, err := f.dir(cmd)
			if err != nil {
				return err
			}
			s, err := storage.ReadOptionsFile(vfs.Default, dir)
			if err != nil {
				return fmt.Errorf("options: %w", err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "# %s\n%s", s.File, s.Text)
			return err
		},
	}
}
