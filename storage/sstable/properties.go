package sstable

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strings"

	"github.com/shale-db/shale/storage/internal/base"
)

// ComparatorName is the name of the only key ordering this package
// supports: user keys compared bytewise, then trailers descending.
const ComparatorName = "shale.bytewise"

// FilterPolicyName names the bloom filter implementation (package bloom)
// recorded in the properties of files that have a filter.
const FilterPolicyName = "shale.bloom.v1"

// reservedPropertyPrefix is reserved for the properties this package writes;
// user property names may not start with it.
const reservedPropertyPrefix = "shale."

// Property names in the properties block. Integer values are uvarints
// (creation time is a zig-zag varint); string values are raw bytes.
const (
	propNumEntries        = "shale.num.entries"
	propNumDeletions      = "shale.num.deletions"
	propNumMerges         = "shale.num.merges"
	propNumRangeDeletions = "shale.num.range-deletions"
	propRawKeySize        = "shale.raw.key.size"
	propRawValueSize      = "shale.raw.value.size"
	propDataSize          = "shale.data.size"
	propIndexSize         = "shale.index.size"
	propFilterSize        = "shale.filter.size"
	propNumDataBlocks     = "shale.num.data.blocks"
	propCompression       = "shale.compression"
	propFilterPolicy      = "shale.filter.policy"
	propWholeKeyFiltering = "shale.filter.whole-key"
	propPrefixExtractor   = "shale.prefix.extractor"
	propComparator        = "shale.comparator"
	propSmallestSeq       = "shale.seqnum.smallest"
	propLargestSeq        = "shale.seqnum.largest"
	propCreationTime      = "shale.creation.time"
	propFormatVersion     = "shale.format.version"
)

// Properties describes an SST file. The Writer fills every field; the Reader
// returns what the file recorded.
type Properties struct {
	NumEntries        uint64 // point entries (Set, Delete, Merge)
	NumDeletions      uint64 // Delete entries
	NumMerges         uint64 // Merge entries
	NumRangeDeletions uint64 // range tombstones
	RawKeySize        uint64 // sum of encoded internal key sizes of point entries
	RawValueSize      uint64 // sum of point value sizes
	DataSize          uint64 // on-disk bytes of data blocks, trailers included
	IndexSize         uint64 // on-disk bytes of the index block, trailer included
	FilterSize        uint64 // on-disk bytes of the filter block, trailer included; 0 without filter
	NumDataBlocks     uint64
	CompressionName   string // "none", "snappy", "zstd" or "zstd-dict"
	FilterPolicyName  string // FilterPolicyName, or "" without filter
	// WholeKeyFiltering reports whether the filter contains whole user keys.
	WholeKeyFiltering bool
	// PrefixExtractorName is WriterOptions.PrefixExtractorName when the
	// filter contains prefixes, else "".
	PrefixExtractorName string
	ComparatorName      string // always ComparatorName
	SmallestSeq         base.SeqNum
	LargestSeq          base.SeqNum
	CreationTime        int64 // Unix seconds
	FormatVersion       uint32
	// UserProperties are the caller's WriterOptions.UserProperties.
	UserProperties map[string]string
}

// encode writes the properties as a block with sorted keys.
func (p *Properties) encode(restartInterval int) ([]byte, error) {
	kv := map[string][]byte{}
	u := func(name string, v uint64) { kv[name] = binary.AppendUvarint(nil, v) }
	s := func(name, v string) { kv[name] = []byte(v) }
	u(propNumEntries, p.NumEntries)
	u(propNumDeletions, p.NumDeletions)
	u(propNumMerges, p.NumMerges)
	u(propNumRangeDeletions, p.NumRangeDeletions)
	u(propRawKeySize, p.RawKeySize)
	u(propRawValueSize, p.RawValueSize)
	u(propDataSize, p.DataSize)
	u(propIndexSize, p.IndexSize)
	u(propFilterSize, p.FilterSize)
	u(propNumDataBlocks, p.NumDataBlocks)
	s(propCompression, p.CompressionName)
	s(propFilterPolicy, p.FilterPolicyName)
	if p.WholeKeyFiltering {
		u(propWholeKeyFiltering, 1)
	} else {
		u(propWholeKeyFiltering, 0)
	}
	s(propPrefixExtractor, p.PrefixExtractorName)
	s(propComparator, p.ComparatorName)
	u(propSmallestSeq, uint64(p.SmallestSeq))
	u(propLargestSeq, uint64(p.LargestSeq))
	kv[propCreationTime] = binary.AppendVarint(nil, p.CreationTime)
	u(propFormatVersion, uint64(p.FormatVersion))
	for k, v := range p.UserProperties {
		if strings.HasPrefix(k, reservedPropertyPrefix) {
			return nil, fmt.Errorf("sstable: user property %q uses reserved prefix %q", k, reservedPropertyPrefix)
		}
		kv[k] = []byte(v)
	}
	names := make([]string, 0, len(kv))
	for k := range kv {
		names = append(names, k)
	}
	sort.Strings(names)
	bw := blockWriter{restartInterval: restartInterval}
	for _, k := range names {
		bw.add([]byte(k), kv[k])
	}
	return bw.finish(), nil
}

