package events

import (
	"errors"
	"math"
)

// ErrMalformed is wrapped by every decode error, which names the event,
// field and byte offset and quotes the bytes around it.
var ErrMalformed = errors.New("events: malformed payload")

// minEventLen is the smallest well-formed event (fixarray, an empty fixstr
// tag, skipped as unknown): it bounds how many events a payload can claim.
// minKnownEventLen is the smallest event kvindex keeps (fixarray, fixstr
// "BlockStored"): it bounds the Events a payload can fill, so a payload of
// tiny unknown events allocates nothing for them.
const (
	minEventLen      = 1 + 1
	minKnownEventLen = 1 + 1 + len("BlockStored")
)

// Decoder decodes KV event payloads into Batches without allocating once a
// Batch's slices have grown. The msgpack reader is hand-written (an index
// into the payload, every length checked): about 10x a general library
// (docs/benchmarks.md, "Decoding"). Not safe for concurrent use; the zero
// value is ready; do not copy after first use.
type Decoder struct {
	p   []byte // the payload being decoded; nil between calls
	pos int    // offset in p of the next unread byte

	// Where the decoder is, for error messages.
	event int    // index of the event being decoded, -1 in the envelope
	kind  Kind   // its kind, 0 before the tag is read
	field string // field name, "" for none
	key   []byte // unknown map key being skipped (aliases p)
	index int    // element index within field, -1 for none
	path  []int  // extra_keys tuple indices below index

	spareExtra []ExtraKeys // the event's previous ExtraKeys, for reuse
	lastLoRA   string      // last LoRA name, reused to avoid an allocation
	unknownTag []byte      // the event's tag when kvindex does not know it (aliases p), else nil
	lastTag    string      // last unknown tag, reused to avoid an allocation
}

// NewDecoder returns a Decoder ready to decode payloads.
func NewDecoder() *Decoder { return new(Decoder) }

// Decode decodes one payload into a new Batch; Decoder.Decode reuses memory.
func Decode(payload []byte) (*Batch, error) {
	var d Decoder
	b := new(Batch)
	if err := d.Decode(payload, b); err != nil {
		return nil, err
	}
	return b, nil
}

// Decode decodes one payload into b, reusing and overwriting b's slices; b
// is valid until the next Decode into it, and payload is not retained. On
// error (always wrapping ErrMalformed) b holds a partial result that must not
// be used but may be decoded into again.
//
// Cost: O(len(payload)), ~2 ns per token id and 60 ns per event.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	d.p, d.pos = payload, 0
	d.event, d.kind, d.field, d.key, d.index, d.path = -1, 0, "", nil, -1, d.path[:0]
	err := d.decodeBatch(b)
	d.p, d.key, d.spareExtra, d.unknownTag = nil, nil, nil, nil
	return err
}

func (d *Decoder) decodeBatch(b *Batch) error {
	b.Timestamp, b.DPRank, b.HasDPRank = 0, 0, false
	b.UnknownEvents, b.UnknownTag = 0, ""
	if len(d.p) == 0 {
		return d.errorf(0, "empty payload, want a msgpack envelope [ts, events, data_parallel_rank]")
	}
	off := 0
	c, err := d.peek(off)
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen(off, c, 1)
		if err != nil {
			return err
		}
		if n < 2 {
			return d.errorf(off, "envelope is an array of %d elements, want at least 2 (ts, events)", n)
		}
		d.field = "ts"
		if b.Timestamp, err = d.readFloat(); err != nil {
			return err
		}
		d.field = "events"
		if err := d.decodeEvents(b); err != nil {
			return err
		}
		if n >= 3 {
			d.field = "data_parallel_rank"
			if err := d.decodeRank(b); err != nil {
				return err
			}
		}
		for i := 3; i < n; i++ {
			d.field, d.index = "(extra element)", i
			if err := d.skip(); err != nil {
				return err
			}
		}
	case isMap(c):
		n, err := d.mapLen(off, c)
		if err != nil {
			return err
		}
		var seenTS, seenEvents bool
		for i := 0; i < n; i++ {
			d.field, d.key, d.index = "(key)", nil, i
			key, err := d.readStr()
			if err != nil {
				return err
			}
			d.index = -1
			switch string(key) {
			case "ts":
				d.field = "ts"
				if b.Timestamp, err = d.readFloat(); err != nil {
					return err
				}
				seenTS = true
			case "events":
				d.field = "events"
				if err := d.decodeEvents(b); err != nil {
					return err
				}
				seenEvents = true
			case "data_parallel_rank":
				d.field = "data_parallel_rank"
				if err := d.decodeRank(b); err != nil {
					return err
				}
			default:
				d.field, d.key = "", key
				if err := d.skip(); err != nil {
					return err
				}
			}
		}
		d.field, d.key = "", nil
		if !seenTS || !seenEvents {
			missing := "ts"
			if seenTS {
				missing = "events"
			}
			return d.errorf(off, "envelope map has no %q key", missing)
		}
	default:
		return d.typeErr(off, c, "envelope array or map")
	}
	d.field, d.key, d.index = "", nil, -1
	if rest := len(d.p) - d.pos; rest != 0 {
		return d.errorf(d.pos, "%d trailing bytes after the envelope", rest)
	}
	return nil
}

