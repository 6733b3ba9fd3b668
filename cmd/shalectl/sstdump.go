package main

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
	"github.com/shale-db/shale/storage"
	"github.com/shale-db/shale/storage/sstable"
	"github.com/shale-db/shale/storage/vfs"
)

// defaultValueWidth is how many bytes of a value sst-dump prints without
// --full-values.
const defaultValueWidth = 64

// The sections sst-dump can show, in output order.
var sstDumpSections = []string{"properties", "blocks", "tombstones", "keys"}

// sstDumpFlags are the flags of "debug sst-dump".
type sstDumpFlags struct {
	*debugFlags
	show       []string
	limit      int
	start, end string
	fullValues bool
	verify     bool
}

func newSSTDumpCmd(d *debugFlags) *cobra.Command {
	f := &sstDumpFlags{debugFlags: d}
	cmd := &cobra.Command{
		Use:   "sst-dump FILE",
		Short: "Print an SST file's properties, block layout, range tombstones and keys",
		Long: `sst-dump prints an SST file: its properties (every field), its block layout
(kind, offset, length and compression of every block), its range tombstones
and its point entries, as internal keys key#seq,KIND with their values.

It verifies the checksum of every block of the file (reading all data blocks,
whatever --start, --end and --limit select): a damaged file fails with an
error naming the file and the offset of the damaged block, and exit status 1.`,
		Example: `  shalectl debug sst-dump /data/db/000012.sst
  shalectl debug sst-dump /data/db/000012.sst --show keys --start user/1 --end user/2 --limit 10
  shalectl debug sst-dump /data/db/000012.sst --show properties -o json`,
		Args: exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.run(cmd, args[0])
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&f.show, "show", sstDumpSections,
		"sections to print, comma-separated: "+strings.Join(sstDumpSections, ", ")+" (or all)")
	fl.IntVar(&f.limit, "limit", 0, "print at most N keys (0: no limit)")
	fl.StringVar(&f.start, "start", "", "print keys with user key >= `KEY`")
	fl.StringVar(&f.end, "end", "", "print keys with user key < `KEY`")
	fl.BoolVar(&f.fullValues, "full-values", false,
		fmt.Sprintf("print values in full (default: the first %d bytes)", defaultValueWidth))
	fl.BoolVar(&f.verify, "verify", true,
		"read every data block to verify its checksum (false: read only the blocks the printed keys need)")
	return cmd
}

// sstDump is the JSON form of sst-dump's output. Sections not shown are
// null.
type sstDump struct {
	File       string         `json:"file"`
	Size       int64          `json:"size"`
	Properties *sstProperties `json:"properties"`
	Layout     *sstLayout     `json:"layout"`
	Tombstones []sstTombstone `json:"range_tombstones"`
	Keys       []sstKey       `json:"keys"`
	// ChecksumsVerified is true when every block was read and verified.
	ChecksumsVerified bool `json:"checksums_verified"`
}

// sstProperties mirrors sstable.Properties, every field.
type sstProperties struct {
	NumEntries        uint64            `json:"num_entries"`
	NumDeletions      uint64            `json:"num_deletions"`
	NumMerges         uint64            `json:"num_merges"`
	NumRangeDeletions uint64            `json:"num_range_deletions"`
	RawKeySize        uint64            `json:"raw_key_size"`
	RawValueSize      uint64            `json:"raw_value_size"`
	DataSize          uint64            `json:"data_size"`
	IndexSize         uint64            `json:"index_size"`
	FilterSize        uint64            `json:"filter_size"`
	NumDataBlocks     uint64            `json:"num_data_blocks"`
	Compression       string            `json:"compression"`
	FilterPolicy      string            `json:"filter_policy"`
	WholeKeyFiltering bool              `json:"whole_key_filtering"`
	PrefixExtractor   string            `json:"prefix_extractor"`
	Comparator        string            `json:"comparator"`
	SmallestSeq       uint64            `json:"smallest_seq"`
	LargestSeq        uint64            `json:"largest_seq"`
	CreationTime      int64             `json:"creation_time"`
	FormatVersion     uint32            `json:"format_version"`
	UserProperties    map[string]string `json:"user_properties"`
}

type sstLayout struct {
	Blocks        []sstBlock `json:"blocks"`
	FooterOffset  uint64     `json:"footer_offset"`
	FooterLength  uint64     `json:"footer_length"`
	FormatVersion uint32     `json:"format_version"`
}

type sstBlock struct {
	Kind        string `json:"kind"`
	Offset      uint64 `json:"offset"`
	Length      uint64 `json:"length"`
	Compression string `json:"compression"`
}

type sstTombstone struct {
	Start string `json:"start"`
	End   string `json:"end"`
	Seq   uint64 `json:"seq"`
}

