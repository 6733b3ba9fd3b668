package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

// watchRecord is the JSON form of a watch event or progress report.
type watchRecord struct {
	// Type is PUT, DELETE or PROGRESS.
	Type     string    `json:"type"`
	ShardID  uint64    `json:"shard_id"`
	Revision uint64    `json:"revision"`
	KV       *kvRecord `json:"kv,omitempty"`
	PrevKV   *kvRecord `json:"prev_kv,omitempty"`
}

func newWatchCmd(cf *clusterFlags) *cobra.Command {
	f := &kvFlags{clusterFlags: cf}
	var (
		startRev       uint64
		prevKV, notify bool
		count          int
		duration       time.Duration
		rangeEnd       string
	)
	cmd := &cobra.Command{
		Use:   "watch PREFIX",
		Short: "Print the changes to the keys starting with PREFIX as they happen",
		Long: `watch prints every change to the keys starting with PREFIX (or, with
--range-end, to the keys in [PREFIX, END)) as it happens, until interrupted,
--count events have been printed or --duration has passed. An empty PREFIX
("") watches every key.

The watch spans shards and follows splits, merges and leader changes; after
a lost connection it resumes where it was, so every change is printed once,
each key's changes in order. --timeout bounds connecting only.

Each change is a line "PUT KEY VALUE" or "DELETE KEY" (with --prev-kv, the
previous value follows as "(was VALUE)"). With -o json each is a line
{"type", "shard_id", "revision", "kv", "prev_kv"}; --progress adds
{"type": "PROGRESS", "shard_id", "revision"} lines when a shard's part of the
range is idle: every change up to that shard revision has been printed.

Revisions are per shard: --start-revision R replays the changes from
revision R of every shard the range covers, if they are still kept.`,
		Example: `  shalectl watch user/
  shalectl watch user/ --prev-kv -o json
  shalectl watch "" --count 10`,
		Args: exactArgs("PREFIX"),
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := f.jsonOutput(cmd)
		if err != nil {
			return err
		}
		if count < 0 || duration < 0 {
			return &usageError{cmd: cmd, msg: "--count and --duration must not be negative"}
		}
		a, err := f.parseArgs(args, "PREFIX")
		if err != nil {
			return err
		}
		var opts []client.WatchOption
		var start, end []byte
		if cmd.Flags().Changed("range-end") {
			start = a[0]
			if end, err = f.keys().codec().Parse(rangeEnd); err != nil {
				return fmt.Errorf("--range-end: %w", err)
			}
		} else {
			opts = append(opts, client.WithWatchPrefix(a[0]))
		}
		if prevKV {
			opts = append(opts, client.WithPrevKV())
		}
		if notify {
			opts = append(opts, client.WithProgressNotify())
		}
		if startRev > 0 {
			opts = append(opts, client.WithStartRevision(startRev))
		}
		ctx, c, cleanup, err := f.connectUntilDone(cmd, duration)
		if err != nil {
			return err
		}
		defer cleanup()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		return f.watch(cmd, c.Watch(wctx, start, end, opts...), asJSON, count, cancel)
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.hex, "hex", false, "read and print keys and values as hexadecimal")
	fl.StringVar(&rangeEnd, "range-end", "", "watch the keys in [PREFIX, `END`) instead of those starting with PREFIX (empty: to the end of the key space)")
	fl.Uint64Var(&startRev, "start-revision", 0, "replay the changes from this revision of each shard (0: only new changes)")
	fl.BoolVar(&prevKV, "prev-kv", false, "print each change's previous value")
	fl.BoolVar(&notify, "progress", false, "print progress reports when a shard's part of the range is idle")
	fl.IntVar(&count, "count", 0, "exit after printing N changes (0: no limit)")
	fl.DurationVar(&duration, "duration", 0, "exit after this long (0: until interrupted)")
	return cmd
}

// watch prints a watch's responses until it ends, count changes were
// printed, or the context ends (a normal end).
func (f *kvFlags) watch(cmd *cobra.Command, ch <-chan client.WatchResponse, asJSON bool, count int, cancel context.CancelFunc) error {
	out := cmd.OutOrStdout()
	k := f.keys()
	printed := 0
	for resp := range ch {
		if resp.Err != nil {
			return fmt.Errorf("watch: %w", resp.Err)
		}
		if len(resp.Events) == 0 {
			if asJSON {
				if err := output.WriteJSONLine(out, watchRecord{Type: "PROGRESS", ShardID: resp.ShardID, Revision: resp.Revision}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(out, "PROGRESS shard %d revision %d\n", resp.ShardID, resp.Revision)
			}
			continue
		}
		for _, e := range resp.Events {
			typ := "PUT"
			if e.Type == client.EventDelete {
				typ = "DELETE"
			}
			if asJSON {
				rec := watchRecord{Type: typ, ShardID: resp.ShardID, Revision: e.KV.ModRevision,
					KV: f.record(e.KV, e.Type == client.EventPut), PrevKV: f.record(e.PrevKV, true)}
				if err := output.WriteJSONLine(out, rec); err != nil {
					return err
				}
			} else {
				line := typ + " " + k.format(e.KV.Key)
				if e.Type == client.EventPut {
					line += " " + k.format(e.KV.Value)
				}
				if e.PrevKV != nil {
					line += " (was " + k.format(e.PrevKV.Value) + ")"
				}
				if _, err := fmt.Fprintln(out, line); err != nil {
					return err
				}
			}
			if printed++; count > 0 && printed >= count {
				cancel()
				for range ch { // let the watch wind down
				}
				return nil
			}
		}
	}
	return nil // interrupted, or --duration passed
}
