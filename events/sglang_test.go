package events

import (
	"encoding/hex"
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
