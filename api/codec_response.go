package api

import (
	"math"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// unmarshalScoreResponse decodes b into resp as protobuf-go would when b is
// in the server's form (known fields, each message field once, valid UTF-8);
// otherwise it returns false, resp in any state, for protobuf-go to decode
// (FuzzUnmarshalScoreResponse checks the pair).
//
// Why: protobuf-go allocates 70 objects, ~5 µs, for 8 workers on every
// router call. Here the workers are counted first, then one pass fills a
// slab per message type and one string buffer: 7 allocations.
func unmarshalScoreResponse(b []byte, resp *kvindexv1.ScoreResponse) bool {
	n := 0
	for c := (cursor{b: b}); len(c.b) > 0 && !c.bad; {
		if num, typ := c.tag(); num == 3 && typ == protowire.BytesType {
			n++
			c.bytes()
		} else {
			c.skip(typ)
		}
	}
	proto.Reset(resp)
	d := respDecoder{resp: resp}
	if n > 0 {
		// Every worker has a ref, a load and mostly one medium; another
		// shape grows a slab in a new chunk, leaving placed messages be.
		d.scores = make([]kvindexv1.WorkerScore, 0, n)
		d.ptrs = make([]*kvindexv1.WorkerScore, 0, n)
		d.refs = make([]kvindexv1.WorkerRef, 0, n)
		d.loads = make([]kvindexv1.LoadDetail, 0, n)
		d.media = make([]kvindexv1.MediumMatch, 0, n)
		d.mediaPtrs = make([]*kvindexv1.MediumMatch, 0, n)
		d.sb.Grow(len(b) / 4) // pods, media and sources: ~1/5 of a reply
	}
	if !d.response(b) {
		return false
	}
	if len(d.ptrs) > 0 {
		resp.Workers = d.ptrs
	}
	return true
}

// cursor reads protobuf fields, 1-byte tags and varints inline; an error
// sets bad and empties b.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) fail() {
	c.bad = true
	c.b = nil
}

func (c *cursor) tag() (protowire.Number, protowire.Type) {
	if len(c.b) > 0 && c.b[0] < 0x80 {
		t := c.b[0]
		c.b = c.b[1:]
		if t>>3 == 0 {
			c.fail() // field 0 is invalid
			return 0, 0
		}
		return protowire.Number(t >> 3), protowire.Type(t & 7)
	}
	num, typ, n := protowire.ConsumeTag(c.b)
	if n < 0 {
		c.fail()
		return 0, 0
	}
	c.b = c.b[n:]
	return num, typ
}

func (c *cursor) varint() uint64 {
	if len(c.b) > 0 && c.b[0] < 0x80 {
		x := c.b[0]
		c.b = c.b[1:]
		return uint64(x)
	}
	x, n := protowire.ConsumeVarint(c.b)
	if n < 0 {
		c.fail()
		return 0
	}
	c.b = c.b[n:]
	return x
}

func (c *cursor) double() float64 {
	x, n := protowire.ConsumeFixed64(c.b)
	if n < 0 {
		c.fail()
		return 0
	}
	c.b = c.b[n:]
	return math.Float64frombits(x)
}

func (c *cursor) bytes() []byte {
	v, n := protowire.ConsumeBytes(c.b)
	if n < 0 {
		c.fail()
		return nil
	}
	c.b = c.b[n:]
	return v
}

// skip passes over a value of wire type typ (groups fail: none is expected).
func (c *cursor) skip(typ protowire.Type) {
	switch typ {
	case protowire.VarintType:
		c.varint()
	case protowire.Fixed64Type:
		c.double()
	case protowire.BytesType:
		c.bytes()
	case protowire.Fixed32Type:
		if _, n := protowire.ConsumeFixed32(c.b); n >= 0 {
			c.b = c.b[n:]
			return
		}
		c.fail()
	default:
		c.fail()
	}
}

// respDecoder is unmarshalScoreResponse's state: the reply and its slabs.
type respDecoder struct {
	resp      *kvindexv1.ScoreResponse
	scores    []kvindexv1.WorkerScore
	ptrs      []*kvindexv1.WorkerScore
	refs      []kvindexv1.WorkerRef
	loads     []kvindexv1.LoadDetail
	media     []kvindexv1.MediumMatch
	mediaPtrs []*kvindexv1.MediumMatch
	// sb holds every string's bytes; written bytes never change, so each
	// string sliced from sb.String() stays valid as it grows.
	sb strings.Builder
}

// slot returns a new zero element of *slab, in a new chunk when full.
func slot[T any](slab *[]T) *T {
	if len(*slab) == cap(*slab) {
		*slab = make([]T, 0, max(cap(*slab), 1))
	}
	*slab = (*slab)[:len(*slab)+1]
	return &(*slab)[len(*slab)-1]
}

