package sstable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/shale-db/shale/storage/internal/base"
	"github.com/shale-db/shale/storage/sstable/bloom"
)

// BlockCache caches uncompressed, checksum-verified block contents. The
// storage/cache package's *Cache satisfies it. Values passed to Set are
// never modified afterwards, and values returned by Get are never modified
// by this package.
type BlockCache interface {
	Get(id, fileNum, offset uint64) ([]byte, bool)
	Set(id, fileNum, offset uint64, value []byte)
}

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// Cache, if set, holds data blocks keyed by (CacheID, FileNum, block
	// offset). CacheID and FileNum must identify this file uniquely among
	// all files using the cache.
	Cache   BlockCache
	CacheID uint64
	FileNum uint64
	// FileName names the file in errors.
	FileName string
	// PrefixExtractor, if set, lets MayContain fall back to the prefix
	// filter when the file has no whole-key filter.
	PrefixExtractor func(userKey []byte) []byte
	// PrefixExtractorName, if non-empty, must equal the name recorded in the
	// file for the prefix filter to be used; otherwise prefix checks
	// conservatively return true.
	PrefixExtractorName string

	// skipChecksums disables checksum verification. Tests only (fuzzing the
	// parsers behind the checksums).
	skipChecksums bool
	// maxBlockLen overrides the package's block size limit. Tests only.
	maxBlockLen int
}

type indexEntry struct {
	sep base.InternalKey
	h   blockHandle
}

// Reader reads one SST file. NewReader verifies the footer and loads the
// index, filter and properties; data blocks are read on demand (through the
// cache when configured). A Reader is safe for concurrent use; its
// iterators are not.
type Reader struct {
	f        io.ReaderAt
	size     int64
	opts     ReaderOptions
	name     string
	footer   footer
	index    []indexEntry
	dataEnd  uint64 // end of the last data block (including trailer)
	filter   bloom.Filter
	props    *Properties
	meta     map[string]blockHandle
	dictPool *sync.Pool
	maxBlock int

	rdOnce    sync.Once
	rangeDels []RangeDel
	rdErr     error
}

func (r *Reader) corrupt(off uint64, format string, args ...any) error {
	return base.Corruptf(r.name, int64(off), format, args...)
}

