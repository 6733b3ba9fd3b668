package sstable

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"

	"github.com/golang/snappy"
	"github.com/klauspost/compress/zstd"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/sstable/bloom"
)

// WritableFile is what the Writer needs from a file: sequential writes,
// Sync and Close. A vfs.File satisfies it.
type WritableFile interface {
	io.Writer
	Sync() error
	Close() error
}

// Defaults applied by NewWriter to zero-valued WriterOptions fields.
const (
	DefaultBlockSize            = 4096
	DefaultBlockRestartInterval = 16
	DefaultFilterBitsPerKey     = 10
	DefaultZstdLevel            = 3
)

// Dictionary compression parameters: the dictionary is the concatenation of
// samples of the first dictSampleBlocks data blocks (or fewer, if the file
// has fewer), at most dictMaxLen bytes.
const (
	dictSampleBlocks = 16
	dictMaxLen       = 32 << 10
	dictID           = 1
	indexRestarts    = 16
)

// WriterOptions configure a Writer. Zero-valued fields take the documented
// defaults, except FilterBitsPerKey, where 0 means "no filter": start from
// DefaultWriterOptions to get the defaults for every field.
type WriterOptions struct {
	// BlockSize is the target uncompressed size of data blocks (default
	// 4096). A block is cut once it reaches this size.
	BlockSize int
	// BlockRestartInterval is the number of entries between restart points
	// in data blocks (default 16).
	BlockRestartInterval int
	// Compression of data blocks (default snappy). A block whose compressed
	// form does not save at least 12.5% is stored uncompressed.
	Compression Compression
	// ZstdLevel is the zstd level (1..22, mapped onto the encoder's speed
	// presets) for zstd compressions (default 3).
	ZstdLevel int
	// FilterBitsPerKey is the number of bloom-filter bits per key; 0 (the
	// zero value) writes no filter. DefaultWriterOptions sets 10.
	FilterBitsPerKey int
	// WholeKeyFiltering says whether whole user keys go into the filter. nil
	// means true.
	WholeKeyFiltering *bool
	// PrefixExtractor, if set, adds the prefix of every point key's user key
	// to the filter. It returns nil for a key without a prefix in its
	// domain. It must be deterministic and named by PrefixExtractorName.
	PrefixExtractor func(userKey []byte) []byte
	// PrefixExtractorName identifies PrefixExtractor in the properties so
	// that readers can tell whether their extractor matches ("unnamed" is
	// recorded when it is empty).
	PrefixExtractorName string
	// UserProperties are stored in the properties block. Names must not
	// start with "shale.".
	UserProperties map[string]string
	// CreationTime is recorded in the properties (Unix seconds).
	CreationTime int64
}

// DefaultWriterOptions returns options with every default filled in,
// including a 10 bits/key whole-key bloom filter.
func DefaultWriterOptions() WriterOptions {
	return WriterOptions{
		BlockSize:            DefaultBlockSize,
		BlockRestartInterval: DefaultBlockRestartInterval,
		Compression:          SnappyCompression,
		ZstdLevel:            DefaultZstdLevel,
		FilterBitsPerKey:     DefaultFilterBitsPerKey,
	}
}

// WriterMetadata describes a finished file.
type WriterMetadata struct {
	// Size is the file size in bytes.
	Size uint64
	// HasPointKeys reports whether the file has point entries; if so
	// SmallestPoint and LargestPoint are the first and last of them.
	HasPointKeys                bool
	SmallestPoint, LargestPoint base.InternalKey
	// HasRangeDels reports whether the file has range tombstones; if so
	// SmallestRangeDel is the smallest start#seq,RANGEDEL key and
	// LargestRangeDel is the range-delete sentinel of the largest end key.
	HasRangeDels                      bool
	SmallestRangeDel, LargestRangeDel base.InternalKey
	// SmallestSeq and LargestSeq bound the sequence numbers of all entries
	// and tombstones (both 0 for an empty file).
	SmallestSeq, LargestSeq base.SeqNum
	// Properties are the properties written to the file.
	Properties Properties
}

// RangeDel is a range tombstone: it deletes keys in [Start, End) with
// sequence numbers below Seq.
type RangeDel struct {
	Start, End []byte
	Seq        base.SeqNum
}

type pendingBlock struct {
	contents []byte
	sep      []byte // encoded separator key
}