// str copies a string field's value into sb, or fails on invalid UTF-8.
func (d *respDecoder) str(c *cursor) string {
	v := c.bytes()
	if !utf8.Valid(v) {
		c.fail()
		return ""
	}
	at := d.sb.Len()
	d.sb.Write(v)
	return d.sb.String()[at:]
}

func (d *respDecoder) response(b []byte) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.VarintType:
			d.resp.BlockSize = uint32(c.varint())
		case num == 2 && typ == protowire.VarintType:
			d.resp.PromptBlocks = uint32(c.varint())
		case num == 3 && typ == protowire.BytesType:
			if !d.workerScore(c.bytes()) {
				return false
			}
		case num == 4 && typ == protowire.BytesType:
			d.resp.Policy = d.str(&c)
		default:
			return false
		}
	}
	return !c.bad
}

func (d *respDecoder) workerScore(b []byte) bool {
	ws := slot(&d.scores)
	d.ptrs = append(d.ptrs, ws)
	firstMedium := len(d.mediaPtrs)
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.BytesType && ws.Worker == nil:
			ws.Worker = slot(&d.refs)
			if !d.workerRef(c.bytes(), ws.Worker) {
				return false
			}
		case num == 2 && typ == protowire.VarintType:
			ws.MatchedBlocks = uint32(c.varint())
		case num == 3 && typ == protowire.VarintType:
			ws.MatchedTokens = uint32(c.varint())
		case num == 4 && typ == protowire.BytesType:
			m := slot(&d.media)
			d.mediaPtrs = append(d.mediaPtrs, m)
			if !d.mediumMatch(c.bytes(), m) {
				return false
			}
		case num == 5 && typ == protowire.VarintType:
			ws.Health = kvindexv1.WorkerHealth(int32(c.varint()))
		case num == 6 && typ == protowire.VarintType:
			ws.SpeculativeBlocks = uint32(c.varint())
		case num == 7 && typ == protowire.Fixed64Type:
			ws.Overlap = c.double()
		case num == 8 && typ == protowire.BytesType && ws.Load == nil:
			ws.Load = slot(&d.loads)
			if !d.loadDetail(c.bytes(), ws.Load) {
				return false
			}
		case num == 9 && typ == protowire.Fixed64Type:
			ws.Penalty = c.double()
		case num == 10 && typ == protowire.Fixed64Type:
			ws.Score = c.double()
		case num == 11 && typ == protowire.BytesType:
			ws.Reason = d.str(&c)
		case num == 12 && typ == protowire.VarintType:
			ws.PrefixBlocks = uint32(c.varint())
		case num == 13 && typ == protowire.BytesType && ws.CappedBy == nil:
			// Only a capped worker has it: one allocation, through
			// protobuf-go (whose validation of UTF-8 the answer keeps).
			ws.CappedBy = new(kvindexv1.KVCacheGroup)
			if proto.Unmarshal(c.bytes(), ws.CappedBy) != nil || c.bad {
				return false
			}
		default:
			return false
		}
	}
	if n := len(d.mediaPtrs); n > firstMedium {
		ws.ByMedium = d.mediaPtrs[firstMedium:n:n]
	}
	return !c.bad
}

func (d *respDecoder) workerRef(b []byte, r *kvindexv1.WorkerRef) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.BytesType:
			r.Pod = d.str(&c)
		case num == 2 && typ == protowire.VarintType:
			r.DpRank = uint32(c.varint())
		default:
			return false
		}
	}
	return !c.bad
}

func (d *respDecoder) mediumMatch(b []byte, m *kvindexv1.MediumMatch) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.BytesType:
			m.Medium = d.str(&c)
		case num == 2 && typ == protowire.VarintType:
			m.Blocks = uint32(c.varint())
		case num == 3 && typ == protowire.VarintType:
			m.Tokens = uint32(c.varint())
		default:
			return false
		}
	}
	return !c.bad
}

func (d *respDecoder) loadDetail(b []byte, l *kvindexv1.LoadDetail) bool {
	c := cursor{b: b}
	for len(c.b) > 0 {
		switch num, typ := c.tag(); {
		case num == 1 && typ == protowire.VarintType:
			l.Running = uint32(c.varint())
		case num == 2 && typ == protowire.VarintType:
			l.Waiting = uint32(c.varint())
		case num == 3 && typ == protowire.Fixed64Type:
			l.KvCacheUsage = c.double()
		case num == 4 && typ == protowire.VarintType:
			l.InflightRequests = uint32(c.varint())
		case num == 5 && typ == protowire.VarintType:
			l.InflightPrefillTokens = c.varint()
		case num == 6 && typ == protowire.VarintType:
			l.QueuedPrefillTokens = c.varint()
		case num == 7 && typ == protowire.BytesType:
			l.Source = d.str(&c)
		default:
			return false
		}
	}
	return !c.bad
}
