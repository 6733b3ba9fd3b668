package sstable

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/shale-db/shale/storage/internal/base"
)

// parseKey parses "user.KIND.seq".
func parseKey(t testing.TB, s string) base.InternalKey {
	i := strings.LastIndexByte(s, '.')
	j := strings.LastIndexByte(s[:i], '.')
	seq, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		t.Fatalf("bad key %q", s)
	}
	kinds := map[string]base.Kind{"SET": base.KindSet, "DEL": base.KindDelete, "MERGE": base.KindMerge}
	k, ok := kinds[s[j+1:i]]
	if !ok {
		t.Fatalf("bad kind in %q", s)
	}
	return base.MakeInternalKey([]byte(s[:j]), base.SeqNum(seq), k)
}

// TestDataDriven runs testdata/* scripts:
//
//	build [block-size=N] [restart-interval=N] [compression=none|snappy|zstd|zstd-dict] [bits-per-key=N]
//	<user.KIND.seq[:value]> | rangedel <start> <end> <seq>   (one per line)
//
//	iter [lower=k] [upper=k]
//	first | last | next | prev | seek-ge <k> | seek-lt <k>   (one per line)
//
//	may-contain <k>...   rangedels   layout   props
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var r *Reader
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "build":
				opts := DefaultWriterOptions()
				td.MaybeScanArgs(t, "block-size", &opts.BlockSize)
				td.MaybeScanArgs(t, "restart-interval", &opts.BlockRestartInterval)
				td.MaybeScanArgs(t, "bits-per-key", &opts.FilterBitsPerKey)
				if arg, ok := td.Arg("compression"); ok {
					m := map[string]Compression{"none": NoCompression, "snappy": SnappyCompression,
						"zstd": ZstdCompression, "zstd-dict": ZstdDictCompression}
					opts.Compression = m[arg.SingleVal(t)]
				}
				f := &memFile{}
				w := NewWriter(f, opts)
				for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
					fields := strings.Fields(line)
					if len(fields) == 0 {
						continue
					}
					var err error
					if fields[0] == "rangedel" {
						seq, _ := strconv.ParseUint(fields[3], 10, 64)
						err = w.AddRangeDel([]byte(fields[1]), []byte(fields[2]), base.SeqNum(seq))
					} else {
						k, v, _ := strings.Cut(fields[0], ":")
						err = w.Add(parseKey(t, k), []byte(v))
					}
					if err != nil {
						return err.Error()
					}
				}
				md, err := w.Finish()
				if err != nil {
					return err.Error()
				}
				if r, err = NewReader(bytes.NewReader(f.Bytes()), int64(f.Len()), ReaderOptions{FileName: "dd.sst"}); err != nil {
					return err.Error()
				}
				var b strings.Builder
				if md.HasPointKeys {
					fmt.Fprintf(&b, "point: [%s, %s]\n", md.SmallestPoint, md.LargestPoint)
				}
				if md.HasRangeDels {
					fmt.Fprintf(&b, "rangedel: [%s, %s]\n", md.SmallestRangeDel, md.LargestRangeDel)
				}
				fmt.Fprintf(&b, "seqnums: [%d, %d]\nentries: %d\ndata blocks: %d\n",
					md.SmallestSeq, md.LargestSeq, md.Properties.NumEntries, md.Properties.NumDataBlocks)
				return b.String()
			case "iter":
				var lower, upper []byte
				if arg, ok := td.Arg("lower"); ok {
					lower = []byte(arg.SingleVal(t))
				}
				if arg, ok := td.Arg("upper"); ok {
					upper = []byte(arg.SingleVal(t))
				}
				it, _ := r.NewIter(lower, upper)
				defer it.Close()
				var b strings.Builder
				for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
					fields := strings.Fields(line)
					var ok bool
					switch fields[0] {
					case "first":
						ok = it.First()
					case "last":
						ok = it.Last()
					case "next":
						ok = it.Next()
					case "prev":
						ok = it.Prev()
					case "seek-ge":
						ok = it.SeekGE([]byte(fields[1]))
					case "seek-lt":
						ok = it.SeekLT([]byte(fields[1]))
					default:
						t.Fatalf("unknown op %q", fields[0])
					}
					fmt.Fprintf(&b, "%s: ", line)
					switch {
					case ok:
						fmt.Fprintf(&b, "%s=%s\n", it.Key(), it.Value())
					case it.Error() != nil:
						fmt.Fprintf(&b, "err: %v\n", it.Error())
					default:
						b.WriteString(".\n")
					}
				}
				return b.String()
			case "may-contain":
				var b strings.Builder
				for _, arg := range td.CmdArgs {
					fmt.Fprintf(&b, "%s: %t\n", arg.Key, r.MayContain([]byte(arg.Key)))
				}
				return b.String()
			case "rangedels":
				rds, err := r.RangeDels()
				if err != nil {
					return err.Error()
				}
				var b strings.Builder
				for _, rd := range rds {
					fmt.Fprintf(&b, "[%s, %s)#%d\n", rd.Start, rd.End, rd.Seq)
				}
				return b.String()
			case "layout":
				l, err := r.Layout()
				if err != nil {
					return err.Error()
				}
				var b strings.Builder
				for _, bl := range l.Blocks {
					fmt.Fprintf(&b, "%6d %-10s len=%d %s\n", bl.Offset, bl.Kind, bl.Length, bl.Compression)
				}
				fmt.Fprintf(&b, "%6d footer\n", l.FooterOffset)
				return b.String()
			}
			t.Fatalf("unknown command %q", td.Cmd)
			return ""
		})
	})
}