// NewReader opens the SST file f of the given size. It reads and verifies
// the footer, metaindex, index, filter and properties blocks. Damage is
// reported as a *base.CorruptionError naming opts.FileName; I/O errors are
// wrapped with the file name. The Reader does not take ownership of f.
func NewReader(f io.ReaderAt, size int64, opts ReaderOptions) (*Reader, error) {
	r := &Reader{f: f, size: size, opts: opts, name: opts.FileName, maxBlock: maxBlockLen}
	if opts.maxBlockLen > 0 {
		r.maxBlock = opts.maxBlockLen
	}
	if r.name == "" {
		r.name = "sstable"
	}
	if err := r.init(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Reader) init() error {
	if r.size < FooterLen {
		return base.Corruptf(r.name, 0, "file too short for an sstable (%d bytes)", r.size)
	}
	fb := make([]byte, FooterLen)
	footOff := uint64(r.size - FooterLen)
	if err := r.readAt(fb, footOff, "footer"); err != nil {
		return err
	}
	if binary.LittleEndian.Uint64(fb[40:]) != Magic {
		return r.corrupt(footOff, "bad magic number: not a shale sstable")
	}
	if !r.opts.skipChecksums && binary.LittleEndian.Uint32(fb[36:]) != crc32.Checksum(fb[:36], crcTable) {
		return r.corrupt(footOff, "footer checksum mismatch")
	}
	r.footer = footer{
		metaindex: blockHandle{binary.LittleEndian.Uint64(fb[0:]), binary.LittleEndian.Uint64(fb[8:])},
		index:     blockHandle{binary.LittleEndian.Uint64(fb[16:]), binary.LittleEndian.Uint64(fb[24:])},
		version:   binary.LittleEndian.Uint32(fb[32:]),
	}
	if r.footer.version != FormatVersion {
		return r.corrupt(footOff, "unsupported format version %d (want %d)", r.footer.version, FormatVersion)
	}

	// Metaindex.
	mb, err := r.readBlock(r.footer.metaindex, "metaindex", nil, nil)
	if err != nil {
		return err
	}
	var it blockIter
	if err := it.init(mb); err != nil {
		return r.corrupt(r.footer.metaindex.Offset, "metaindex block: %v", err)
	}
	r.meta = map[string]blockHandle{}
	for ok := it.first(); ok; ok = it.nextEntry() {
		h, ok := decodeHandle(it.val)
		if !ok {
			return r.corrupt(r.footer.metaindex.Offset, "metaindex block: bad handle for %q", it.key)
		}
		r.meta[string(it.key)] = h
	}
	if it.err != nil {
		return r.corrupt(r.footer.metaindex.Offset, "metaindex block: %v", it.err)
	}

	// Properties.
	ph, ok := r.meta[metaPropertiesName]
	if !ok {
		return r.corrupt(r.footer.metaindex.Offset, "metaindex block: no properties block")
	}
	pb, err := r.readBlock(ph, "properties", nil, nil)
	if err != nil {
		return err
	}
	if r.props, err = decodeProperties(pb); err != nil {
		return r.corrupt(ph.Offset, "properties block: %v", err)
	}

	// Index.
	ib, err := r.readBlock(r.footer.index, "index", nil, nil)
	if err != nil {
		return err
	}
	if err := r.loadIndex(ib); err != nil {
		return err
	}
	if uint64(len(r.index)) != r.props.NumDataBlocks {
		return r.corrupt(r.footer.index.Offset, "index has %d entries but properties record %d data blocks",
			len(r.index), r.props.NumDataBlocks)
	}
	// Every other block lies after the data blocks.
	for name, h := range r.meta {
		if h.Offset < r.dataEnd {
			return r.corrupt(r.footer.metaindex.Offset, "meta block %q overlaps data blocks", name)
		}
	}
	if r.footer.index.Offset < r.dataEnd || r.footer.metaindex.Offset < r.dataEnd {
		return r.corrupt(footOff, "index or metaindex overlaps data blocks")
	}

	// Filter.
	if h, ok := r.meta[metaFilterName]; ok {
		b, err := r.readBlock(h, "filter", nil, nil)
		if err != nil {
			return err
		}
		r.filter = bloom.Filter(b)
		if err := r.filter.Validate(); err != nil {
			return r.corrupt(h.Offset, "filter block: %v", err)
		}
	}

	// Compression dictionary.
	if h, ok := r.meta[metaZstdDictName]; ok {
		dict, err := r.readBlock(h, "zstd dictionary", nil, nil)
		if err != nil {
			return err
		}
		d, err := newZstdDecoder(zstd.WithDecoderDictRaw(dictID, dict))
		if err != nil {
			return r.corrupt(h.Offset, "zstd dictionary: %v", err)
		}
		r.dictPool = &sync.Pool{New: func() any {
			d, err := newZstdDecoder(zstd.WithDecoderDictRaw(dictID, dict))
			if err != nil {
				return nil
			}
			return d
		}}
		r.dictPool.Put(d)
	}
	return nil
}

// loadIndex decodes the index block into r.index, validating that handles
// are contiguous from offset 0 and separators strictly increase.
func (r *Reader) loadIndex(ib []byte) error {
	off := r.footer.index.Offset
	var it blockIter
	if err := it.init(ib); err != nil {
		return r.corrupt(off, "index block: %v", err)
	}
	type rec struct {
		start, end int
		h          blockHandle
	}
	var recs []rec
	var arena []byte
	var next uint64
	for ok := it.first(); ok; ok = it.nextEntry() {
		if len(it.key) < base.TrailerLen {
			return r.corrupt(off, "index block: malformed separator key")
		}
		h, ok := decodeHandle(it.val)
		if !ok {
			return r.corrupt(off, "index block: malformed block handle")
		}
		if h.Offset != next || h.Length > maxBlockLen {
			return r.corrupt(off, "index block: data block handle (%d, %d) out of place", h.Offset, h.Length)
		}
		next = h.Offset + h.Length + BlockTrailerLen
		if next > uint64(r.size) {
			return r.corrupt(off, "index block: data block handle (%d, %d) beyond end of file", h.Offset, h.Length)
		}
		s := len(arena)
		arena = append(arena, it.key...)
		recs = append(recs, rec{s, len(arena), h})
	}
	if it.err != nil {
		return r.corrupt(off, "index block: %v", it.err)
	}
	r.index = make([]indexEntry, len(recs))
	for i, rc := range recs {
		k, _ := base.DecodeInternalKey(arena[rc.start:rc.end:rc.end])
		r.index[i] = indexEntry{sep: k, h: rc.h}
		if i > 0 && base.CompareInternal(r.index[i-1].sep, k) >= 0 {
			return r.corrupt(off, "index block: separators out of order at entry %d", i)
		}
	}
	r.dataEnd = next
	return nil
}

// readAt reads exactly len(b) bytes at off; what names the block kind.
func (r *Reader) readAt(b []byte, off uint64, what string) error {
	if off > uint64(r.size) || uint64(len(b)) > uint64(r.size)-off {
		return r.corrupt(off, "%s block (%d bytes) extends beyond end of file (%d bytes)", what, len(b), r.size)
	}
	n, err := r.f.ReadAt(b, int64(off))
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return r.corrupt(off, "%s block: short read (%d of %d bytes)", what, n, len(b))
	}
	return fmt.Errorf("sstable %s: reading %s block at offset %d: %w", r.name, what, off, err)
}

