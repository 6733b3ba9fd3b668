package sstable

import (
	"encoding/binary"
	"hash/crc32"
)

// FormatVersion is the version of the on-disk format this package writes.
// Readers reject files with any other version.
const FormatVersion uint32 = 1

// Magic is the value (stored as a little-endian uint64) that ends every
// Shale SST file; on disk its bytes read f0 'S' 'H' 'A' 'L' 's' 's' 't'.
const Magic uint64 = 0x7473734c414853f0

// FooterLen is the fixed size of the footer at the end of every file.
const FooterLen = 48

// BlockTrailerLen is the size of the trailer that follows every block: one
// compression-type byte and a CRC32C.
const BlockTrailerLen = 5

// maxBlockLen bounds the stored and uncompressed size of any one block the
// reader accepts, so that a damaged length cannot trigger a huge allocation.
const maxBlockLen = 1 << 30

// Block compression types as stored in the block trailer.
const (
	blockTypeNone     byte = 0
	blockTypeSnappy   byte = 1
	blockTypeZstd     byte = 2
	blockTypeZstdDict byte = 3
)

// Meta block names (metaindex keys).
const (
	metaFilterName     = "shale.filter.bloom"
	metaRangeDelName   = "shale.rangedel"
	metaPropertiesName = "shale.properties"
	metaZstdDictName   = "shale.zstd.dict"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// blockHandle locates a block: Length excludes the 5-byte trailer.
type blockHandle struct {
	Offset, Length uint64
}

func (h blockHandle) appendTo(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, h.Offset)
	return binary.AppendUvarint(dst, h.Length)
}

// decodeHandle parses a varint handle; ok is false when malformed or when
// trailing bytes remain.
func decodeHandle(b []byte) (blockHandle, bool) {
	off, n := binary.Uvarint(b)
	if n <= 0 {
		return blockHandle{}, false
	}
	l, m := binary.Uvarint(b[n:])
	if m <= 0 || n+m != len(b) {
		return blockHandle{}, false
	}
	return blockHandle{Offset: off, Length: l}, true
}

// footer is the decoded fixed-size footer.
type footer struct {
	metaindex blockHandle
	index     blockHandle
	version   uint32
}

func (f footer) encode() []byte {
	b := make([]byte, FooterLen)
	binary.LittleEndian.PutUint64(b[0:], f.metaindex.Offset)
	binary.LittleEndian.PutUint64(b[8:], f.metaindex.Length)
	binary.LittleEndian.PutUint64(b[16:], f.index.Offset)
	binary.LittleEndian.PutUint64(b[24:], f.index.Length)
	binary.LittleEndian.PutUint32(b[32:], f.version)
	binary.LittleEndian.PutUint32(b[36:], crc32.Checksum(b[:36], crcTable))
	binary.LittleEndian.PutUint64(b[40:], Magic)
	return b
}
