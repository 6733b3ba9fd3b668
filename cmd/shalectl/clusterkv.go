package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

// kvFlags are the flags shared by the kv commands.
type kvFlags struct {
	*clusterFlags
	hex bool
}

func (f *kvFlags) keys() keyFormat { return keyFormat{hex: f.hex} }

// parseArgs decodes the positional arguments named names (all of args).
func (f *kvFlags) parseArgs(args []string, names ...string) ([][]byte, error) {
	c := f.keys().codec()
	out := make([][]byte, len(args))
	for i, a := range args {
		b, err := c.Parse(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[i], err)
		}
		out[i] = b
	}
	return out, nil
}

// kvRecord is the JSON form of a key-value.
type kvRecord struct {
	Key            string  `json:"key"`
	Value          *string `json:"value,omitempty"`
	CreateRevision uint64  `json:"create_revision"`
	ModRevision    uint64  `json:"mod_revision"`
	Version        uint64  `json:"version"`
	// ExpireAt is the expiry time in RFC 3339 (UTC), absent without TTL.
	ExpireAt string `json:"expire_at,omitempty"`
}

func (f *kvFlags) record(kv *client.KeyValue, withValue bool) *kvRecord {
	if kv == nil {
		return nil
	}
	k := f.keys()
	r := &kvRecord{Key: k.format(kv.Key), CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version}
	if withValue {
		v := k.format(kv.Value)
		r.Value = &v
	}
	if !kv.ExpireAt.IsZero() {
		r.ExpireAt = kv.ExpireAt.UTC().Format(time.RFC3339Nano)
	}
	return r
}

// consistencyFlag registers --consistency and returns its parsed value.
func consistencyFlag(cmd *cobra.Command) func() (client.Consistency, error) {
	s := cmd.Flags().String("consistency", "linearizable",
		"read consistency: linearizable (at the leader), follower (linearizable, any replica) or stale (any replica, may lag)")
	return func() (client.Consistency, error) {
		c, err := client.ParseConsistency(*s)
		if err != nil {
			return 0, &usageError{cmd: cmd, msg: fmt.Sprintf("--consistency: unknown value %q (want linearizable, follower or stale)", *s)}
		}
		return c, nil
	}
}

// newKVCmd builds the "kv" command group.
func newKVCmd(cf *clusterFlags) *cobra.Command {
	f := &kvFlags{clusterFlags: cf}
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Read and write keys in a running cluster",
		Long: `The kv commands read and write keys in the cluster reached through
--endpoints, routing each request to the shard that holds the key.

Keys and values are taken literally from the command line; with --hex they
are hexadecimal (0x prefix optional). Keys and values are printed as they are
when they are printable UTF-8, as double-quoted Go string literals with
escapes otherwise, and as 0x-prefixed hexadecimal with --hex.`,
		Args: noArgs,
		RunE: groupHelp,
	}
	cmd.PersistentFlags().BoolVar(&f.hex, "hex", false, "read and print keys and values as hexadecimal")
	cmd.AddCommand(newKVGetCmd(f), newKVPutCmd(f), newKVDelCmd(f), newKVScanCmd(f), newKVCASCmd(f))
	return cmd
}

func newKVGetCmd(f *kvFlags) *cobra.Command {
	var outputFile string
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print the value of KEY (exit status 1 and \"key not found\" when absent)",
		Long: `get prints the value of KEY, formatted (see kv --help), or with
--output-file F writes its bytes to the file F as they are (- for stdout, with
no newline), for values that are binary or large. With -o json it prints the
key's record (without the value when --output-file is given).`,
		Example: `  shalectl kv get user/42
  shalectl kv get user/42 --consistency stale -o json
  shalectl kv get images/logo --output-file logo.png`,
		Args: exactArgs("KEY"),
	}
	cmd.Flags().StringVar(&outputFile, "output-file", "", "write the value's bytes, unformatted, to this file (- for stdout)")
	consistency := consistencyFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := f.jsonOutput(cmd)
		if err != nil {
			return err
		}
		cons, err := consistency()
		if err != nil {
			return err
		}
		a, err := f.parseArgs(args, "KEY")
		if err != nil {
			return err
		}
		return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
			kv, err := c.Get(ctx, a[0], client.WithConsistency(cons))
			if errors.Is(err, client.ErrNotFound) {
				return fmt.Errorf("key not found: %s", f.keys().format(a[0]))
			}
			if err != nil {
				return fmt.Errorf("get %s: %w", f.keys().format(a[0]), err)
			}
			out := cmd.OutOrStdout()
			if outputFile != "" {
				if err := writeValueFile(out, outputFile, kv.Value); err != nil {
					return err
				}
				if asJSON {
					return output.WriteJSON(out, f.record(kv, false))
				}
				return nil
			}
			if asJSON {
				return output.WriteJSON(out, f.record(kv, true))
			}
			_, err = fmt.Fprintln(out, f.keys().format(kv.Value))
			return err
		})
	}
	return cmd
}