type sstKey struct {
	Key   string  `json:"key"`
	Seq   uint64  `json:"seq"`
	Kind  string  `json:"kind"`
	Value *string `json:"value,omitempty"`
}

func convertProperties(p *sstable.Properties) *sstProperties {
	return &sstProperties{
		NumEntries:        p.NumEntries,
		NumDeletions:      p.NumDeletions,
		NumMerges:         p.NumMerges,
		NumRangeDeletions: p.NumRangeDeletions,
		RawKeySize:        p.RawKeySize,
		RawValueSize:      p.RawValueSize,
		DataSize:          p.DataSize,
		IndexSize:         p.IndexSize,
		FilterSize:        p.FilterSize,
		NumDataBlocks:     p.NumDataBlocks,
		Compression:       p.CompressionName,
		FilterPolicy:      p.FilterPolicyName,
		WholeKeyFiltering: p.WholeKeyFiltering,
		PrefixExtractor:   p.PrefixExtractorName,
		Comparator:        p.ComparatorName,
		SmallestSeq:       uint64(p.SmallestSeq),
		LargestSeq:        uint64(p.LargestSeq),
		CreationTime:      p.CreationTime,
		FormatVersion:     p.FormatVersion,
		UserProperties:    p.UserProperties,
	}
}

// parseSections validates --show.
func parseSections(show []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, s := range show {
		s = strings.TrimSpace(s)
		switch {
		case s == "all":
			for _, n := range sstDumpSections {
				out[n] = true
			}
		case slices.Contains(sstDumpSections, s):
			out[s] = true
		default:
			return nil, fmt.Errorf("--show: unknown section %q (want %s or all)", s, strings.Join(sstDumpSections, ", "))
		}
	}
	return out, nil
}