// readBlock reads, verifies and decompresses the block at h. With raw and
// dec nil the result is freshly allocated and owned by the caller;
// otherwise it may alias *raw or *dec, which are grown as needed.
func (r *Reader) readBlock(h blockHandle, kind string, raw, dec *[]byte) ([]byte, error) {
	if h.Length > uint64(r.maxBlock) {
		return nil, r.corrupt(h.Offset, "%s block: length %d too large", kind, h.Length)
	}
	if h.Offset > uint64(r.size) || h.Length+BlockTrailerLen > uint64(r.size)-h.Offset {
		return nil, r.corrupt(h.Offset, "%s block (%d bytes) extends beyond end of file (%d bytes)", kind, h.Length, r.size)
	}
	n := int(h.Length)
	var buf []byte
	if raw != nil {
		if cap(*raw) < n+BlockTrailerLen {
			*raw = make([]byte, n+BlockTrailerLen)
		}
		buf = (*raw)[:n+BlockTrailerLen]
	} else {
		buf = make([]byte, n+BlockTrailerLen)
	}
	if err := r.readAt(buf, h.Offset, kind); err != nil {
		return nil, err
	}
	typ := buf[n]
	if !r.opts.skipChecksums {
		if got, want := crc32.Checksum(buf[:n+1], crcTable), binary.LittleEndian.Uint32(buf[n+1:]); got != want {
			return nil, r.corrupt(h.Offset, "%s block: checksum mismatch (stored %#08x, computed %#08x)", kind, want, got)
		}
	}
	if typ == blockTypeNone {
		return buf[:n:n], nil
	}
	var d []byte
	if dec != nil {
		d = *dec
	}
	out, err := decompress(typ, buf[:n], d, r.dictPool, r.maxBlock)
	if err != nil {
		return nil, r.corrupt(h.Offset, "%s block: decompressing (type %d): %v", kind, typ, err)
	}
	if dec != nil {
		*dec = out
	}
	return out, nil
}

// readDataBlock returns the contents of data block h, through the cache
// when one is configured.
func (r *Reader) readDataBlock(h blockHandle, raw, dec *[]byte) ([]byte, error) {
	c := r.opts.Cache
	if c == nil {
		return r.readBlock(h, "data", raw, dec)
	}
	if b, ok := c.Get(r.opts.CacheID, r.opts.FileNum, h.Offset); ok {
		return b, nil
	}
	b, err := r.readBlock(h, "data", nil, nil)
	if err != nil {
		return nil, err
	}
	c.Set(r.opts.CacheID, r.opts.FileNum, h.Offset, b)
	return b, nil
}

// ErrIncomplete is matched (errors.Is) by the error of a read that was to
// be served from memory only (NewCacheOnlyIter) and needed the disk.
var ErrIncomplete = errors.New("incomplete: the read needs data that is not in memory")

