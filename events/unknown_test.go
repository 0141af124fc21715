package events

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// Every medium name of Medium's table decodes to its class, in either era
// and either event, its name kept as sent.
func TestDecodeKnownMediumNames(t *testing.T) {
	want := map[string]Medium{
		"GPU": MediumGPU, "DEVICE": MediumGPU,
		"CPU": MediumCPU, "cpu": MediumCPU, "CPU_PINNED": MediumCPU, "CPU_TIER1": MediumCPU,
		"STORAGE": MediumStorage, "SHARED_STORAGE": MediumStorage, "FS": MediumStorage,
		"DISK": MediumDisk, "Disk": MediumDisk, "CPU_TIER2": MediumDisk, "NVME": MediumDisk,
		"EXTERNAL": MediumExternal, "OBJECT_STORE": MediumExternal, "OBJ": MediumExternal,
		"REMOTE": MediumExternal, "NETWORK": MediumExternal, "SHARED": MediumExternal,
		"shared_storage": MediumStorage, "TAPE": MediumOther, "OTHER": MediumOther,
	}
	for _, a := range mediumAliases {
		if _, ok := want[a.name]; !ok {
			t.Errorf("alias %q has no case here", a.name)
		}
	}
	for name, m := range want {
		for _, opt := range []EncodeOptions{{Encoding: EncodingArray}, {Encoding: EncodingArray, ArrayFields: 6}, {Encoding: EncodingMap}} {
			b := &Batch{Events: []Event{
				{Kind: KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2, MediumName: name},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, MediumName: name},
			}}
			p, err := AppendPayload(nil, b, opt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("%q %+v: %v", name, opt, err)
			}
			for _, e := range got.Events {
				if e.Medium != m || e.MediumName != name || e.Locality != LocalityLocal {
					t.Errorf("%q %+v %v: Medium %v %q %v, want %v", name, opt, e.Kind, e.Medium, e.MediumName, e.Locality, m)
				}
			}
		}
	}
}

// A REMOTE locality (map era) is held as EXTERNAL whatever the medium; LOCAL,
// nil and an absent key are local; another name is not credited as local.
func TestDecodeLocality(t *testing.T) {
	for _, tc := range []struct {
		hex  string // the value of "locality"; "" leaves the key out
		loc  Locality
		name string // medium
		m    Medium
	}{
		{"", LocalityLocal, "CPU", MediumCPU},
		{"c0", LocalityLocal, "CPU", MediumCPU},
		{"a54c4f43414c", LocalityLocal, "GPU", MediumGPU},                    // "LOCAL"
		{"a56c6f63616c", LocalityLocal, "STORAGE", MediumStorage},            // "local"
		{"a652454d4f5445", LocalityRemote, "CPU", MediumExternal},            // "REMOTE"
		{"a672656d6f7465", LocalityRemote, "", MediumExternal},               // "remote", medium nil (GPU)
		{"a652454d4f5445", LocalityRemote, "TAPE", MediumExternal},           // an unknown medium, remote
		{"a9656c736577686572 65", LocalityRemote, "GPU", MediumExternal},     // "elsewhere": unknown
		{"a0", LocalityLocal, "DISK", MediumDisk},                            // ""
		{"a652454d4f5445", LocalityRemote, "SHARED_STORAGE", MediumExternal}, // llm-d's shared FS, remote
	} {
		medium := "c0"
		if tc.name != "" {
			medium = fmt.Sprintf("%02x%x", 0xa0|len(tc.name), tc.name)
		}
		loc, pairs := "", 3
		if tc.hex != "" {
			loc, pairs = "a86c6f63616c697479 "+tc.hex, 4
		}
		payload := fmt.Sprintf("93 cb 4004000000000000 92"+
			" %x a474797065 ab426c6f636b53746f726564 a66d656469756d %s ac626c6f636b5f686173686573 91 01 %s"+
			" %x a474797065 ac426c6f636b52656d6f766564 %s a66d656469756d %s ac626c6f636b5f686173686573 91 01 c0",
			0x80|pairs, medium, loc, 0x80|pairs, loc, medium)
		b, err := Decode(hx(payload))
		if err != nil {
			t.Fatalf("%s %s: %v", tc.hex, tc.name, err)
		}
		for _, e := range b.Events {
			if e.Locality != tc.loc || e.Medium != tc.m || e.MediumName != tc.name {
				t.Errorf("locality %s medium %q, %v: got %v %v %q, want %v %v", tc.hex, tc.name, e.Kind, e.Locality, e.Medium, e.MediumName, tc.loc, tc.m)
			}
		}
		ref, err := refDecode(hx(payload))
		if err != nil {
			t.Fatal(err)
		}
		if d := diffBatch(b, ref); d != "" {
			t.Errorf("locality %s: reference decoder: %s", tc.hex, d)
		}
	}
	// A locality must be a str or nil, as every str field.
	_, err := Decode(hx("93 00 91 82 a474797065 ac426c6f636b52656d6f766564 a86c6f63616c697479 01 00"))
	if err == nil || err.Error() != "events: malformed payload: event 0 (BlockRemoved) field locality: want str, got int (0x01) at offset 31: ... 6c 6f 63 61 6c 69 74 79 [01] 00" {
		t.Errorf("int locality: %v", err)
	}
}

