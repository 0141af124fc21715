package events

import (
	"bytes"
	"math"
)

type field uint8

const (
	fBlockHashes field = iota
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fCacheSalt // SGLang's map events only
	fMetadata  // SGLang's BlockStoredWithMetadata: {"cache_salt": ...}
	fLocality  // map era only: "LOCAL" or "REMOTE"
	numFields
	fType    // the map era's tag key
	fUnknown // a key kvindex does not know: skipped
)

var fieldNames = [numFields]string{
	"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
	"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
	"kv_cache_spec_sliding_window", "cache_salt", "metadata", "locality",
}

// The array era's positional fields after the tag; older vLLMs send a prefix.
var (
	storedOrder = [...]field{
		fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID, fMedium,
		fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow,
	}
	removedOrder = [...]field{fBlockHashes, fMedium, fGroupIdx}
)

// fieldMask says which fields each Kind has; other map keys are skipped.
func fieldMask(k Kind) uint32 {
	switch k {
	case KindBlockStored:
		return 1<<numFields - 1
	case KindBlockRemoved:
		return 1<<fBlockHashes | 1<<fMedium | 1<<fGroupIdx | 1<<fLocality
	}
	return 0
}

func positionalOrder(k Kind) []field {
	switch k {
	case KindBlockStored:
		return storedOrder[:]
	case KindBlockRemoved:
		return removedOrder[:]
	}
	return nil
}

func fieldByName(key []byte) field {
	switch string(key) {
	case "type":
		return fType
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "cache_salt":
		return fCacheSalt
	case "metadata":
		return fMetadata
	case "locality":
		return fLocality
	}
	return fUnknown
}

// decodeArrayEvent decodes the array era's [tag, field...]; an unknown tag
// leaves e.Kind 0 and d.pos at the event's end.
func (d *Decoder) decodeArrayEvent(e *Event, off int, c byte) error {
	n, err := d.arrayLen(off, c, 1)
	if err != nil {
		return err
	}
	if n == 0 {
		return d.errorf(off, "event is an empty array, want [tag, fields...]")
	}
	d.field = "type"
	if e.Kind, err = d.readTag(); err != nil {
		return err
	}
	if e.Kind == 0 {
		return d.skipEvent(off)
	}
	order := positionalOrder(e.Kind)
	for i := 1; i < n; i++ {
		if i-1 < len(order) {
			f := order[i-1]
			d.field = fieldNames[f]
			if err := d.decodeField(e, f); err != nil {
				return err
			}
			continue
		}
		d.field, d.index = "(trailing field)", i
		if err := d.skip(); err != nil {
			return err
		}
	}
	return nil
}