// cachedDataBlock returns data block h from the block cache, or an error
// matching ErrIncomplete when the cache does not hold it.
func (r *Reader) cachedDataBlock(h blockHandle) ([]byte, error) {
	if c := r.opts.Cache; c != nil {
		if b, ok := c.Get(r.opts.CacheID, r.opts.FileNum, h.Offset); ok {
			return b, nil
		}
	}
	return nil, fmt.Errorf("sstable %s: data block at offset %d not cached: %w", r.name, h.Offset, ErrIncomplete)
}

// findBlock returns the index of the first data block whose separator is
// >= key, or len(r.index).
func (r *Reader) findBlock(key base.InternalKey) int {
	lo, hi := 0, len(r.index)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if base.CompareInternal(r.index[m].sep, key) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// MayContain reports whether the file may contain a point entry for
// userKey. It returns false only when the whole-key filter (or, without
// one, a compatible prefix filter and ReaderOptions.PrefixExtractor) proves
// the key absent; true when the file has no usable filter. Range tombstones
// are not considered.
func (r *Reader) MayContain(userKey []byte) bool {
	if r.filter == nil {
		return true
	}
	if r.props.WholeKeyFiltering {
		return r.filter.MayContain(userKey)
	}
	if r.opts.PrefixExtractor != nil && r.prefixUsable() {
		if p := r.opts.PrefixExtractor(userKey); p != nil {
			return r.filter.MayContain(p)
		}
	}
	return true
}

func (r *Reader) prefixUsable() bool {
	return r.filter != nil && r.props.PrefixExtractorName != "" &&
		(r.opts.PrefixExtractorName == "" || r.opts.PrefixExtractorName == r.props.PrefixExtractorName)
}

// MayContainPrefix reports whether the file may contain a point entry whose
// user key has the given prefix (as computed by the file's prefix
// extractor). It returns true when the file has no prefix filter or its
// extractor name differs from ReaderOptions.PrefixExtractorName (when set).
func (r *Reader) MayContainPrefix(prefix []byte) bool {
	if !r.prefixUsable() {
		return true
	}
	return r.filter.MayContain(prefix)
}

// RangeDels returns the file's range tombstones sorted by start ascending,
// then sequence number descending. They are parsed once and shared: callers
// must not modify the slice or its byte slices.
func (r *Reader) RangeDels() ([]RangeDel, error) {
	r.rdOnce.Do(func() { r.rangeDels, r.rdErr = r.loadRangeDels() })
	return r.rangeDels, r.rdErr
}

func (r *Reader) loadRangeDels() ([]RangeDel, error) {
	h, ok := r.meta[metaRangeDelName]
	if !ok {
		return nil, nil
	}
	b, err := r.readBlock(h, "range-del", nil, nil)
	if err != nil {
		return nil, err
	}
	var it blockIter
	if err := it.init(b); err != nil {
		return nil, r.corrupt(h.Offset, "range-del block: %v", err)
	}
	var out []RangeDel
	var prev base.InternalKey
	for ok := it.first(); ok; ok = it.nextEntry() {
		k, ok := base.DecodeInternalKey(it.key)
		if !ok || k.Kind() != base.KindRangeDelete {
			return nil, r.corrupt(h.Offset, "range-del block: malformed key")
		}
		start := append([]byte{}, k.UserKey...)
		if len(out) > 0 && base.CompareInternal(prev, k) > 0 {
			return nil, r.corrupt(h.Offset, "range-del block: tombstones out of order")
		}
		if string(start) >= string(it.val) {
			return nil, r.corrupt(h.Offset, "range-del block: empty tombstone [%s, %s)",
				base.FormatKey(start), base.FormatKey(it.val))
		}
		out = append(out, RangeDel{Start: start, End: append([]byte{}, it.val...), Seq: k.SeqNum()})
		prev = base.InternalKey{UserKey: start, Trailer: k.Trailer}
	}
	if it.err != nil {
		return nil, r.corrupt(h.Offset, "range-del block: %v", it.err)
	}
	if uint64(len(out)) != r.props.NumRangeDeletions {
		return nil, r.corrupt(h.Offset, "range-del block has %d tombstones, properties record %d",
			len(out), r.props.NumRangeDeletions)
	}
	return out, nil
}

// Properties returns the file's properties. The result is shared and must
// not be modified.
func (r *Reader) Properties() *Properties { return r.props }

// BlockInfo describes one block of a file.
type BlockInfo struct {
	// Kind is one of "data", "zstd-dict", "filter", "range-del", "index",
	// "properties", "metaindex".
	Kind string
	// Offset and Length locate the stored block; Length excludes the 5-byte
	// trailer.
	Offset, Length uint64
	// Compression is the stored block's compression: "none", "snappy",
	// "zstd", "zstd-dict", or "unknown(N)".
	Compression string
}

// Layout describes where everything lives in a file.
type Layout struct {
	// Blocks lists every block in file order.
	Blocks []BlockInfo
	// FooterOffset is the offset of the FooterLen-byte footer.
	FooterOffset  uint64
	FormatVersion uint32
}

func blockTypeName(t byte) string {
	switch t {
	case blockTypeNone:
		return "none"
	case blockTypeSnappy:
		return "snappy"
	case blockTypeZstd:
		return "zstd"
	case blockTypeZstdDict:
		return "zstd-dict"
	}
	return fmt.Sprintf("unknown(%d)", t)
}

// Layout returns the handles, kinds and compression of every block. It
// reads the compression byte of each block's trailer (but not the blocks).
func (r *Reader) Layout() (*Layout, error) {
	l := &Layout{FooterOffset: uint64(r.size - FooterLen), FormatVersion: r.footer.version}
	for _, e := range r.index {
		l.Blocks = append(l.Blocks, BlockInfo{Kind: "data", Offset: e.h.Offset, Length: e.h.Length})
	}
	kinds := map[string]string{
		metaFilterName: "filter", metaRangeDelName: "range-del",
		metaPropertiesName: "properties", metaZstdDictName: "zstd-dict",
	}
	for name, h := range r.meta {
		k, ok := kinds[name]
		if !ok {
			k = "meta:" + name
		}
		l.Blocks = append(l.Blocks, BlockInfo{Kind: k, Offset: h.Offset, Length: h.Length})
	}
	l.Blocks = append(l.Blocks,
		BlockInfo{Kind: "index", Offset: r.footer.index.Offset, Length: r.footer.index.Length},
		BlockInfo{Kind: "metaindex", Offset: r.footer.metaindex.Offset, Length: r.footer.metaindex.Length})
	sort.Slice(l.Blocks, func(i, j int) bool { return l.Blocks[i].Offset < l.Blocks[j].Offset })
	var tb [1]byte
	for i := range l.Blocks {
		b := &l.Blocks[i]
		if b.Length > maxBlockLen {
			return nil, r.corrupt(b.Offset, "%s block: length %d too large", b.Kind, b.Length)
		}
		if err := r.readAt(tb[:], b.Offset+b.Length, b.Kind); err != nil {
			return nil, err
		}
		b.Compression = blockTypeName(tb[0])
	}
	return l, nil
}

// ApproximateOffset returns the approximate file offset at which entries
// with user key >= userKey begin: the offset of the data block that would
// hold userKey, or the end of the data blocks when userKey is past them.
func (r *Reader) ApproximateOffset(userKey []byte) uint64 {
	i := r.findBlock(base.MakeSearchKey(userKey))
	if i == len(r.index) {
		return r.dataEnd
	}
	return r.index[i].h.Offset
}

// DataBlockBounds calls fn, in key order, for every data block whose index
// separator's user key lies in [lower, upper) (nil bounds are open): the
// separator's user key, which is at or above every key of the block and
// below every key of the next one (valid only during the call), and the
// block's stored size in bytes. It reads only the index, which the Reader
// holds in memory.
func (r *Reader) DataBlockBounds(lower, upper []byte, fn func(sepUserKey []byte, size uint64)) {
	i := 0
	if lower != nil {
		i = r.findBlock(base.MakeSearchKey(lower))
	}
	for ; i < len(r.index); i++ {
		e := &r.index[i]
		if upper != nil && bytes.Compare(e.sep.UserKey, upper) >= 0 {
			return
		}
		fn(e.sep.UserKey, e.h.Length+BlockTrailerLen)
	}
}

// Close releases the Reader. It does not close the underlying file.
// Iterators must be closed first.
func (r *Reader) Close() error { return nil }