func (f *sstDumpFlags) run(cmd *cobra.Command, path string) error {
	format, err := f.format()
	if err != nil {
		return &usageError{cmd: cmd, msg: err.Error()}
	}
	show, err := parseSections(f.show)
	if err != nil {
		return &usageError{cmd: cmd, msg: err.Error()}
	}
	if f.limit < 0 {
		return &usageError{cmd: cmd, msg: "--limit must not be negative"}
	}
	codec := f.codec()
	start, err := codec.ParseOptional(f.start)
	if err != nil {
		return fmt.Errorf("--start: %w", err)
	}
	end, err := codec.ParseOptional(f.end)
	if err != nil {
		return fmt.Errorf("--end: %w", err)
	}
	if start != nil && end != nil && bytes.Compare(start, end) >= 0 {
		return &usageError{cmd: cmd, msg: "--start must be below --end"}
	}

	file, err := vfs.Default.Open(path)
	if err != nil {
		return fmt.Errorf("sst-dump: %w", err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return fmt.Errorf("sst-dump: stat %s: %w", path, err)
	}
	// NewReader verifies the footer and the metaindex, properties, index,
	// filter and dictionary blocks; its errors name the file and offset.
	r, err := sstable.NewReader(file, fi.Size(), sstable.ReaderOptions{FileName: path})
	if err != nil {
		return fmt.Errorf("sst-dump: open table: %w", err)
	}
	defer r.Close()
	layout, err := r.Layout()
	if err != nil {
		return fmt.Errorf("sst-dump: read block layout: %w", err)
	}
	tombs, err := r.RangeDels()
	if err != nil {
		return fmt.Errorf("sst-dump: read range tombstones: %w", err)
	}

	out := cmd.OutOrStdout()
	dump := &sstDump{File: path, Size: fi.Size()}
	text := format == output.Text
	if text {
		fmt.Fprintf(out, "file: %s (%d bytes)\n", path, fi.Size())
	}
	if show["properties"] {
		dump.Properties = convertProperties(r.Properties())
		if text {
			printProperties(out, dump.Properties)
		}
	}
	if show["blocks"] {
		dump.Layout = &sstLayout{FooterOffset: layout.FooterOffset, FooterLength: sstable.FooterLen, FormatVersion: layout.FormatVersion}
		for _, b := range layout.Blocks {
			dump.Layout.Blocks = append(dump.Layout.Blocks, sstBlock(b))
		}
		if text {
			printLayout(out, dump.Layout)
		}
	}
	if show["tombstones"] {
		dump.Tombstones = []sstTombstone{}
		for _, t := range tombs {
			if (end != nil && bytes.Compare(t.Start, end) >= 0) || (start != nil && bytes.Compare(t.End, start) <= 0) {
				continue
			}
			dump.Tombstones = append(dump.Tombstones, sstTombstone{Start: codec.Format(t.Start), End: codec.Format(t.End), Seq: uint64(t.Seq)})
		}
		if text {
			fmt.Fprintf(out, "\nrange tombstones (%d):\n", len(dump.Tombstones))
			for _, t := range dump.Tombstones {
				fmt.Fprintf(out, "  [%s, %s)#%d\n", t.Start, t.End, t.Seq)
			}
		}
	}

	// Keys, and the data-block checksums: with --verify the iterator walks
	// every entry of the file (unbounded), so every data block is read and
	// verified; entries outside the bounds or past the limit are skipped.
	var lower, upper []byte
	if !f.verify {
		lower, upper = start, end
	}
	if show["keys"] {
		dump.Keys = []sstKey{}
		if text {
			fmt.Fprintf(out, "\nkeys%s:\n", describeBounds(codec, start, end))
		}
	}
	width := defaultValueWidth
	if f.fullValues {
		width = 0
	}
	shown := 0
	walk := show["keys"] || f.verify
	if walk {
		it, err := r.NewIter(lower, upper)
		if err != nil {
			return fmt.Errorf("sst-dump: iterate: %w", err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			if !show["keys"] || (f.limit > 0 && shown >= f.limit) {
				if !f.verify {
					break
				}
				continue
			}
			k := it.Key()
			if (start != nil && bytes.Compare(k.UserKey, start) < 0) || (end != nil && bytes.Compare(k.UserKey, end) >= 0) {
				continue
			}
			shown++
			sk := sstKey{Key: codec.Format(k.UserKey), Seq: uint64(k.SeqNum()), Kind: k.Kind().String()}
			if k.Kind() != storage.KindDelete {
				v := codec.FormatTruncated(it.Value(), width)
				sk.Value = &v
			}
			if text {
				if sk.Value != nil {
					fmt.Fprintf(out, "  %s#%d,%s => %s\n", sk.Key, sk.Seq, sk.Kind, *sk.Value)
				} else {
					fmt.Fprintf(out, "  %s#%d,%s\n", sk.Key, sk.Seq, sk.Kind)
				}
			} else {
				dump.Keys = append(dump.Keys, sk)
			}
		}
		// The iterator stops at the first damaged block; its error names
		// the file and the block's offset.
		err = it.Error()
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sst-dump: read data blocks: %w", err)
		}
	}
	dump.ChecksumsVerified = f.verify
	if !text {
		return output.WriteJSON(out, dump)
	}
	if show["keys"] {
		fmt.Fprintf(out, "(%d keys shown)\n", shown)
	}
	if f.verify {
		fmt.Fprintf(out, "\nchecksums: OK (all %d blocks verified)\n", len(layout.Blocks))
	} else {
		fmt.Fprintf(out, "\nchecksums: metadata blocks verified; data blocks verified only where read (--verify=false)\n")
	}
	return nil
}

// describeBounds formats [start, end) for headings ("" when unbounded).
func describeBounds(c output.Codec, start, end []byte) string {
	if start == nil && end == nil {
		return ""
	}
	s, e := "-inf", "+inf"
	if start != nil {
		s = c.Format(start)
	}
	if end != nil {
		e = c.Format(end)
	}
	return fmt.Sprintf(" in [%s, %s)", s, e)
}

func printProperties(w io.Writer, p *sstProperties) {
	fmt.Fprintf(w, "\nproperties:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(name string, v any) { fmt.Fprintf(tw, "  %s:\t%v\n", name, v) }
	row("num entries", p.NumEntries)
	row("num deletions", p.NumDeletions)
	row("num merges", p.NumMerges)
	row("num range deletions", p.NumRangeDeletions)
	row("raw key size", p.RawKeySize)
	row("raw value size", p.RawValueSize)
	row("data size", p.DataSize)
	row("index size", p.IndexSize)
	row("filter size", p.FilterSize)
	row("num data blocks", p.NumDataBlocks)
	row("compression", p.Compression)
	row("filter policy", orNone(p.FilterPolicy))
	row("whole key filtering", p.WholeKeyFiltering)
	row("prefix extractor", orNone(p.PrefixExtractor))
	row("comparator", p.Comparator)
	row("smallest seq", p.SmallestSeq)
	row("largest seq", p.LargestSeq)
	row("creation time", fmt.Sprintf("%d (%s)", p.CreationTime, time.Unix(p.CreationTime, 0).UTC().Format(time.RFC3339)))
	row("format version", p.FormatVersion)
	names := make([]string, 0, len(p.UserProperties))
	for k := range p.UserProperties {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		row("user property "+k, p.UserProperties[k])
	}
	_ = tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func printLayout(w io.Writer, l *sstLayout) {
	fmt.Fprintf(w, "\nblocks (%d, format version %d):\n", len(l.Blocks), l.FormatVersion)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  kind\toffset\tlength\tcompression\n")
	for _, b := range l.Blocks {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", b.Kind, b.Offset, b.Length, b.Compression)
	}
	fmt.Fprintf(tw, "  footer\t%d\t%d\t-\n", l.FooterOffset, l.FooterLength)
	_ = tw.Flush()
}
