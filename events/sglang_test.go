package events

import (
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// SGLang copies vLLM's publisher (python/sglang/srt/disaggregation/
// kv_events.py): the same 3 frames and envelope, with the attention-DP
// rank third; block hashes are the first 8 bytes of its digest read as a
// signed int64; events became tagged maps carrying cache_salt and
// session_id; media include CPU_PINNED, DISK and EXTERNAL.

// sglangPayloadHex is written byte by byte from that description: [ts,
// [{type: BlockStored, block_hashes: [-2, 2^63-1], parent_block_hash: nil,
// token_ids: [1, 2], block_size: 1, medium: "CPU_PINNED", cache_salt: "s",
// session_id: "x"}], 3].
const sglangPayloadHex = "" +
	"93" + // envelope, 3 elements
	"cb41da4aa6e0200000" + // ts 1764400000.5
	"91" + // one event
	"88" + // map of 8
	"a474797065" + "ab426c6f636b53746f726564" + // type: BlockStored
	"ac626c6f636b5f686173686573" + "92" + "fe" + "cf7fffffffffffffff" + // block_hashes: [-2, 2^63-1]
	"b1706172656e745f626c6f636b5f68617368" + "c0" + // parent_block_hash: nil
	"a9746f6b656e5f696473" + "920102" + // token_ids: [1, 2]
	"aa626c6f636b5f73697a65" + "01" + // block_size: 1
	"a66d656469756d" + "aa4350555f50494e4e4544" + // medium: CPU_PINNED
	"aa63616368655f73616c74" + "a173" + // cache_salt: "s"
	"aa73657373696f6e5f6964" + "a178" + // session_id: "x" (ignored)
	"03" // attn_dp_rank 3

// TestSGLangHandWritten decodes sglangPayloadHex.
func TestSGLangHandWritten(t *testing.T) {
	payload, _ := hex.DecodeString(sglangPayloadHex)
	b, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if !b.HasDPRank || b.DPRank != 3 || len(b.Events) != 1 {
		t.Fatalf("batch %+v", b)
	}
	e := b.Events[0]
	if e.Kind != KindBlockStored || len(e.BlockHashes) != 2 || e.BlockHashes[0] != uint64(0xfffffffffffffffe) || e.BlockHashes[1] != 1<<63-1 ||
		e.HasParent || e.BlockSize != 1 || e.Medium != MediumCPU || e.MediumName != "CPU_PINNED" || e.CacheSalt != "s" {
		t.Fatalf("event %+v", e)
	}
}

// TestSGLangMapEvents decodes SGLang-shaped batches built with a general
// msgpack encoder: signed hashes, every medium name, cache_salt, removal
// and clear events, keys in the encoder's own order.
func TestSGLangMapEvents(t *testing.T) {
	ev := func(m map[string]any) map[string]any { return m }
	batch := []any{
		1764400000.25,
		[]any{
			ev(map[string]any{"type": "BlockStored", "block_hashes": []int64{-9000000000000000000, 42}, "parent_block_hash": int64(-7),
				"token_ids": []int{5, 6, 7, 8}, "block_size": 2, "lora_id": nil, "medium": "GPU", "lora_name": nil,
				"cache_salt": "tenant-a", "session_id": "sess-1"}),
			ev(map[string]any{"type": "BlockStored", "block_hashes": []int64{-9000000000000000000}, "parent_block_hash": nil,
				"token_ids": []int{}, "block_size": 0, "medium": "DISK"}),
			ev(map[string]any{"type": "BlockRemoved", "block_hashes": []int64{42}, "medium": "EXTERNAL"}),
			ev(map[string]any{"type": "AllBlocksCleared"}),
		},
		1,
	}
	payload, err := msgpack.Marshal(batch)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if b.DPRank != 1 || len(b.Events) != 4 {
		t.Fatalf("batch %+v", b)
	}
	s := b.Events[0]
	neg := int64(-9000000000000000000)
	if s.BlockHashes[0] != uint64(neg) || s.BlockHashes[1] != 42 || !s.HasParent || s.ParentHash != uint64(0xfffffffffffffff9) ||
		s.CacheSalt != "tenant-a" || s.BlockSize != 2 || len(s.TokenIDs) != 4 || s.Medium != MediumGPU {
		t.Fatalf("stored %+v", s)
	}
	if o := b.Events[1]; o.Medium != MediumDisk || len(o.TokenIDs) != 0 || o.CacheSalt != "" {
		t.Fatalf("offload %+v", o)
	}
	if r := b.Events[2]; r.Kind != KindBlockRemoved || r.Medium != MediumExternal || r.BlockHashes[0] != 42 {
		t.Fatalf("removed %+v", r)
	}
	if b.Events[3].Kind != KindAllBlocksCleared {
		t.Fatalf("clear %+v", b.Events[3])
	}
	// The map encoder writes cache_salt back.
	out, err := AppendPayload(nil, b, EncodeOptions{Encoding: EncodingMap, HashForm: HashInt64})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Decode(out)
	if err != nil || again.Events[0].CacheSalt != "tenant-a" {
		t.Fatalf("round trip: %+v %v", again, err)
	}
}

// SGLang's BlockStoredWithMetadata, in the array era, appends its
// metadata map {"cache_salt": ...} as the 8th element, where vLLM puts
// lora_name; in the map era it is a "metadata" key. Both carry the salt.
func TestSGLangStoredWithMetadata(t *testing.T) {
	arrayEra := "" +
		"93" + "cb41da4aa6e0200000" + "91" + // [ts, [event], ...
		"98" + // event array of 8
		"ab426c6f636b53746f726564" + // "BlockStored"
		"91" + "07" + // block_hashes [7]
		"c0" + // parent_block_hash nil
		"920102" + // token_ids [1, 2]
		"02" + // block_size 2
		"c0" + // lora_id nil
		"c0" + // medium nil
		"81" + "aa63616368655f73616c74" + "a573616c7431" + // {"cache_salt": "salt1"}
		"00" // attn_dp_rank 0
	mapEra := "" +
		"93" + "cb41da4aa6e0200000" + "91" +
		"86" + // map of 6
		"a474797065" + "ab426c6f636b53746f726564" +
		"ac626c6f636b5f686173686573" + "9107" +
		"b1706172656e745f626c6f636b5f68617368" + "c0" +
		"a9746f6b656e5f696473" + "920102" +
		"aa626c6f636b5f73697a65" + "02" +
		"a86d65746164617461" + "82" + "a17a" + "c3" + "aa63616368655f73616c74" + "a573616c7432" + // metadata: {"z": true, "cache_salt": "salt2"}
		"00"
	for _, tc := range []struct{ name, hex, salt string }{{"array", arrayEra, "salt1"}, {"map", mapEra, "salt2"}} {
		payload, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Decode(payload)
		if err != nil {
			t.Fatalf("%s era: %v", tc.name, err)
		}
		e := b.Events[0]
		if e.Kind != KindBlockStored || e.CacheSalt != tc.salt || e.LoRAName != "" || len(e.TokenIDs) != 2 || e.BlockSize != 2 {
			t.Fatalf("%s era: event %+v, want salt %q", tc.name, e, tc.salt)
		}
		ref, err := refDecode(payload)
		if err != nil || ref.Events[0].CacheSalt != tc.salt {
			t.Fatalf("%s era: reference decoder: %v, %+v", tc.name, err, ref)
		}
	}
}

// sglangCaptureFiles are testdata/sglang-*.json: messages captured from
// SGLang's own ZmqEventPublisher and msgspec structs (its kv_events.py, or
// event_publisher.py plus kv_events.py, at the commit each file names), run
// without a GPU under msgspec 0.19.0 against a ZMQ SUB bound on loopback;
// the publisher connected to it with its attn_dp_rank offsetting the port.
// Each run published the same four steps: a two-block store, a one-block
// store continuing it (with lora_id 7, medium CPU_PINNED where the struct
// has medium; in the cache-salt era a salted BlockStoredWithMetadata plus
// an offload store with empty tokens), two removals, and a clear.
// "decoded" is what msgspec decoded from each payload. The tagged-map form
// (SGLang PR #37482: map events carrying cache_salt and session_id) has no
// capture: its kv_events.py is not available to run, so it stays covered by
// the hand-written bytes above.
var sglangCaptureFiles = []string{
	"sglang-006d053.json", "sglang-612d579.json", "sglang-1b5a329.json", "sglang-cache-salt.json",
}

// SGLang's positional field names, written out here rather than taken from
// decode.go: its BlockStored is vLLM's first six fields, and a salted one
// (BlockStoredWithMetadata) appends a metadata map where vLLM has lora_name.
var (
	sglangStoredFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "metadata"}
	sglangRemovedFields = []string{"block_hashes", "medium"}
)

