package natsbus

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Snapshot chunks (fleetv1.SnapshotChunk) by hand: each segment is copied
// once, and the replica's alias the received message (the generated code
// copies twice more). chunk_test.go checks them against the generated code.

// Field numbers of fleetv1.SnapshotChunk.
const (
	chunkEpoch    = 1
	chunkSeq      = 2
	chunkIndex    = 3
	chunkLast     = 4
	chunkSegments = 5
	chunkError    = 6
	chunkBlocks   = 7
)

// chunkHeader is a SnapshotChunk's fields other than its segments.
type chunkHeader struct {
	epoch, seq, blocks uint64
	index              uint32
	last               bool
	err                string
}

// appendChunkSegment appends one segment field to a chunk being built.
// Cost: one copy of seg.
func appendChunkSegment(b, seg []byte) []byte {
	b = protowire.AppendTag(b, chunkSegments, protowire.BytesType)
	return protowire.AppendBytes(b, seg)
}

// appendChunkHeader completes a chunk with h's non-zero fields.
func appendChunkHeader(b []byte, h chunkHeader) []byte {
	varint := func(num protowire.Number, v uint64) {
		if v != 0 {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, v)
		}
	}
	varint(chunkEpoch, h.epoch)
	varint(chunkSeq, h.seq)
	varint(chunkIndex, uint64(h.index))
	if h.last {
		varint(chunkLast, 1)
	}
	if h.err != "" {
		b = protowire.AppendTag(b, chunkError, protowire.BytesType)
		b = protowire.AppendString(b, h.err)
	}
	varint(chunkBlocks, h.blocks)
	return b
}

// snapshotChunk is a decoded chunk; its segments alias the message.
type snapshotChunk struct {
	chunkHeader
	segments [][]byte
}

// unmarshalChunk decodes b into c, reusing c's list; segments alias b.
// Unknown fields and wrong wire types are skipped as the generated code
// does; a malformed message is ErrMalformed naming the offset. Cost:
// O(fields), no allocation once grown.
func unmarshalChunk(b []byte, c *snapshotChunk) error {
	*c = snapshotChunk{segments: c.segments[:0]}
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return fmt.Errorf("%w: snapshot chunk: bad tag at byte %d: %w", ErrMalformed, off, protowire.ParseError(n))
		}
		at := off
		off += n
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b[off:])
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b[off:])
		default:
			n = protowire.ConsumeFieldValue(num, typ, b[off:])
		}
		if n < 0 {
			return fmt.Errorf("%w: snapshot chunk: field %d at byte %d: %w", ErrMalformed, num, at, protowire.ParseError(n))
		}
		off += n
		want := protowire.VarintType
		if num == chunkSegments || num == chunkError {
			want = protowire.BytesType
		}
		if typ != want {
			continue // as the generated code does: an unknown field
		}
		switch num {
		case chunkEpoch:
			c.epoch = v
		case chunkSeq:
			c.seq = v
		case chunkIndex:
			c.index = uint32(v)
		case chunkLast:
			c.last = v != 0
		case chunkBlocks:
			c.blocks = v
		case chunkSegments:
			c.segments = append(c.segments, bs[:len(bs):len(bs)])
		case chunkError:
			c.err = string(bs)
		}
	}
	return nil
}