// Remote blocks survive re-encoding in the map era (the array era has no
// locality).
func TestEncodeLocality(t *testing.T) {
	b := &Batch{Events: []Event{
		{Kind: KindBlockStored, BlockHashes: []uint64{1}, MediumName: "CPU", Medium: MediumExternal, Locality: LocalityRemote},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, Medium: MediumExternal, Locality: LocalityRemote},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{2}, Medium: MediumCPU, MediumName: "CPU"},
	}}
	p, err := AppendPayload(nil, b, EncodeOptions{Encoding: EncodingMap})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffBatch(got, b); d != "" {
		t.Errorf("%s\n%x", d, p)
	}
}

// unknownEvents are events of types kvindex does not know, as a newer
// engine might send them: well-formed values of any shape.
var unknownEvents = map[Encoding]string{
	// {"type": "FutureEvent", "block_hashes": [1, 2], "nested": {"a": [1, {"b": nil}]}, "x": b"hi"}
	EncodingMap: "84 a474797065 ab4675747572654576656e74 ac626c6f636b5f686173686573 92 01 02" +
		" a66e6573746564 81 a161 92 01 81 a162 c0 a178 c4 02 6869",
	// ["FutureEvent", [1, 2], {"k": [true, 1.5]}, nil]
	EncodingArray: "94 ab4675747572654576656e74 92 01 02 81 a16b 92 c3 cb 3ff8000000000000 c0",
}

// unknownEventPayload is [store, an unknown event, remove] in the era enc.
func unknownEventPayload(t testing.TB, enc Encoding) []byte {
	t.Helper()
	var evs [2][]byte
	for i, ev := range []Event{
		{Kind: KindBlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{1, 2}, BlockSize: 2, MediumName: "CPU"},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{7}, MediumName: "CPU"},
	} {
		p, err := AppendPayload(nil, &Batch{Timestamp: 2.5, Events: []Event{ev}}, EncodeOptions{Encoding: enc, Envelope: EnvelopeArray2})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = p[11:] // after 92, the float64 ts and 91
	}
	p := hx("93 cb 4004000000000000 93")
	p = append(p, evs[0]...)
	p = append(p, hx(unknownEvents[enc])...)
	p = append(p, evs[1]...)
	return append(p, 0xc0)
}

// An event of an unknown type is skipped and counted; the events beside it
// are decoded, in order.
func TestDecodeUnknownEvent(t *testing.T) {
	d := NewDecoder()
	var reused Batch
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		p := unknownEventPayload(t, enc)
		want := &Batch{Timestamp: 2.5, UnknownEvents: 1, UnknownTag: "FutureEvent", Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: MediumCPU, MediumName: "CPU"},
			{Kind: KindBlockRemoved, BlockHashes: []uint64{7}, Medium: MediumCPU, MediumName: "CPU"},
		}}
		got, err := Decode(p)
		if err != nil {
			t.Fatalf("%v: %v\n%x", enc, err, p)
		}
		if diff := diffBatch(got, want); diff != "" {
			t.Errorf("%v: %s", enc, diff)
		}
		ref, err := refDecode(p)
		if err != nil {
			t.Fatal(err)
		}
		if diff := diffBatch(ref, want); diff != "" {
			t.Errorf("%v: reference decoder: %s", enc, diff)
		}
		// A reused Batch forgets the count of the last payload.
		if err := d.Decode(p, &reused); err != nil {
			t.Fatal(err)
		}
		if err := d.Decode(hx(specVectors[0].hex), &reused); err != nil {
			t.Fatal(err)
		}
		if reused.UnknownEvents != 0 || reused.UnknownTag != "" {
			t.Errorf("%v: a reused Batch kept UnknownEvents %d %q", enc, reused.UnknownEvents, reused.UnknownTag)
		}
	}
}