// sglangJSONBatch builds the Batch an SGLang envelope decoded by msgspec
// stands for, independently of the decoder.
func sglangJSONBatch(t *testing.T, v any) *Batch {
	t.Helper()
	env := v.([]any)
	b := &Batch{Timestamp: jsonFloat(t, env[0])}
	if len(env) > 2 && env[2] != nil {
		b.DPRank, b.HasDPRank = int(jsonInt(t, env[2])), true
	}
	for _, raw := range env[1].([]any) {
		x := raw.([]any)
		var e Event
		names := sglangStoredFields
		switch x[0] {
		case "BlockStored":
			e.Kind = KindBlockStored
		case "BlockRemoved":
			e.Kind, names = KindBlockRemoved, sglangRemovedFields
		case "AllBlocksCleared":
			e.Kind = KindAllBlocksCleared
		default:
			t.Fatalf("tag %v", x[0])
		}
		if len(x)-1 > len(names) {
			t.Fatalf("%v has %d fields, want at most %d", x[0], len(x)-1, len(names))
		}
		m := map[string]any{}
		for i, val := range x[1:] {
			m[names[i]] = val
		}
		for _, h := range jsonList(m["block_hashes"]) {
			e.BlockHashes = append(e.BlockHashes, jsonHash(t, h))
		}
		if p := m["parent_block_hash"]; p != nil {
			e.ParentHash, e.HasParent = jsonHash(t, p), true
		}
		for _, tok := range jsonList(m["token_ids"]) {
			e.TokenIDs = append(e.TokenIDs, uint32(jsonInt(t, tok)))
		}
		if v := m["block_size"]; v != nil {
			e.BlockSize = int(jsonInt(t, v))
		}
		if v := m["lora_id"]; v != nil {
			e.LoRAID, e.HasLoRAID = jsonInt(t, v), true
		}
		if v := m["medium"]; v != nil {
			e.MediumName = v.(string)
			e.Medium, _ = ParseMedium(e.MediumName)
		}
		if v := m["metadata"]; v != nil {
			e.CacheSalt = v.(map[string]any)["cache_salt"].(string)
		}
		b.Events = append(b.Events, e)
	}
	return b
}

