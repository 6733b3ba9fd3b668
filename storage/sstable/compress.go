package sstable

import (
	"errors"
	"fmt"
	"sync"

	"github.com/golang/snappy"
	"github.com/klauspost/compress/zstd"
)

// Compression selects how the Writer compresses data blocks.
type Compression int

// The compressions. The zero value, DefaultCompression, means snappy.
const (
	// DefaultCompression is SnappyCompression.
	DefaultCompression Compression = iota
	// NoCompression stores blocks as is.
	NoCompression
	// SnappyCompression compresses blocks with snappy (block type 1).
	SnappyCompression
	// ZstdCompression compresses blocks with zstd (block type 2) at
	// WriterOptions.ZstdLevel.
	ZstdCompression
	// ZstdDictCompression compresses blocks with zstd using a dictionary
	// sampled from the file's first data blocks and stored in the file
	// (block type 3).
	ZstdDictCompression
)

// String returns the name recorded in the properties block.
func (c Compression) String() string {
	switch c {
	case DefaultCompression, SnappyCompression:
		return "snappy"
	case NoCompression:
		return "none"
	case ZstdCompression:
		return "zstd"
	case ZstdDictCompression:
		return "zstd-dict"
	}
	return fmt.Sprintf("compression(%d)", int(c))
}

func (c Compression) resolve() Compression {
	if c == DefaultCompression {
		return SnappyCompression
	}
	return c
}

// zstdEncoderPools holds reusable zstd encoders, one pool per encoder level
// (zstd.SpeedFastest..zstd.SpeedBestCompression). Encoders are expensive to
// create; EncodeAll on a pooled encoder is cheap. The pools are never
// reconfigured after package initialisation.
var zstdEncoderPools [zstd.SpeedBestCompression + 1]sync.Pool

func zstdLevel(level int) zstd.EncoderLevel {
	if level == 0 {
		level = 3
	}
	return zstd.EncoderLevelFromZstd(level)
}

func getZstdEncoder(l zstd.EncoderLevel) (*zstd.Encoder, error) {
	if e, ok := zstdEncoderPools[l].Get().(*zstd.Encoder); ok {
		return e, nil
	}
	return zstd.NewWriter(nil, zstdEncoderOptions(l)...)
}

// zstdEncoderOptions are the options of every encoder. Single-segment frames
// always record their content size, which the reader requires.
func zstdEncoderOptions(l zstd.EncoderLevel, extra ...zstd.EOption) []zstd.EOption {
	return append([]zstd.EOption{zstd.WithEncoderLevel(l), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithSingleSegment(true)}, extra...)
}

func putZstdEncoder(l zstd.EncoderLevel, e *zstd.Encoder) { zstdEncoderPools[l].Put(e) }

// zstdDecoderPool holds reusable dictionary-less zstd decoders.
var zstdDecoderPool sync.Pool

func newZstdDecoder(opts ...zstd.DOption) (*zstd.Decoder, error) {
	opts = append([]zstd.DOption{zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(maxBlockLen), zstd.WithDecodeAllCapLimit(true)}, opts...)
	return zstd.NewReader(nil, opts...)
}

func getZstdDecoder() (*zstd.Decoder, error) {
	if d, ok := zstdDecoderPool.Get().(*zstd.Decoder); ok {
		return d, nil
	}
	return newZstdDecoder()
}

var errTooLarge = errors.New("uncompressed block too large")

// maxSnappyRatio bounds how much snappy can expand its input (a 3-byte copy
// yields at most 64 bytes), so a damaged length prefix cannot make the
// reader allocate far more than the block could decode to.
const maxSnappyRatio = 32

// decompress decodes src of the given block type into dst (reusing its
// capacity when possible). dictPool supplies decoders for type 3. The
// uncompressed size may not exceed limit.
func decompress(typ byte, src, dst []byte, dictPool *sync.Pool, limit int) ([]byte, error) {
	switch typ {
	case blockTypeSnappy:
		n, err := snappy.DecodedLen(src)
		if err != nil {
			return nil, err
		}
		if n > limit || n > maxSnappyRatio*len(src)+64 {
			return nil, errTooLarge
		}
		if cap(dst) < n {
			dst = make([]byte, n)
		}
		out, err := snappy.Decode(dst[:n], src)
		if err != nil {
			return nil, err
		}
		return out, nil
	case blockTypeZstd, blockTypeZstdDict:
		// The writer always records the content size in the frame header;
		// check it before allocating, and let the decoder write no more
		// than cap(dst) (WithDecodeAllCapLimit).
		var hdr zstd.Header
		if err := hdr.Decode(src); err != nil {
			return nil, err
		}
		if !hdr.HasFCS || hdr.FrameContentSize > uint64(limit) {
			return nil, errTooLarge
		}
		var d *zstd.Decoder
		var err error
		pool := &zstdDecoderPool
		if typ == blockTypeZstdDict {
			if dictPool == nil {
				return nil, errors.New("zstd-dict block in a file without a dictionary")
			}
			pool = dictPool
			d, _ = pool.Get().(*zstd.Decoder)
			if d == nil {
				return nil, errors.New("cannot create dictionary decoder")
			}
		} else if d, err = getZstdDecoder(); err != nil {
			return nil, err
		}
		if uint64(cap(dst)) < hdr.FrameContentSize {
			dst = make([]byte, 0, hdr.FrameContentSize)
		}
		out, err := d.DecodeAll(src, dst[:0])
		pool.Put(d)
		if err != nil {
			return nil, err
		}
		if uint64(len(out)) != hdr.FrameContentSize {
			return nil, fmt.Errorf("zstd block decoded to %d bytes, header says %d", len(out), hdr.FrameContentSize)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown compression type %d", typ)
}