// Writer writes one SST file. Keys must be added in strictly increasing
// internal-key order. A Writer is not safe for concurrent use. After any
// error, every later call returns that error; Finish still closes the file.
type Writer struct {
	f        WritableFile
	w        *bufio.Writer
	opts     WriterOptions
	offset   uint64
	err      error
	finished bool

	data  blockWriter
	index blockWriter

	filterOn   bool
	wholeKey   bool
	filter     bloom.Builder
	lastPrefix []byte
	hasPrefix  bool

	hasLast  bool
	lastKey  base.InternalKey // owns lastBuf
	lastBuf  []byte
	smallest base.InternalKey
	sepBuf   []byte

	rangeDels []RangeDel

	props    Properties
	minSeq   base.SeqNum
	maxSeq   base.SeqNum
	anySeq   bool
	zlevel   zstd.EncoderLevel
	zenc     *zstd.Encoder
	cbuf     []byte
	trailer  [BlockTrailerLen]byte
	pending  []pendingBlock
	pendSize int
	dict     []byte
	dictEnc  *zstd.Encoder
	dictDone bool
}

// NewWriter returns a Writer that writes to f. The Writer owns f: Finish
// syncs and closes it.
func NewWriter(f WritableFile, opts WriterOptions) *Writer {
	if opts.BlockSize <= 0 {
		opts.BlockSize = DefaultBlockSize
	}
	if opts.BlockRestartInterval <= 0 {
		opts.BlockRestartInterval = DefaultBlockRestartInterval
	}
	if opts.ZstdLevel == 0 {
		opts.ZstdLevel = DefaultZstdLevel
	}
	opts.Compression = opts.Compression.resolve()
	w := &Writer{
		f:    f,
		w:    bufio.NewWriterSize(f, 64<<10),
		opts: opts,
	}
	w.data.restartInterval = opts.BlockRestartInterval
	w.index.restartInterval = indexRestarts
	w.wholeKey = opts.WholeKeyFiltering == nil || *opts.WholeKeyFiltering
	w.filterOn = opts.FilterBitsPerKey > 0 && (w.wholeKey || opts.PrefixExtractor != nil)
	switch opts.Compression {
	case NoCompression, SnappyCompression:
	case ZstdCompression, ZstdDictCompression:
		w.zlevel = zstdLevel(opts.ZstdLevel)
		if opts.Compression == ZstdCompression {
			w.zenc, w.err = getZstdEncoder(w.zlevel)
		}
	default:
		w.err = fmt.Errorf("sstable: unknown compression %d", int(opts.Compression))
	}
	return w
}

var errFinished = errors.New("sstable: writer already finished")

func (w *Writer) noteSeq(s base.SeqNum) {
	if !w.anySeq || s < w.minSeq {
		w.minSeq = s
	}
	if !w.anySeq || s > w.maxSeq {
		w.maxSeq = s
	}
	w.anySeq = true
}

// Add appends a point entry. key must sort strictly after the previous key
// (base.CompareInternal) and be of kind Set, Delete or Merge. The Writer
// copies key and value.
func (w *Writer) Add(key base.InternalKey, value []byte) error {
	if w.finished {
		return errFinished
	}
	if w.err != nil {
		return w.err
	}
	switch key.Kind() {
	case base.KindSet, base.KindDelete, base.KindMerge:
	default:
		return fmt.Errorf("sstable: cannot add key %s: kind %s not allowed in point entries", key, key.Kind())
	}
	if w.hasLast && base.CompareInternal(w.lastKey, key) >= 0 {
		return fmt.Errorf("sstable: keys out of order: %s added after %s", key, w.lastKey)
	}
	if w.data.nEntries > 0 && w.data.estimatedSize() >= w.opts.BlockSize {
		w.sepBuf = separator(w.sepBuf[:0], w.lastKey, key)
		if err := w.finishDataBlock(w.sepBuf); err != nil {
			return err
		}
	}
	if w.filterOn {
		uk := key.UserKey
		if w.wholeKey && (!w.hasLast || !bytes.Equal(uk, w.lastKey.UserKey)) {
			w.filter.AddKey(uk)
		}
		if w.opts.PrefixExtractor != nil {
			if p := w.opts.PrefixExtractor(uk); p != nil && (!w.hasPrefix || !bytes.Equal(p, w.lastPrefix)) {
				w.filter.AddKey(p)
				w.lastPrefix = append(w.lastPrefix[:0], p...)
				w.hasPrefix = true
			}
		}
	}
	w.lastBuf = key.AppendEncoded(w.lastBuf[:0])
	w.data.add(w.lastBuf, value)
	n := len(w.lastBuf) - base.TrailerLen
	w.lastKey = base.InternalKey{UserKey: w.lastBuf[:n:n], Trailer: key.Trailer}
	if !w.hasLast {
		w.smallest = key.Clone()
		if w.smallest.UserKey == nil {
			w.smallest.UserKey = []byte{}
		}
	}
	w.hasLast = true
	w.noteSeq(key.SeqNum())
	w.props.NumEntries++
	switch key.Kind() {
	case base.KindDelete:
		w.props.NumDeletions++
	case base.KindMerge:
		w.props.NumMerges++
	}
	w.props.RawKeySize += uint64(key.Size())
	w.props.RawValueSize += uint64(len(value))
	return nil
}