// TestSGLangCaptures decodes every captured SGLang message with Decode, with
// one reused Decoder and Batch, and with the reference decoder, and checks
// each against what msgspec decoded and against values stated here.
func TestSGLangCaptures(t *testing.T) {
	// SGLang's hashes of the captured blocks: the first 8 bytes of a
	// SHA-256 digest as a signed int64, so two are negative.
	h1, h2, h3 := uint64(0xac5a4921d5409ee3), uint64(0xdcadce71eca0ede6), uint64(883940226286364205)
	type want struct {
		hasRank     bool
		rank        int
		fields      int    // fields after the tag in the first BlockStored
		storeMedium string // medium of the continuing store ("" for nil)
		salt        string // cache salt of the continuing store
	}
	wants := map[string]want{
		"sglang-006d053.json":    {fields: 5},
		"sglang-612d579.json":    {hasRank: true, rank: 1, fields: 5},
		"sglang-1b5a329.json":    {hasRank: true, rank: 0, fields: 6, storeMedium: "CPU_PINNED"},
		"sglang-cache-salt.json": {hasRank: true, rank: 2, fields: 6, salt: "tenant-a"},
	}
	d := NewDecoder()
	var reused Batch
	for _, name := range sglangCaptureFiles {
		w := wants[name]
		f := loadPayloadFixture(t, name)
		if len(f.Messages) != 4 {
			t.Fatalf("%s: %d messages, want 4", name, len(f.Messages))
		}
		for i, m := range f.Messages {
			t.Run(fmt.Sprintf("%s/seq%d", name, m.Seq), func(t *testing.T) {
				if m.Topic != "kv-events" || m.Seq != uint64(i) {
					t.Fatalf("topic %q seq %d, want kv-events seq %d", m.Topic, m.Seq, i)
				}
				payload := hexBytes(t, m.PayloadHex)
				decoded := parseJSON(t, m.Decoded)
				fromJSON := sglangJSONBatch(t, decoded)

				got, err := Decode(payload)
				if err != nil {
					t.Fatal(err)
				}
				if d := diffBatch(got, fromJSON); d != "" {
					t.Fatalf("Decode: %s", d)
				}
				if err := d.Decode(payload, &reused); err != nil {
					t.Fatal(err)
				}
				if d := diffBatch(&reused, fromJSON); d != "" {
					t.Fatalf("reused Decoder: %s", d)
				}
				ref, err := refDecode(payload)
				if err != nil {
					t.Fatal(err)
				}
				if d := diffBatch(ref, fromJSON); d != "" {
					t.Fatalf("refDecode: %s", d)
				}

				if got.HasDPRank != w.hasRank || got.DPRank != w.rank {
					t.Fatalf("DPRank %d (has %v), want %d (has %v)", got.DPRank, got.HasDPRank, w.rank, w.hasRank)
				}
				if ts := 1764400000.5 + 0.25*float64(i); got.Timestamp != ts {
					t.Fatalf("Timestamp %v, want %v", got.Timestamp, ts)
				}
				ev := decoded.([]any)[1].([]any)
				switch i {
				case 0:
					e := got.Events[0]
					if n := len(ev[0].([]any)) - 1; n != w.fields {
						t.Fatalf("BlockStored has %d fields, want %d", n, w.fields)
					}
					if len(got.Events) != 1 || e.Kind != KindBlockStored || fmt.Sprint(e.BlockHashes) != fmt.Sprint([]uint64{h1, h2}) ||
						e.HasParent || e.BlockSize != 4 || len(e.TokenIDs) != 8 || e.TokenIDs[0] != 100 || e.TokenIDs[7] != 107 ||
						e.HasLoRAID || e.Medium != MediumGPU || e.MediumName != "" || e.CacheSalt != "" {
						t.Fatalf("first store %+v", e)
					}
				case 1:
					e := got.Events[0]
					if e.Kind != KindBlockStored || len(e.BlockHashes) != 1 || e.BlockHashes[0] != h3 || !e.HasParent || e.ParentHash != h2 ||
						fmt.Sprint(e.TokenIDs) != "[108 109 110 111]" || e.MediumName != w.storeMedium || e.CacheSalt != w.salt || e.LoRAName != "" {
						t.Fatalf("continuing store %+v", e)
					}
					if w.salt == "" && (!e.HasLoRAID || e.LoRAID != 7) {
						t.Fatalf("continuing store lora_id %d (has %v), want 7", e.LoRAID, e.HasLoRAID)
					}
					if w.salt != "" {
						o := got.Events[1]
						if len(got.Events) != 2 || o.BlockHashes[0] != h3 || len(o.TokenIDs) != 0 || o.BlockSize != 0 ||
							o.Medium != MediumCPU || o.MediumName != "CPU_PINNED" || o.CacheSalt != "" {
							t.Fatalf("offload store %+v", o)
						}
					}
				case 2:
					r, r2 := got.Events[0], got.Events[1]
					if len(got.Events) != 2 || r.Kind != KindBlockRemoved || r.BlockHashes[0] != h3 || r2.BlockHashes[0] != h1 ||
						r2.Medium != MediumGPU || r2.MediumName != "" {
						t.Fatalf("removals %+v", got.Events)
					}
					if w.fields == 6 && (r.Medium != MediumCPU || r.MediumName != "CPU_PINNED") {
						t.Fatalf("removal medium %v %q, want CPU_PINNED", r.Medium, r.MediumName)
					}
				case 3:
					if len(got.Events) != 1 || got.Events[0].Kind != KindAllBlocksCleared {
						t.Fatalf("clear %+v", got.Events)
					}
				}
			})
		}
	}
}

