// Package sstable reads and writes Shale's sorted string table (SST) files:
// immutable files of internal keys in base.CompareInternal order, with a
// block index, a bloom filter, range tombstones and properties.
//
// A Writer takes point entries in strictly increasing order plus range
// tombstones in any order, and produces one file. A Reader opens a file,
// verifies its footer and metadata, and serves bidirectional bounded
// iterators (base.InternalIterator), filter checks and range tombstones.
// Every byte the Reader relies on is covered by a CRC32C; damage is reported
// as a *base.CorruptionError naming the file and the block offset, never as
// wrong data or a panic.
//
// # File format, version 1
//
// All integers are little-endian. "uvarint" is encoding/binary's unsigned
// varint. A file is:
//
//	data block 0 .. data block N-1      (contiguous from offset 0)
//	[zstd dictionary block]             (only with ZstdDictCompression)
//	[filter block]                      (only when a filter is configured)
//	[range-deletion block]              (only when the file has tombstones)
//	index block
//	properties block
//	metaindex block
//	footer                              (FooterLen = 48 bytes)
//
// Block trailer. Every block is stored as its (possibly compressed) bytes
// followed by a 5-byte trailer:
//
//	type   uint8    0 = none, 1 = snappy, 2 = zstd, 3 = zstd with the file's dictionary
//	crc    uint32   CRC32C (Castagnoli) of the stored block bytes followed by the type byte
//
// A block handle (offset, length) locates the stored bytes; length excludes
// the trailer. Handles inside blocks are two uvarints (offset, length).
// Snappy blocks are in the snappy block format (github.com/golang/snappy).
// Zstd blocks are a single zstd frame whose header records the content size
// (single-segment frames). The writer stores a block uncompressed when
// compression saves less than 12.5% (compressed > len - len/8). Only data
// blocks are ever compressed by this writer; readers accept any type on any
// block. Readers reject blocks whose stored or uncompressed size exceeds
// 1 GiB.
//
// Block contents (used by data, index, range-deletion, properties and
// metaindex blocks). A sequence of entries
//
//	shared    uvarint   bytes shared with the previous entry's key
//	unshared  uvarint   length of the key suffix that follows
//	vlen      uvarint   length of the value
//	key[shared:]        unshared bytes
//	value               vlen bytes
//
// followed by the restart array: R uint32 offsets of entries whose shared
// length is 0 ("restart points"), then R as a uint32. R >= 1; the first
// restart point is offset 0 and the offsets strictly increase (an empty block
// is a single restart offset 0 with no entries). Writers place a restart
// point every BlockRestartInterval entries (default 16) in data and
// range-deletion blocks, every 16 in the index block and every entry in the
// properties and metaindex blocks.
//
// Data blocks. Keys are encoded internal keys (base.InternalKey.AppendEncoded:
// user key, then the 8-byte trailer seq<<8|kind), kinds SET, DEL and MERGE
// only, strictly increasing in base.CompareInternal order within and across
// blocks. Values are the entries' values. A block is cut when its
// uncompressed size (entries plus restart array) reaches BlockSize.
//
// Index block. One entry per data block, in order: the key is an encoded
// internal key S with last(block i) <= S < first(block i+1) (for the last
// block S is its last key); the value is the data block's handle. A
// shortened separator uses the trailer (MaxSeqNum, KindMax), i.e.
// base.MakeSearchKey(shortUserKey).
//
// Filter block (metaindex name "shale.filter.bloom"). One bloom filter for
// the whole file, in the encoding of package bloom (filter bytes, then a
// probe-count byte; deterministic 64-bit hash and double hashing). It holds
// every distinct user key of the point entries when whole-key filtering is
// on, and, when a prefix extractor is configured, every distinct non-nil
// prefix it returns for them. Properties record which (shale.filter.whole-key,
// shale.prefix.extractor). The filter is never consulted for range
// tombstones.
//
// Range-deletion block (metaindex name "shale.rangedel"). One entry per
// tombstone: key = encoded internal key start#seq,RANGEDEL, value = end user
// key (exclusive), start < end. Entries are sorted by start ascending, then
// seq descending, then end ascending; duplicates of a key are allowed.
//
// Zstd dictionary block (metaindex name "shale.zstd.dict"). Raw zstd
// dictionary content (used as initial history, dictionary ID 1) built from
// samples of the first 16 data blocks; blocks of type 3 must be decoded with
// it.
//
// Properties block (metaindex name "shale.properties"). Entries sorted by
// name; integers are uvarints unless noted; strings are raw bytes:
//
//	shale.compression          string: none | snappy | zstd | zstd-dict
//	shale.comparator           string: "shale.bytewise"
//	shale.creation.time        zig-zag varint: Unix seconds
//	shale.data.size            on-disk bytes of data blocks incl. trailers
//	shale.filter.policy        string: "shale.bloom.v1", or "" without filter
//	shale.filter.size          on-disk bytes of the filter block incl. trailer
//	shale.filter.whole-key     1 if the filter holds whole user keys, else 0
//	shale.format.version       1
//	shale.index.size           on-disk bytes of the index block incl. trailer
//	shale.num.data.blocks      number of data blocks (= index entries)
//	shale.num.deletions        DEL entries
//	shale.num.entries          point entries
//	shale.num.merges           MERGE entries
//	shale.num.range-deletions  tombstones
//	shale.prefix.extractor     string: prefix extractor name, "" if no prefixes
//	shale.raw.key.size         sum of encoded internal key sizes
//	shale.raw.value.size       sum of value sizes
//	shale.seqnum.largest       largest seqnum of any entry or tombstone
//	shale.seqnum.smallest      smallest seqnum of any entry or tombstone
//
// Any other name is a user property (WriterOptions.UserProperties); the
// "shale." prefix is reserved.
//
// Metaindex block. Entries sorted by name: name -> handle of the meta block
// (names above). The properties entry is mandatory; unknown names are
// ignored by readers.
//
// Footer (48 bytes at the end of the file):
//
//	0   uint64  metaindex handle offset
//	8   uint64  metaindex handle length
//	16  uint64  index handle offset
//	24  uint64  index handle length
//	32  uint32  format version (1)
//	36  uint32  CRC32C of bytes 0..35
//	40  uint64  magic 0x7473734c414853f0 (bytes f0 'S' 'H' 'A' 'L' 's' 's' 't')
//
// Readers verify the magic, the footer CRC, the version, every block's CRC,
// that data block handles tile [0, end of data) in index order, that
// separators strictly increase, and that the number of index entries equals
// shale.num.data.blocks.
package sstable