// AddRangeDel records the range tombstone [start, end) at seq. Tombstones
// may be added in any order, before, between or after point keys. start
// must be < end. The Writer copies start and end.
func (w *Writer) AddRangeDel(start, end []byte, seq base.SeqNum) error {
	if w.finished {
		return errFinished
	}
	if w.err != nil {
		return w.err
	}
	if bytes.Compare(start, end) >= 0 {
		return fmt.Errorf("sstable: empty range deletion [%s, %s)", base.FormatKey(start), base.FormatKey(end))
	}
	if seq > base.MaxSeqNum {
		return fmt.Errorf("sstable: range deletion seqnum %d too large", seq)
	}
	w.rangeDels = append(w.rangeDels, RangeDel{
		Start: append([]byte{}, start...), End: append([]byte{}, end...), Seq: seq,
	})
	w.noteSeq(seq)
	return nil
}

// EstimatedSize returns an estimate of the size the file would have if
// Finish were called now (uncompressed sizes for data not yet written), for
// deciding when to cut compaction output files.
func (w *Writer) EstimatedSize() uint64 {
	n := w.offset + uint64(w.pendSize) + uint64(w.data.estimatedSize()) + uint64(w.index.estimatedSize())
	if w.filterOn {
		n += uint64(w.filter.EstimatedSize(w.opts.FilterBitsPerKey))
	}
	for _, rd := range w.rangeDels {
		n += uint64(len(rd.Start) + len(rd.End) + 12)
	}
	return n + FooterLen
}

// separator appends to dst an encoded internal key k with a <= k < b, as
// short as cheaply possible. a < b is required.
func separator(dst []byte, a, b base.InternalKey) []byte {
	au, bu := a.UserKey, b.UserKey
	n := min(len(au), len(bu))
	i := 0
	for i < n && au[i] == bu[i] {
		i++
	}
	if i < n { // au[i] < bu[i]
		if au[i] < 0xff && au[i]+1 < bu[i] && i+1 < len(au) {
			dst = append(dst, au[:i]...)
			dst = append(dst, au[i]+1)
			return base.MakeSearchKey(nil).AppendEncoded(dst)
		}
		// Keep au[:i+1] (< bu) and bump a later byte of au.
		for j := i + 1; j < len(au)-1; j++ {
			if au[j] < 0xff {
				dst = append(dst, au[:j]...)
				dst = append(dst, au[j]+1)
				return base.MakeSearchKey(nil).AppendEncoded(dst)
			}
		}
	}
	return a.AppendEncoded(dst)
}

func (w *Writer) finishDataBlock(sep []byte) error {
	contents := w.data.finish()
	w.props.NumDataBlocks++
	if w.opts.Compression == ZstdDictCompression && !w.dictDone {
		w.pending = append(w.pending, pendingBlock{
			contents: append([]byte(nil), contents...),
			sep:      append([]byte(nil), sep...),
		})
		w.pendSize += len(contents)
		w.data.reset()
		if len(w.pending) >= dictSampleBlocks {
			return w.flushPending()
		}
		return nil
	}
	h, err := w.writeBlock(contents, true)
	if err != nil {
		return err
	}
	w.props.DataSize += h.Length + BlockTrailerLen
	w.data.reset()
	var hb [2 * binary.MaxVarintLen64]byte
	w.index.add(sep, h.appendTo(hb[:0]))
	return nil
}