// TestSGLangEpochTopicCapture reads testdata/sglang-snapshot-epoch.json,
// captured from SGLang's snapshot-capable publisher: a store, a snapshot
// barrier and a removal, all under one epoch-suffixed topic. SplitTopic
// must recover the configured topic, the epoch and the barrier flag, and
// every payload, the barrier's empty batch included, must decode.
func TestSGLangEpochTopicCapture(t *testing.T) {
	f := loadPayloadFixture(t, "sglang-snapshot-epoch.json")
	if len(f.Messages) != 3 {
		t.Fatalf("%d messages, want 3", len(f.Messages))
	}
	var epoch0 string
	for i, m := range f.Messages {
		base, epoch, barrier := SplitTopic([]byte(m.Topic))
		if string(base) != "kv-events" || len(epoch) != 32 || barrier != (i == 1) || m.Seq != uint64(i) {
			t.Fatalf("message %d: topic %q -> base %q epoch %q barrier %v, seq %d", i, m.Topic, base, epoch, barrier, m.Seq)
		}
		if i == 0 {
			epoch0 = string(epoch)
		} else if string(epoch) != epoch0 {
			t.Fatalf("message %d: epoch %q, want %q", i, epoch, epoch0)
		}
		payload := hexBytes(t, m.PayloadHex)
		want := sglangJSONBatch(t, parseJSON(t, m.Decoded))
		got, err := Decode(payload)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if d := diffBatch(got, want); d != "" {
			t.Fatalf("message %d: %s", i, d)
		}
		ref, err := refDecode(payload)
		if err != nil {
			t.Fatalf("message %d: reference decoder: %v", i, err)
		}
		if d := diffBatch(ref, want); d != "" {
			t.Fatalf("message %d: reference decoder: %s", i, d)
		}
		if !got.HasDPRank || got.DPRank != 0 {
			t.Fatalf("message %d: DPRank %d (has %v), want 0", i, got.DPRank, got.HasDPRank)
		}
		switch i {
		case 0:
			if len(got.Events) != 1 || got.Events[0].Kind != KindBlockStored || got.Events[0].BlockHashes[1] != 0xdcadce71eca0ede6 {
				t.Fatalf("store %+v", got.Events)
			}
		case 1:
			if len(got.Events) != 0 {
				t.Fatalf("barrier carries %d events, want none", len(got.Events))
			}
		case 2:
			if len(got.Events) != 1 || got.Events[0].Kind != KindBlockRemoved || got.Events[0].MediumName != "GPU" {
				t.Fatalf("removal %+v", got.Events)
			}
		}
	}
}
