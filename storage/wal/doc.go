// Package wal frames records (opaque byte strings) into a log file. It is
// the physical layer of both the write-ahead log (whose records are write
// batches) and the MANIFEST (whose records are version edits); it knows
// nothing about what the records mean.
//
// # File format, version 1
//
// A log file is a sequence of blocks of BlockSize (32768) bytes; the last
// block may be shorter. Block i starts at file offset i*BlockSize. Each
// block holds a sequence of chunks; a chunk never crosses a block boundary.
//
// A chunk is a 7-byte header followed by its payload:
//
//	offset  size  field
//	0       4     checksum, little-endian uint32 (see below)
//	4       2     length of the payload in bytes, little-endian uint16
//	6       1     chunk type
//	7       len   payload
//
// The chunk types are:
//
//	1  Full    the chunk holds a whole record
//	2  First   the first fragment of a record
//	3  Middle  an interior fragment of a record
//	4  Last    the last fragment of a record
//
// Type 0 is never written; any other value is invalid. A record is either
// one Full chunk or a First chunk, zero or more Middle chunks and a Last
// chunk, in consecutive positions (the fragments of a record are adjacent,
// continuing at the start of the following block when a block is full).
// Fragments may be empty: when exactly HeaderSize bytes remain in a block,
// the writer puts an empty First chunk there.
//
// The checksum is CRC-32C (Castagnoli polynomial) of the type byte followed
// by the payload, masked as
//
//	masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (mod 2^32)
//
// Masking keeps the checksum of data that itself contains checksums from
// being trivially predictable.
//
// When fewer than HeaderSize (7) bytes remain in a block, the writer fills
// them with zeros and continues at the next block; readers skip such a
// trailer without looking at it. Because the type byte of a real chunk is
// never 0, a header of seven zero bytes never describes a chunk: it marks
// the end of written data (for example preallocated space), and readers
// treat it as the end of the log.
//
// The payload length is at most BlockSize-HeaderSize (32761). Records have
// no size limit of their own.
//
// Version 1 carries no log number in the header, so a file must never be
// reused ("recycled") for a newer log: stale chunks left over from the old
// contents would checksum correctly. The engine always creates fresh files.
//
// # Reading and recovery
//
// Reader distinguishes three outcomes besides a record:
//
//   - io.EOF: the log ends cleanly at a record boundary (the end of the
//     file, possibly after block padding or at a zeroed header).
//   - ErrTornTail: the log ends in the middle of a record — inside a chunk
//     header, inside a payload, or after a First/Middle chunk with no Last.
//     This is what a crash during an append leaves behind.
//   - *base.CorruptionError: a checksum mismatch, an invalid chunk type, a
//     length that cannot fit in its block, or a broken First/Middle/Last
//     sequence. The error names the file and the offset of the bad chunk.
//
// After an error, Reader.ValidRecordFollows tells whether any later chunk
// has a valid checksum, which separates garbage at the tail of the last log
// after a crash (tolerable) from damage in the middle of the log (not).
package wal