// flushPending builds the compression dictionary from the buffered blocks
// and writes them.
func (w *Writer) flushPending() error {
	w.dictDone = true
	if len(w.pending) > 1 {
		per := dictMaxLen / len(w.pending)
		for _, p := range w.pending {
			w.dict = append(w.dict, p.contents[:min(per, len(p.contents))]...)
		}
		enc, err := zstd.NewWriter(nil, zstdEncoderOptions(w.zlevel, zstd.WithEncoderDictRaw(dictID, w.dict))...)
		if err != nil {
			w.dict = nil
		} else {
			w.dictEnc = enc
		}
	}
	if w.dictEnc == nil { // too little data for a dictionary: plain zstd
		if w.zenc, w.err = getZstdEncoder(w.zlevel); w.err != nil {
			return w.err
		}
	}
	for _, p := range w.pending {
		h, err := w.writeBlock(p.contents, true)
		if err != nil {
			return err
		}
		w.props.DataSize += h.Length + BlockTrailerLen
		var hb [2 * binary.MaxVarintLen64]byte
		w.index.add(p.sep, h.appendTo(hb[:0]))
	}
	w.pending = nil
	w.pendSize = 0
	return nil
}

// compress returns the stored form of a block and its type.
func (w *Writer) compress(b []byte) ([]byte, byte) {
	var out []byte
	var typ byte
	switch {
	case w.opts.Compression == SnappyCompression:
		w.cbuf = snappy.Encode(w.cbuf[:cap(w.cbuf)], b)
		out, typ = w.cbuf, blockTypeSnappy
	case w.dictEnc != nil:
		w.cbuf = w.dictEnc.EncodeAll(b, w.cbuf[:0])
		out, typ = w.cbuf, blockTypeZstdDict
	case w.zenc != nil:
		w.cbuf = w.zenc.EncodeAll(b, w.cbuf[:0])
		out, typ = w.cbuf, blockTypeZstd
	default:
		return b, blockTypeNone
	}
	if len(out) > len(b)-len(b)/8 {
		return b, blockTypeNone
	}
	return out, typ
}

// writeBlock writes a block and its trailer and returns its handle.
func (w *Writer) writeBlock(b []byte, compress bool) (blockHandle, error) {
	if w.err != nil {
		return blockHandle{}, w.err
	}
	typ := blockTypeNone
	if compress {
		b, typ = w.compress(b)
	}
	h := blockHandle{Offset: w.offset, Length: uint64(len(b))}
	w.trailer[0] = typ
	crc := crc32.Update(crc32.Checksum(b, crcTable), crcTable, w.trailer[:1])
	binary.LittleEndian.PutUint32(w.trailer[1:], crc)
	if _, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("sstable: writing block: %w", err)
		return blockHandle{}, w.err
	}
	if _, err := w.w.Write(w.trailer[:]); err != nil {
		w.err = fmt.Errorf("sstable: writing block: %w", err)
		return blockHandle{}, w.err
	}
	w.offset += uint64(len(b)) + BlockTrailerLen
	return h, nil
}

// Finish writes the remaining data block, the filter, range-deletion,
// index, properties and metaindex blocks and the footer, then syncs and
// closes the file. The file is closed even when Finish fails.
func (w *Writer) Finish() (WriterMetadata, error) {
	if w.finished {
		return WriterMetadata{}, errFinished
	}
	w.finished = true
	md, err := w.finish()
	if w.zenc != nil {
		putZstdEncoder(w.zlevel, w.zenc)
		w.zenc = nil
	}
	if err == nil {
		if err = w.w.Flush(); err == nil {
			if err = w.f.Sync(); err != nil {
				err = fmt.Errorf("sstable: sync: %w", err)
			}
		} else {
			err = fmt.Errorf("sstable: writing: %w", err)
		}
	}
	if cerr := w.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("sstable: close: %w", cerr)
	}
	if err != nil {
		w.err = err
		return WriterMetadata{}, err
	}
	return md, nil
}