// writeValueFile writes a value's bytes to path (- for stdout), replacing
// the file: to a temporary file beside it, synced and renamed into place,
// so that a failed write never leaves half a value under the name.
func writeValueFile(stdout io.Writer, path string, value []byte) error {
	if path == "-" {
		_, err := stdout.Write(value)
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("--output-file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, there is nothing left to remove
	if _, err := tmp.Write(value); err != nil {
		tmp.Close()
		return fmt.Errorf("--output-file: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("--output-file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("--output-file: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--output-file: close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("--output-file: %w", err)
	}
	return nil
}

// readValue returns the VALUE of kv put: the argument (decoded as keys are,
// see --hex), or the bytes of stdin when it is "-", or of the file given
// with --value-file (which replaces the argument), as they are.
func (f *kvFlags) readValue(cmd *cobra.Command, args []string, valueFile string) ([]byte, error) {
	switch {
	case valueFile != "":
		if len(args) != 1 {
			return nil, &usageError{cmd: cmd, msg: fmt.Sprintf("%s --value-file takes 1 argument, KEY; got %d", cmd.CommandPath(), len(args))}
		}
		v, err := os.ReadFile(valueFile)
		if err != nil {
			return nil, fmt.Errorf("--value-file: %w", err)
		}
		return v, nil
	case len(args) != 2:
		return nil, &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes 2 argument(s), KEY VALUE (or KEY with --value-file); got %d", cmd.CommandPath(), len(args))}
	case args[1] == "-":
		v, err := io.ReadAll(stdinOf(cmd))
		if err != nil {
			return nil, fmt.Errorf("read VALUE from stdin: %w", err)
		}
		return v, nil
	}
	v, err := f.keys().codec().Parse(args[1])
	if err != nil {
		return nil, fmt.Errorf("VALUE: %w", err)
	}
	return v, nil
}

func newKVPutCmd(f *kvFlags) *cobra.Command {
	var ttl time.Duration
	var prev bool
	var valueFile string
	cmd := &cobra.Command{
		Use:   "put KEY VALUE | put KEY - | put KEY --value-file F",
		Short: "Set KEY to VALUE",
		Long: `put sets KEY to VALUE. VALUE is taken from the command line (as hexadecimal
with --hex); given as -, it is read from stdin, and with --value-file F (and no
VALUE) from the file F, byte for byte in both cases (--hex does not apply):
the way to write a value larger than the shell's argument limit, or binary.
A value over the cluster's limit (--max-value-bytes, 1 MiB by default) fails
at once with "invalid argument".`,
		Example: `  shalectl kv put user/42 alice
  shalectl kv put session/9 token --ttl 30m --prev
  shalectl kv --hex put 0x00ff 0x0102
  shalectl kv put images/logo --value-file logo.png
  gzip -c report.txt | shalectl kv put reports/today -`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || len(args) > 2 {
				return &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes 2 argument(s), KEY VALUE (or KEY with --value-file); got %d", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			if ttl < 0 {
				return &usageError{cmd: cmd, msg: "--ttl must not be negative"}
			}
			value, err := f.readValue(cmd, args, valueFile)
			if err != nil {
				return err
			}
			a, err := f.parseArgs(args[:1], "KEY")
			if err != nil {
				return err
			}
			a = append(a, value)
			opts := []client.PutOption{client.WithTTL(ttl)}
			if prev {
				opts = append(opts, client.WithPrevKV())
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.Put(ctx, a[0], a[1], opts...)
				if err != nil {
					return fmt.Errorf("put %s: %w", f.keys().format(a[0]), err)
				}
				out := cmd.OutOrStdout()
				if asJSON {
					v := struct {
						Revision uint64    `json:"revision"`
						PrevKV   *kvRecord `json:"prev_kv,omitempty"`
					}{r.Revision, f.record(r.PrevKV, true)}
					return output.WriteJSON(out, v)
				}
				fmt.Fprintf(out, "OK (revision %d)\n", r.Revision)
				if prev {
					if r.PrevKV == nil {
						_, err = fmt.Fprintln(out, "previous: (none)")
					} else {
						_, err = fmt.Fprintf(out, "previous: %s\n", f.keys().format(r.PrevKV.Value))
					}
				}
				return err
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "expire the key this long after the write (e.g. 10s, 5m; 0: never)")
	cmd.Flags().BoolVar(&prev, "prev", false, "print the previous value")
	cmd.Flags().StringVar(&valueFile, "value-file", "", "read the value from this file, byte for byte (then VALUE is not given)")
	return cmd
}

func newKVDelCmd(f *kvFlags) *cobra.Command {
	var prev bool
	cmd := &cobra.Command{
		Use:     "del KEY",
		Aliases: []string{"delete"},
		Short:   "Delete KEY (deleting an absent key is not an error)",
		Example: `  shalectl kv del user/42 --prev`,
		Args:    exactArgs("KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			a, err := f.parseArgs(args, "KEY")
			if err != nil {
				return err
			}
			var opts []client.DeleteOption
			if prev {
				opts = append(opts, client.WithPrevKV())
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.Delete(ctx, a[0], opts...)
				if err != nil {
					return fmt.Errorf("delete %s: %w", f.keys().format(a[0]), err)
				}
				out := cmd.OutOrStdout()
				n := 0
				if r.Deleted {
					n = 1
				}
				if asJSON {
					v := struct {
						Deleted  int       `json:"deleted"`
						Revision uint64    `json:"revision"`
						PrevKV   *kvRecord `json:"prev_kv,omitempty"`
					}{n, r.Revision, f.record(r.PrevKV, true)}
					return output.WriteJSON(out, v)
				}
				if !r.Deleted {
					_, err = fmt.Fprintln(out, "deleted 0 keys (the key did not exist)")
					return err
				}
				fmt.Fprintf(out, "deleted 1 key (revision %d)\n", r.Revision)
				if r.PrevKV != nil {
					_, err = fmt.Fprintf(out, "previous: %s\n", f.keys().format(r.PrevKV.Value))
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&prev, "prev", false, "print the deleted value")
	return cmd
}

// maxArgs accepts up to len(names) positional arguments.
func maxArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > len(names) {
			return &usageError{cmd: cmd, msg: fmt.Sprintf("%s takes at most %d argument(s), %s; got %d",
				cmd.CommandPath(), len(names), strings.Join(names, " "), len(args))}
		}
		return nil
	}
}

// scanFlushRows is how many rows the scan table aligns at a time: the
// output streams in blocks, so memory stays bounded on large scans.
const scanFlushRows = 1000

// scanValueMax is where scan cuts values in the table unless --full-values.
const scanValueMax = 64

func newKVScanCmd(f *kvFlags) *cobra.Command {
	var prefix string
	var reverse, keysOnly, fullValues bool
	var limit, pageSize int
	cmd := &cobra.Command{
		Use:   "scan [START [END]]",
		Short: "List the keys in [START, END) in order, across shards",
		Long: `scan lists the keys in [START, END) (START inclusive, END exclusive; both
optional: unbounded when omitted or empty) in key order, or in reverse order
with --reverse, walking the shards in order one page at a time. --prefix P
lists the keys starting with P instead of a range.

The table has a KEY and a VALUE column (values are cut after 64 bytes unless
--full-values; no VALUE with --keys-only). With -o json each key is a line
{"key", "value", "create_revision", "mod_revision", "version", "expire_at"}.`,
		Example: `  shalectl kv scan user/ user0
  shalectl kv scan --prefix user/ --reverse --limit 10
  shalectl kv scan --keys-only -o json`,
		Args: maxArgs("START", "END"),
	}
	consistency := consistencyFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := f.jsonOutput(cmd)
		if err != nil {
			return err
		}
		if limit < 0 || pageSize < 0 {
			return &usageError{cmd: cmd, msg: "--limit and --page-size must not be negative"}
		}
		cons, err := consistency()
		if err != nil {
			return err
		}
		bounds, err := f.parseArgs(args, "START", "END")
		if err != nil {
			return err
		}
		var start, end []byte
		if len(bounds) > 0 {
			start = bounds[0]
		}
		if len(bounds) > 1 {
			end = bounds[1]
		}
		opts := []client.ScanOption{client.WithLimit(limit), client.WithPageSize(pageSize), client.WithScanConsistency(cons)}
		if cmd.Flags().Changed("prefix") {
			if len(args) > 0 {
				return &usageError{cmd: cmd, msg: "--prefix cannot be combined with START or END"}
			}
			p, err := f.keys().codec().Parse(prefix)
			if err != nil {
				return fmt.Errorf("--prefix: %w", err)
			}
			opts = append(opts, client.WithPrefix(p))
		}
		if reverse {
			opts = append(opts, client.WithReverse())
		}
		if keysOnly {
			opts = append(opts, client.WithKeysOnly())
		}
		return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
			return f.scan(ctx, cmd, c, start, end, opts, asJSON, keysOnly, fullValues)
		})
	}
	fl := cmd.Flags()
	fl.StringVar(&prefix, "prefix", "", "list the keys starting with `PREFIX` (instead of START and END)")
	fl.BoolVar(&reverse, "reverse", false, "list from the last key backwards")
	fl.IntVar(&limit, "limit", 0, "list at most N keys (0: no limit)")
	fl.BoolVar(&keysOnly, "keys-only", false, "list keys without values")
	fl.BoolVar(&fullValues, "full-values", false, "print values in full in the table")
	fl.IntVar(&pageSize, "page-size", 0, "fetch pages of N keys, one request each (0: each shard's part streams on one call, in the server's pages)")
	return cmd
}

func (f *kvFlags) scan(ctx context.Context, cmd *cobra.Command, c *client.Client, start, end []byte,
	opts []client.ScanOption, asJSON, keysOnly, fullValues bool) error {
	out := cmd.OutOrStdout()
	k := f.keys()
	it := c.Scan(ctx, start, end, opts...)
	defer it.Close()
	tw := newTable(out)
	rows := 0
	for it.Next() {
		kv := it.KV()
		if asJSON {
			if err := output.WriteJSONLine(out, f.record(kv, !keysOnly)); err != nil {
				return err
			}
			continue
		}
		if rows%scanFlushRows == 0 {
			if err := tw.Flush(); err != nil {
				return err
			}
			if keysOnly {
				fmt.Fprintln(tw, "KEY")
			} else {
				fmt.Fprintln(tw, "KEY\tVALUE")
			}
		}
		rows++
		if keysOnly {
			fmt.Fprintln(tw, k.format(kv.Key))
			continue
		}
		v := k.truncated(kv.Value, scanValueMax)
		if fullValues {
			v = k.format(kv.Value)
		}
		fmt.Fprintf(tw, "%s\t%s\n", k.format(kv.Key), v)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	return nil
}

func newKVCASCmd(f *kvFlags) *cobra.Command {
	var expectAbsent bool
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "cas KEY EXPECTED NEW | cas --expect-absent KEY NEW",
		Short: "Set KEY to NEW if its value is EXPECTED (or, with --expect-absent, if it is absent)",
		Long: `cas atomically sets KEY to NEW if its current value is EXPECTED, or, with
--expect-absent (which drops the EXPECTED argument), if KEY does not exist.
When the comparison fails nothing is written, the current value is reported,
and the exit status is 1.`,
		Example: `  shalectl kv cas config/leader node-1 node-2
  shalectl kv cas --expect-absent lock/job-7 worker-3 --ttl 30s`,
		RunE: func(cmd *cobra.Command, args []string) error {
			names := []string{"KEY", "EXPECTED", "NEW"}
			if expectAbsent {
				names = []string{"KEY", "NEW"}
			}
			if err := exactArgs(names...)(cmd, args); err != nil {
				return err
			}
			asJSON, err := f.jsonOutput(cmd)
			if err != nil {
				return err
			}
			if ttl < 0 {
				return &usageError{cmd: cmd, msg: "--ttl must not be negative"}
			}
			a, err := f.parseArgs(args, names...)
			if err != nil {
				return err
			}
			key, expected, newValue := a[0], []byte(nil), a[len(a)-1]
			opts := []client.CASOption{client.WithCASTTL(ttl)}
			if expectAbsent {
				opts = append(opts, client.ExpectAbsent())
			} else {
				expected = a[1]
			}
			k := f.keys()
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				ok, cur, err := c.CompareAndSwap(ctx, key, expected, newValue, opts...)
				if err != nil {
					return fmt.Errorf("cas %s: %w", k.format(key), err)
				}
				out := cmd.OutOrStdout()
				if asJSON {
					v := struct {
						Succeeded bool      `json:"succeeded"`
						Current   *kvRecord `json:"current"`
					}{ok, f.record(cur, true)}
					if err := output.WriteJSON(out, v); err != nil {
						return err
					}
				} else if ok {
					if _, err := fmt.Fprintln(out, "OK"); err != nil {
						return err
					}
				}
				if ok {
					return nil
				}
				if cur == nil {
					return fmt.Errorf("compare failed: key %s does not exist", k.format(key))
				}
				if expectAbsent {
					return fmt.Errorf("compare failed: key %s exists (value %s)", k.format(key), k.truncated(cur.Value, scanValueMax))
				}
				return fmt.Errorf("compare failed: key %s has value %s", k.format(key), k.truncated(cur.Value, scanValueMax))
			})
		},
	}
	cmd.Flags().BoolVar(&expectAbsent, "expect-absent", false, "succeed only if KEY does not exist (then EXPECTED is not given)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "expire the new value this long after the write (0: never)")
	return cmd
}