func (d *Decoder) decodeRank(b *Batch) error {
	isNil, err := d.takeNil()
	if err != nil || isNil {
		b.DPRank, b.HasDPRank = 0, false
		return err
	}
	v, err := d.readInt(math.MinInt, math.MaxInt)
	b.DPRank, b.HasDPRank = int(v), err == nil
	return err
}

// decodeEvents decodes the events array into b.Events, skipping and
// counting events whose tag kvindex does not know (b.UnknownEvents).
func (d *Decoder) decodeEvents(b *Batch) error {
	off := d.pos
	c, err := d.peek(off)
	if err != nil {
		return err
	}
	if !isArray(c) {
		return d.typeErr(off, c, "array of events")
	}
	n, err := d.arrayLen(off, c, minEventLen)
	if err != nil {
		return err
	}
	evs := b.Events[:cap(b.Events)] // old events' slices are reused
	if want := min(n, (len(d.p)-d.pos)/minKnownEventLen+1); len(evs) < want {
		grown := make([]Event, want)
		copy(grown, evs)
		evs = grown
	}
	field, kept := d.field, 0
	for i := range n {
		d.event, d.kind, d.field, d.key, d.index = i, 0, "", nil, -1
		if kept == len(evs) { // only after unknown events: each kept one takes minKnownEventLen bytes
			evs = append(evs, Event{})
			evs = evs[:cap(evs)]
		}
		keep, err := d.decodeEvent(&evs[kept])
		if err != nil {
			b.Events = evs[:kept]
			return err
		}
		if keep {
			kept++
			continue
		}
		b.UnknownEvents++
		if string(d.unknownTag) != d.lastTag {
			d.lastTag = string(d.unknownTag)
		}
		b.UnknownTag = d.lastTag
	}
	b.Events = evs[:kept]
	d.event, d.kind, d.field, d.key, d.index = -1, 0, field, nil, -1
	return nil
}

// decodeEvent decodes one event into e; keep is false for an event whose
// tag kvindex does not know (d.unknownTag, cut to 40 bytes), skipped.
func (d *Decoder) decodeEvent(e *Event) (keep bool, err error) {
	d.spareExtra = e.ExtraKeys
	*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0]}
	d.unknownTag = nil
	off := d.pos
	c, err := d.peek(off)
	if err != nil {
		return false, err
	}
	switch {
	case isArray(c):
		err = d.decodeArrayEvent(e, off, c)
	case isMap(c):
		err = d.decodeMapEvent(e, off, c)
	default:
		return false, d.typeErr(off, c, "event array or map")
	}
	if err != nil {
		return false, err
	}
	d.field, d.key, d.index = "", nil, -1
	if d.unknownTag != nil {
		d.unknownTag = cut40(d.unknownTag)
		return false, nil
	}
	if e.Kind == KindBlockStored && e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.BlockHashes) {
		return false, d.errorf(off, "extra_keys has %d entries for %d block hashes, want one per block",
			len(e.ExtraKeys), len(e.BlockHashes))
	}
	if e.Locality == LocalityRemote {
		// Not the engine's own: never credited as GPU or host memory.
		e.Medium = MediumExternal
	}
	return true, nil
}