func (w *Writer) finish() (WriterMetadata, error) {
	if w.err != nil {
		return WriterMetadata{}, w.err
	}
	if w.data.nEntries > 0 {
		// The exact last key is the tightest valid separator.
		w.sepBuf = w.lastKey.AppendEncoded(w.sepBuf[:0])
		if err := w.finishDataBlock(w.sepBuf); err != nil {
			return WriterMetadata{}, err
		}
	}
	if w.opts.Compression == ZstdDictCompression && !w.dictDone {
		if err := w.flushPending(); err != nil {
			return WriterMetadata{}, err
		}
	}
	var meta blockWriter
	meta.restartInterval = 1
	type metaEntry struct {
		name string
		h    blockHandle
	}
	var metas []metaEntry

	p := &w.props
	p.CompressionName = w.opts.Compression.String()
	p.ComparatorName = ComparatorName
	p.FormatVersion = FormatVersion
	p.CreationTime = w.opts.CreationTime
	p.SmallestSeq, p.LargestSeq = w.minSeq, w.maxSeq
	p.UserProperties = w.opts.UserProperties
	p.NumRangeDeletions = uint64(len(w.rangeDels))

	if w.dict != nil {
		h, err := w.writeBlock(w.dict, false)
		if err != nil {
			return WriterMetadata{}, err
		}
		metas = append(metas, metaEntry{metaZstdDictName, h})
	}
	if w.filterOn {
		fb := w.filter.Finish(nil, w.opts.FilterBitsPerKey)
		h, err := w.writeBlock(fb, false)
		if err != nil {
			return WriterMetadata{}, err
		}
		metas = append(metas, metaEntry{metaFilterName, h})
		p.FilterSize = h.Length + BlockTrailerLen
		p.FilterPolicyName = FilterPolicyName
		p.WholeKeyFiltering = w.wholeKey
		if w.opts.PrefixExtractor != nil {
			p.PrefixExtractorName = w.opts.PrefixExtractorName
			if p.PrefixExtractorName == "" {
				p.PrefixExtractorName = "unnamed"
			}
		}
	}
	var md WriterMetadata
	if len(w.rangeDels) > 0 {
		sort.SliceStable(w.rangeDels, func(i, j int) bool {
			a, b := w.rangeDels[i], w.rangeDels[j]
			if c := bytes.Compare(a.Start, b.Start); c != 0 {
				return c < 0
			}
			if a.Seq != b.Seq {
				return a.Seq > b.Seq
			}
			return bytes.Compare(a.End, b.End) < 0
		})
		var rb blockWriter
		rb.restartInterval = w.opts.BlockRestartInterval
		var kb []byte
		maxEnd := w.rangeDels[0].End
		for _, rd := range w.rangeDels {
			kb = base.MakeInternalKey(rd.Start, rd.Seq, base.KindRangeDelete).AppendEncoded(kb[:0])
			rb.add(kb, rd.End)
			if bytes.Compare(rd.End, maxEnd) > 0 {
				maxEnd = rd.End
			}
		}
		h, err := w.writeBlock(rb.finish(), false)
		if err != nil {
			return WriterMetadata{}, err
		}
		metas = append(metas, metaEntry{metaRangeDelName, h})
		md.HasRangeDels = true
		md.SmallestRangeDel = base.MakeInternalKey(w.rangeDels[0].Start, w.rangeDels[0].Seq, base.KindRangeDelete)
		md.LargestRangeDel = base.MakeRangeDeleteSentinel(maxEnd)
	}
	indexH, err := w.writeBlock(w.index.finish(), false)
	if err != nil {
		return WriterMetadata{}, err
	}
	p.IndexSize = indexH.Length + BlockTrailerLen
	pb, err := p.encode(1)
	if err != nil {
		w.err = err
		return WriterMetadata{}, err
	}
	h, err := w.writeBlock(pb, false)
	if err != nil {
		return WriterMetadata{}, err
	}
	metas = append(metas, metaEntry{metaPropertiesName, h})
	sort.Slice(metas, func(i, j int) bool { return metas[i].name < metas[j].name })
	for _, m := range metas {
		meta.add([]byte(m.name), m.h.appendTo(nil))
	}
	metaH, err := w.writeBlock(meta.finish(), false)
	if err != nil {
		return WriterMetadata{}, err
	}
	ft := footer{metaindex: metaH, index: indexH, version: FormatVersion}
	if _, err := w.w.Write(ft.encode()); err != nil {
		w.err = fmt.Errorf("sstable: writing footer: %w", err)
		return WriterMetadata{}, w.err
	}
	w.offset += FooterLen

	md.Size = w.offset
	if w.hasLast {
		md.HasPointKeys = true
		md.SmallestPoint = w.smallest
		md.LargestPoint = w.lastKey.Clone()
	}
	md.SmallestSeq, md.LargestSeq = w.minSeq, w.maxSeq
	md.Properties = *p
	return md, nil
}

// Abort abandons the file: it closes it without writing the remaining
// blocks or syncing. The (incomplete) file should be deleted by the caller.
// Abort after Finish is a no-op.
func (w *Writer) Abort() error {
	if w.finished {
		return nil
	}
	w.finished = true
	if w.zenc != nil {
		putZstdEncoder(w.zlevel, w.zenc)
		w.zenc = nil
	}
	return w.f.Close()
}