// Many unknown events, tiny and long-tagged, and an unknown type first in
// a map event or after other keys: all skipped, the tag cut to 40 bytes.
// Skipping allocates nothing once the Batch has grown and while the tag
// stays the same.
func TestDecodeUnknownEventForms(t *testing.T) {
	long := strings.Repeat("FutureEventType", 4) // a 60-byte tag
	tiny := "91 a0"                              // [""]
	payload := "93 00 dc 0104 "                  // 260 events
	for range 256 {
		payload += tiny + " "
	}
	payload += fmt.Sprintf("92 d9 %02x %s c0", len(long), hex.EncodeToString([]byte(long))) + // [long, nil]
		" 82 a178 01 a474797065 a3 4e6577" + // {"x": 1, "type": "New"}
		" 91 b0416c6c426c6f636b73436c6561726564" + // ["AllBlocksCleared"]
		" 81 a474797065 a3 4e6577 00" // {"type": "New"}, rank 0
	d := NewDecoder()
	var b Batch
	if err := d.Decode(hx(payload), &b); err != nil {
		t.Fatal(err)
	}
	if b.UnknownEvents != 259 || b.UnknownTag != "New" || len(b.Events) != 1 || b.Events[0].Kind != KindAllBlocksCleared {
		t.Fatalf("UnknownEvents %d %q, events %v", b.UnknownEvents, b.UnknownTag, b.Events)
	}
	ref, err := refDecode(hx(payload))
	if err != nil {
		t.Fatal(err)
	}
	if diff := diffBatch(&b, ref); diff != "" {
		t.Error(diff)
	}
	if err := d.Decode(hx(fmt.Sprintf("93 00 91 92 d9 %02x %s c0 00", len(long), hex.EncodeToString([]byte(long)))), &b); err != nil {
		t.Fatal(err)
	}
	if b.UnknownTag != long[:40] || len(b.Events) != 0 {
		t.Errorf("long tag: %q, %d events", b.UnknownTag, len(b.Events))
	}
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		p := unknownEventPayload(t, enc)
		if n := testing.AllocsPerRun(20, func() { _ = d.Decode(p, &b) }); n != 0 {
			t.Errorf("%v: decoding a batch with an unknown event allocates %v times", enc, n)
		}
	}
}

// Configured names override built-in ones and place unknown ones; names no
// table knows go to the configured class and are counted; remote blocks
// stay EXTERNAL, uncounted; a nil table keeps unknown names in OTHER.
func TestTiersClassify(t *testing.T) {
	batch := func() *Batch {
		return &Batch{Events: []Event{
			{Kind: KindBlockStored, Medium: MediumOther, MediumName: "CPU_TIER3"},
			{Kind: KindBlockRemoved, Medium: MediumStorage, MediumName: "shared_storage"},
			{Kind: KindBlockStored, Medium: MediumOther, MediumName: "TAPE"},
			{Kind: KindBlockRemoved, Medium: MediumExternal, MediumName: "GPU", Locality: LocalityRemote},
			{Kind: KindBlockStored, Medium: MediumExternal, MediumName: "WEIRD", Locality: LocalityRemote},
			{Kind: KindAllBlocksCleared},
			{Kind: KindBlockStored, Medium: MediumCPU, MediumName: "cpu"},
		}}
	}
	tiers := NewTiers(map[string]Medium{"cpu_tier3": MediumDisk, "SHARED_STORAGE": MediumExternal, "gpu": MediumCPU}, MediumStorage)
	b := batch()
	n, name := tiers.Classify(b)
	want := []Medium{MediumDisk, MediumExternal, MediumStorage, MediumExternal, MediumExternal, MediumGPU, MediumCPU}
	for i, e := range b.Events {
		if e.Medium != want[i] {
			t.Errorf("event %d (%q): %v, want %v", i, e.MediumName, e.Medium, want[i])
		}
	}
	if n != 1 || name != "TAPE" {
		t.Errorf("Classify = %d, %q; want 1, TAPE", n, name)
	}
	var none *Tiers
	b = batch()
	n, name = none.Classify(b)
	want = []Medium{MediumOther, MediumStorage, MediumOther, MediumExternal, MediumExternal, MediumGPU, MediumCPU}
	for i, e := range b.Events {
		if e.Medium != want[i] {
			t.Errorf("nil table: event %d (%q): %v, want %v", i, e.MediumName, e.Medium, want[i])
		}
	}
	if n != 2 || name != "TAPE" || none.Unknown() != MediumOther || tiers.Unknown() != MediumStorage {
		t.Errorf("nil table: Classify = %d, %q", n, name)
	}
}