// decodeProperties parses a properties block.
func decodeProperties(block []byte) (*Properties, error) {
	var it blockIter
	if err := it.init(block); err != nil {
		return nil, err
	}
	p := &Properties{}
	var errOut error
	u := func(name string, v []byte) uint64 {
		x, n := binary.Uvarint(v)
		if n <= 0 || n != len(v) {
			if errOut == nil {
				errOut = fmt.Errorf("malformed property %s", name)
			}
		}
		return x
	}
	var prev []byte
	for ok := it.first(); ok; ok = it.nextEntry() {
		if prev != nil && string(it.key) <= string(prev) {
			return nil, fmt.Errorf("properties not sorted at %q", it.key)
		}
		prev = append(prev[:0], it.key...)
		name, v := string(it.key), it.val
		switch name {
		case propNumEntries:
			p.NumEntries = u(name, v)
		case propNumDeletions:
			p.NumDeletions = u(name, v)
		case propNumMerges:
			p.NumMerges = u(name, v)
		case propNumRangeDeletions:
			p.NumRangeDeletions = u(name, v)
		case propRawKeySize:
			p.RawKeySize = u(name, v)
		case propRawValueSize:
			p.RawValueSize = u(name, v)
		case propDataSize:
			p.DataSize = u(name, v)
		case propIndexSize:
			p.IndexSize = u(name, v)
		case propFilterSize:
			p.FilterSize = u(name, v)
		case propNumDataBlocks:
			p.NumDataBlocks = u(name, v)
		case propCompression:
			p.CompressionName = string(v)
		case propFilterPolicy:
			p.FilterPolicyName = string(v)
		case propWholeKeyFiltering:
			p.WholeKeyFiltering = u(name, v) != 0
		case propPrefixExtractor:
			p.PrefixExtractorName = string(v)
		case propComparator:
			p.ComparatorName = string(v)
		case propSmallestSeq:
			p.SmallestSeq = base.SeqNum(u(name, v))
		case propLargestSeq:
			p.LargestSeq = base.SeqNum(u(name, v))
		case propCreationTime:
			x, n := binary.Varint(v)
			if n <= 0 || n != len(v) {
				return nil, fmt.Errorf("malformed property %s", name)
			}
			p.CreationTime = x
		case propFormatVersion:
			x := u(name, v)
			if x > 1<<32-1 {
				return nil, fmt.Errorf("malformed property %s", name)
			}
			p.FormatVersion = uint32(x)
		default:
			if p.UserProperties == nil {
				p.UserProperties = map[string]string{}
			}
			p.UserProperties[name] = string(v)
		}
		if errOut != nil {
			return nil, errOut
		}
	}
	if it.err != nil {
		return nil, it.err
	}
	return p, nil
}

// String formats the properties one per line, for tools.
func (p *Properties) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "num entries: %d\nnum deletions: %d\nnum merges: %d\nnum range deletions: %d\n",
		p.NumEntries, p.NumDeletions, p.NumMerges, p.NumRangeDeletions)
	fmt.Fprintf(&b, "raw key size: %d\nraw value size: %d\ndata size: %d\nindex size: %d\nfilter size: %d\nnum data blocks: %d\n",
		p.RawKeySize, p.RawValueSize, p.DataSize, p.IndexSize, p.FilterSize, p.NumDataBlocks)
	fmt.Fprintf(&b, "compression: %s\nfilter policy: %s\nwhole key filtering: %t\nprefix extractor: %s\ncomparator: %s\n",
		p.CompressionName, p.FilterPolicyName, p.WholeKeyFiltering, p.PrefixExtractorName, p.ComparatorName)
	fmt.Fprintf(&b, "seqnums: [%d, %d]\ncreation time: %d\nformat version: %d\n",
		p.SmallestSeq, p.LargestSeq, p.CreationTime, p.FormatVersion)
	names := make([]string, 0, len(p.UserProperties))
	for k := range p.UserProperties {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "user property %s: %s\n", k, p.UserProperties[k])
	}
	return b.String()
}