// decodeMapEvent decodes {"type": tag, name: value...} in any key order,
// skipping unknown keys; an unknown tag leaves e.Kind 0 and d.pos at the
// event's end.
func (d *Decoder) decodeMapEvent(e *Event, off int, c byte) error {
	n, err := d.mapLen(off, c)
	if err != nil {
		return err
	}
	start, i := d.pos, 0
	if n > 0 {
		// msgspec writes the tag first; otherwise look ahead for it.
		d.field = "(key)"
		key, err := d.readStr()
		if err != nil {
			return err
		}
		if string(key) == "type" {
			d.field = "type"
			if e.Kind, err = d.readTag(); err != nil {
				return err
			}
			i = 1
		} else {
			d.pos = start
			if e.Kind, err = d.findTag(n); err != nil {
				return err
			}
			d.pos = start
		}
	}
	if d.unknownTag != nil {
		return d.skipEvent(off)
	}
	if e.Kind == 0 {
		d.field, d.key = "", nil
		return d.errorf(off, "event map has no \"type\" key")
	}
	mask := fieldMask(e.Kind)
	for ; i < n; i++ {
		d.field, d.key, d.index = "(key)", nil, -1
		keyOff := d.pos
		key, err := d.readStr()
		if err != nil {
			return err
		}
		f := fieldByName(key)
		switch {
		case f == fType:
			d.field = "type"
			k := e.Kind
			if e.Kind, err = d.readTag(); err != nil {
				return err
			}
			switch {
			case e.Kind == 0:
				return d.errorf(keyOff, "second \"type\" key says %q, first said %s", cut40(d.unknownTag), k)
			case e.Kind != k:
				return d.errorf(keyOff, "second \"type\" key says %s, first said %s", e.Kind, k)
			}
		case f < numFields && mask&(1<<f) != 0:
			d.field = fieldNames[f]
			if err := d.decodeField(e, f); err != nil {
				return err
			}
		default:
			d.field, d.key = "", key
			if err := d.skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

// findTag returns the kind the first "type" key of an n-pair map names, or
// 0 (d.unknownTag set for an unknown tag); it leaves d.pos anywhere.
func (d *Decoder) findTag(n int) (Kind, error) {
	for i := 0; i < n; i++ {
		d.field, d.key = "(key)", nil
		key, err := d.readStr()
		if err != nil {
			return 0, err
		}
		if string(key) == "type" {
			d.field = "type"
			return d.readTag()
		}
		d.field, d.key = "", key
		if err := d.skip(); err != nil {
			return 0, err
		}
	}
	return 0, nil
}

// readTag reads an event tag and sets d.kind; a tag kvindex does not know
// is kind 0 with d.unknownTag set (a str is all the wire requires).
func (d *Decoder) readTag() (Kind, error) {
	tag, err := d.readStr()
	if err != nil {
		return 0, err
	}
	var k Kind
	switch string(tag) {
	case "BlockStored":
		k = KindBlockStored
	case "BlockRemoved":
		k = KindBlockRemoved
	case "AllBlocksCleared":
		k = KindAllBlocksCleared
	default:
		d.unknownTag = tag
		return 0, nil
	}
	d.kind = k
	return k, nil
}

// cut40 returns b's first 40 bytes at most, for messages and counters.
func cut40(b []byte) []byte { return b[:min(len(b), 40)] }

// skipEvent moves past the event at off, whose tag kvindex does not know:
// the value must still be well-formed msgpack.
func (d *Decoder) skipEvent(off int) error {
	d.pos, d.field, d.key, d.index = off, "", nil, -1
	return d.skip()
}

// decodeField decodes field f into e; nil leaves it zero (Has flag false).
func (d *Decoder) decodeField(e *Event, f field) error {
	isNil, err := d.takeNil()
	if err != nil {
		return err
	}
	switch f {
	case fBlockHashes:
		e.BlockHashes = e.BlockHashes[:0]
		if isNil {
			return nil
		}
		n, err := d.readArrayLen(1)
		if err != nil {
			return err
		}
		e.BlockHashes = resize(e.BlockHashes, n)
		return d.readHashes(e.BlockHashes)
	case fParent:
		e.ParentHash, e.HasParent = 0, false
		if !isNil {
			e.ParentHash, err = d.readHash()
			e.HasParent = err == nil
		}
	case fTokenIDs:
		e.TokenIDs = e.TokenIDs[:0]
		if isNil {
			return nil
		}
		n, err := d.readArrayLen(1)
		if err != nil {
			return err
		}
		e.TokenIDs = resize(e.TokenIDs, n)
		return d.readTokens(e.TokenIDs)
	case fBlockSize:
		e.BlockSize, _, err = d.readOptInt(isNil)
	case fLoRAID:
		e.LoRAID, e.HasLoRAID = 0, false
		if !isNil {
			e.LoRAID, err = d.readInt(math.MinInt64, math.MaxInt64)
			e.HasLoRAID = err == nil
		}
	case fMedium:
		e.Medium, e.MediumName = MediumGPU, ""
		if !isNil {
			var s []byte
			if s, err = d.readStr(); err == nil {
				e.MediumName, e.Medium = internMedium(s)
			}
		}
	case fLoRAName:
		e.LoRAName = ""
		if !isNil && d.pos < len(d.p) && isMap(d.p[d.pos]) {
			// SGLang's array-form BlockStoredWithMetadata: metadata here.
			return d.decodeMetadata(e)
		}
		var s []byte
		if s, err = d.readOptStr(isNil); err == nil && s != nil {
			if string(s) != d.lastLoRA {
				d.lastLoRA = string(s)
			}
			e.LoRAName = d.lastLoRA
		}
	case fExtraKeys:
		return d.decodeExtraKeys(e, isNil)
	case fGroupIdx:
		e.GroupIdx, e.HasGroupIdx, err = d.readOptInt(isNil)
	case fSpecKind:
		var s []byte
		s, err = d.readOptStr(isNil)
		e.SpecKind = internSpecKind(s)
	case fSlidingWindow:
		e.SlidingWindow, e.HasSlidingWindow, err = d.readOptInt(isNil)
	case fCacheSalt:
		var s []byte
		s, err = d.readOptStr(isNil)
		e.CacheSalt = string(s)
	case fMetadata:
		if !isNil {
			return d.decodeMetadata(e)
		}
	case fLocality:
		e.Locality = LocalityLocal
		if !isNil {
			var s []byte
			if s, err = d.readStr(); err == nil {
				e.Locality = localityOf(s)
			}
		}
	}
	return err
}

// localityOf is ParseLocality for the payload's bytes, without allocating.
func localityOf(s []byte) Locality {
	if len(s) == 0 || bytes.EqualFold(s, []byte("LOCAL")) {
		return LocalityLocal
	}
	return LocalityRemote
}

// readOptInt reads an int field whose nil was taken: nil is (0, false).
func (d *Decoder) readOptInt(isNil bool) (int, bool, error) {
	if isNil {
		return 0, false, nil
	}
	v, err := d.readInt(math.MinInt, math.MaxInt)
	return int(v), err == nil, err
}

// readOptStr reads a str field whose nil was taken; it aliases the payload.
func (d *Decoder) readOptStr(isNil bool) ([]byte, error) {
	if isNil {
		return nil, nil
	}
	return d.readStr()
}

// decodeMetadata reads SGLang's {"cache_salt": str} metadata into e.CacheSalt.
func (d *Decoder) decodeMetadata(e *Event) error {
	off := d.pos
	c, err := d.peek(off)
	if err != nil {
		return err
	}
	if !isMap(c) {
		return d.typeErr(off, c, "metadata map")
	}
	n, err := d.mapLen(off, c)
	if err != nil {
		return err
	}
	field := d.field
	for range n {
		d.field, d.key = field+" (key)", nil
		key, err := d.readStr()
		if err != nil {
			return err
		}
		if string(key) != "cache_salt" {
			d.field, d.key = field, key
			if err := d.skip(); err != nil {
				return err
			}
			continue
		}
		d.field = field + ".cache_salt"
		isNil, err := d.takeNil()
		if err != nil {
			return err
		}
		e.CacheSalt = ""
		if !isNil {
			s, err := d.readStr()
			if err != nil {
				return err
			}
			e.CacheSalt = string(s)
		}
	}
	d.field = field
	return nil
}

// internMedium returns the medium names engines send, and their Medium,
// without allocating or folding case; other names are copied and parsed.
// The table is Medium's; TestInternMediumAgreesWithParseMedium holds the
// two together.
func internMedium(s []byte) (string, Medium) {
	switch string(s) {
	case "DEVICE":
		return "DEVICE", MediumGPU
	case "CPU_TIER1":
		return "CPU_TIER1", MediumCPU
	case "SHARED_STORAGE":
		return "SHARED_STORAGE", MediumStorage
	case "FS":
		return "FS", MediumStorage
	case "CPU_TIER2":
		return "CPU_TIER2", MediumDisk
	case "NVME":
		return "NVME", MediumDisk
	case "OBJECT_STORE":
		return "OBJECT_STORE", MediumExternal
	case "OBJ":
		return "OBJ", MediumExternal
	case "GPU":
		return "GPU", MediumGPU
	case "CPU":
		return "CPU", MediumCPU
	case "cpu":
		return "cpu", MediumCPU
	case "STORAGE":
		return "STORAGE", MediumStorage
	case "CPU_PINNED":
		return "CPU_PINNED", MediumCPU
	case "DISK":
		return "DISK", MediumDisk
	case "EXTERNAL":
		return "EXTERNAL", MediumExternal
	}
	name := string(s)
	m, _ := ParseMedium(name)
	return name, m
}

// internSpecKind returns the common kv_cache_spec_kind values without allocating.
func internSpecKind(s []byte) string {
	switch string(s) {
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case "mamba":
		return "mamba"
	case "chunked_local_attention":
		return "chunked_local_attention"
	case "cross_attention":
		return "cross_attention"
	}
	return string(s)
}
