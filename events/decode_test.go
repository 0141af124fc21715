package events

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// payloadFixture is one of testdata/*.json: payloads captured from vLLM's own
// publisher with the values msgspec decoded from them.
type payloadFixture struct {
	Messages []struct {
		Topic      string          `json:"topic"`
		Seq        uint64          `json:"seq"`
		PayloadHex string          `json:"payload_hex"`
		Decoded    json.RawMessage `json:"decoded"`
	} `json:"messages"`
	Replay *struct {
		Replies [][]string `json:"replies"`
	} `json:"replay_dealer_reply_frames_hex"`
}

var payloadFixtureFiles = []string{"array-era.json", "current-main.json"}

func loadPayloadFixture(t testing.TB, name string) payloadFixture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var f payloadFixture
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(f.Messages) == 0 {
		t.Fatalf("%s: no messages", name)
	}
	return f
}

func hexBytes(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hx decodes hand-written hex: whitespace and the brackets []{} are
// ignored, and '#' starts a comment that runs to the end of the line.
func hx(s string) []byte {
	var sb strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		sb.WriteString(strings.Map(func(r rune) rune {
			if strings.ContainsRune(" \t[]{}", r) {
				return -1
			}
			return r
		}, line))
	}
	b, err := hex.DecodeString(sb.String())
	if err != nil {
		panic(fmt.Sprintf("bad test hex %q: %v", sb.String(), err))
	}
	return b
}

// parseJSON decodes a fixture's "decoded" value keeping numbers exact.
func parseJSON(t testing.TB, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The positional field names of the array era, written out here rather than
// taken from decode.go so that the test does not trust the decoder's tables.
var (
	jsonStoredFields = []string{
		"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window",
	}
	jsonRemovedFields = []string{"block_hashes", "medium", "group_idx"}
)

// jsonBatch builds the Batch that a msgspec-decoded envelope stands for,
// independently of the decoder.
func jsonBatch(t testing.TB, v any) *Batch {
	t.Helper()
	env, ok := v.([]any)
	if !ok || len(env) < 2 {
		t.Fatalf("decoded: want an envelope array, got %v", v)
	}
	b := &Batch{Timestamp: jsonFloat(t, env[0])}
	for _, ev := range env[1].([]any) {
		b.Events = append(b.Events, jsonEvent(t, ev))
	}
	if len(env) > 2 && env[2] != nil {
		b.DPRank, b.HasDPRank = int(jsonInt(t, env[2])), true
	}
	return b
}

func jsonEvent(t testing.TB, v any) Event {
	t.Helper()
	m := map[string]any{}
	switch x := v.(type) {
	case map[string]any:
		m = x
	case []any:
		m["type"] = x[0]
		var names []string
		switch x[0] {
		case "BlockStored":
			names = jsonStoredFields
		case "BlockRemoved":
			names = jsonRemovedFields
		}
		for i, val := range x[1:] {
			m[names[i]] = val
		}
	default:
		t.Fatalf("event: %v", v)
	}
	var e Event
	switch m["type"] {
	case "BlockStored":
		e.Kind = KindBlockStored
	case "BlockRemoved":
		e.Kind = KindBlockRemoved
	case "AllBlocksCleared":
		e.Kind = KindAllBlocksCleared
	default:
		t.Fatalf("tag %v", m["type"])
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
	if v := m["lora_name"]; v != nil {
		e.LoRAName = v.(string)
	}
	if v := m["extra_keys"]; v != nil {
		e.ExtraKeys = []ExtraKeys{}
		for _, k := range v.([]any) {
			if k == nil {
				e.ExtraKeys = append(e.ExtraKeys, nil)
				continue
			}
			e.ExtraKeys = append(e.ExtraKeys, jsonExtra(t, nil, k))
		}
	}
	if v := m["group_idx"]; v != nil {
		e.GroupIdx, e.HasGroupIdx = int(jsonInt(t, v)), true
	}
	if v := m["kv_cache_spec_kind"]; v != nil {
		e.SpecKind = v.(string)
	}
	if v := m["kv_cache_spec_sliding_window"]; v != nil {
		e.SlidingWindow, e.HasSlidingWindow = int(jsonInt(t, v)), true
	}
	if v := m["locality"]; v != nil {
		// A remote block is held as EXTERNAL whatever its medium's name.
		if e.Locality, _ = ParseLocality(v.(string)); e.Locality == LocalityRemote {
			e.Medium = MediumExternal
		}
	}
	return e
}

func jsonList(v any) []any {
	l, _ := v.([]any)
	return l
}

func jsonHash(t testing.TB, v any) uint64 {
	t.Helper()
	s := string(v.(json.Number))
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("hash %s: %v", s, err)
	}
	return uint64(i)
}

func jsonInt(t testing.TB, v any) int64 {
	t.Helper()
	i, err := v.(json.Number).Int64()
	if err != nil {
		t.Fatalf("int %v: %v", v, err)
	}
	return i
}

func jsonFloat(t testing.TB, v any) float64 {
	t.Helper()
	f, err := v.(json.Number).Float64()
	if err != nil {
		t.Fatalf("float %v: %v", v, err)
	}
	return f
}

// jsonExtra appends the canonical form of a JSON value from extra_keys.
func jsonExtra(t testing.TB, dst []byte, v any) []byte {
	t.Helper()
	switch x := v.(type) {
	case nil:
		return AppendNone(dst)
	case bool:
		return AppendBool(dst, x)
	case string:
		return AppendString(dst, x)
	case json.Number:
		s := string(x)
		if strings.ContainsAny(s, ".eE") {
			return AppendFloat(dst, jsonFloat(t, x))
		}
		if strings.HasPrefix(s, "-") {
			return AppendInt(dst, jsonInt(t, x))
		}
		u, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return AppendUint(dst, u)
	case []any:
		dst = AppendTuple(dst, len(x))
		for _, e := range x {
			dst = jsonExtra(t, dst, e)
		}
		return dst
	}
	t.Fatalf("extra key value %T", v)
	return nil
}

// pyLiteral renders a JSON extra_keys entry the way ExtraKeys.String renders
// the decoded one: lists become tuples.
func pyLiteral(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case string:
		return strconv.Quote(x)
	case json.Number:
		return string(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyLiteral(e)
		}
		if len(x) == 1 {
			return "(" + parts[0] + ",)"
		}
		return "(" + strings.Join(parts, ", ") + ")"
	}
	return fmt.Sprintf("<%T>", v)
}

// diffBatch returns the first difference between two batches, or "". Empty
// and nil BlockHashes/TokenIDs are equal; ExtraKeys nil-ness matters.
func diffBatch(got, want *Batch) string {
	if math.Float64bits(got.Timestamp) != math.Float64bits(want.Timestamp) {
		return fmt.Sprintf("Timestamp = %v, want %v", got.Timestamp, want.Timestamp)
	}
	if got.HasDPRank != want.HasDPRank || got.DPRank != want.DPRank {
		return fmt.Sprintf("DPRank = %d (has %v), want %d (has %v)", got.DPRank, got.HasDPRank, want.DPRank, want.HasDPRank)
	}
	if got.UnknownEvents != want.UnknownEvents || got.UnknownTag != want.UnknownTag {
		return fmt.Sprintf("UnknownEvents = %d (last %q), want %d (last %q)", got.UnknownEvents, got.UnknownTag, want.UnknownEvents, want.UnknownTag)
	}
	if len(got.Events) != len(want.Events) {
		return fmt.Sprintf("%d events, want %d", len(got.Events), len(want.Events))
	}
	for i := range got.Events {
		if d := diffEvent(&got.Events[i], &want.Events[i]); d != "" {
			return fmt.Sprintf("event %d (%s): %s", i, want.Events[i].Kind, d)
		}
	}
	return ""
}

func diffEvent(g, w *Event) string {
	switch {
	case g.Kind != w.Kind:
		return fmt.Sprintf("Kind = %v, want %v", g.Kind, w.Kind)
	case fmt.Sprint(g.BlockHashes) != fmt.Sprint(w.BlockHashes):
		return fmt.Sprintf("BlockHashes = %v, want %v", g.BlockHashes, w.BlockHashes)
	case g.HasParent != w.HasParent || g.ParentHash != w.ParentHash:
		return fmt.Sprintf("ParentHash = %d (has %v), want %d (has %v)", g.ParentHash, g.HasParent, w.ParentHash, w.HasParent)
	case fmt.Sprint(g.TokenIDs) != fmt.Sprint(w.TokenIDs):
		return fmt.Sprintf("TokenIDs = %v, want %v", g.TokenIDs, w.TokenIDs)
	case g.BlockSize != w.BlockSize:
		return fmt.Sprintf("BlockSize = %d, want %d", g.BlockSize, w.BlockSize)
	case g.HasLoRAID != w.HasLoRAID || g.LoRAID != w.LoRAID:
		return fmt.Sprintf("LoRAID = %d (has %v), want %d (has %v)", g.LoRAID, g.HasLoRAID, w.LoRAID, w.HasLoRAID)
	case g.Medium != w.Medium || g.MediumName != w.MediumName:
		return fmt.Sprintf("Medium = %v %q, want %v %q", g.Medium, g.MediumName, w.Medium, w.MediumName)
	case g.Locality != w.Locality:
		return fmt.Sprintf("Locality = %v, want %v", g.Locality, w.Locality)
	case g.LoRAName != w.LoRAName:
		return fmt.Sprintf("LoRAName = %q, want %q", g.LoRAName, w.LoRAName)
	case (g.ExtraKeys == nil) != (w.ExtraKeys == nil) || len(g.ExtraKeys) != len(w.ExtraKeys):
		return fmt.Sprintf("ExtraKeys = %v, want %v", g.ExtraKeys, w.ExtraKeys)
	case g.HasGroupIdx != w.HasGroupIdx || g.GroupIdx != w.GroupIdx:
		return fmt.Sprintf("GroupIdx = %d (has %v), want %d (has %v)", g.GroupIdx, g.HasGroupIdx, w.GroupIdx, w.HasGroupIdx)
	case g.SpecKind != w.SpecKind:
		return fmt.Sprintf("SpecKind = %q, want %q", g.SpecKind, w.SpecKind)
	case g.HasSlidingWindow != w.HasSlidingWindow || g.SlidingWindow != w.SlidingWindow:
		return fmt.Sprintf("SlidingWindow = %d (has %v), want %d (has %v)", g.SlidingWindow, g.HasSlidingWindow, w.SlidingWindow, w.HasSlidingWindow)
	case g.CacheSalt != w.CacheSalt:
		return fmt.Sprintf("CacheSalt = %q, want %q", g.CacheSalt, w.CacheSalt)
	}
	for j := range g.ExtraKeys {
		if (g.ExtraKeys[j] == nil) != (w.ExtraKeys[j] == nil) || !bytes.Equal(g.ExtraKeys[j], w.ExtraKeys[j]) {
			return fmt.Sprintf("ExtraKeys[%d] = %v, want %v", j, g.ExtraKeys[j], w.ExtraKeys[j])
		}
	}
	return ""
}

// checkExtraKeysJSON compares decoded extra keys with the fixture's JSON
// through ExtraKeys.String and ExtraKeys.Values.
func checkExtraKeysJSON(t *testing.T, ev any, got []ExtraKeys) {
	t.Helper()
	var raw any
	switch x := ev.(type) {
	case map[string]any:
		raw = x["extra_keys"]
	case []any:
		if x[0] == "BlockStored" && len(x) > 8 {
			raw = x[8]
		}
	}
	if raw == nil {
		if got != nil {
			t.Errorf("ExtraKeys = %v, want nil", got)
		}
		return
	}
	list := raw.([]any)
	if len(got) != len(list) {
		t.Fatalf("len(ExtraKeys) = %d, want %d", len(got), len(list))
	}
	for i, want := range list {
		if s := got[i].String(); s != pyLiteral(want) {
			t.Errorf("ExtraKeys[%d] = %s, want %s", i, s, pyLiteral(want))
		}
		vals, err := got[i].Values()
		if err != nil {
			t.Errorf("ExtraKeys[%d].Values: %v", i, err)
		}
		if want == nil {
			if vals != nil {
				t.Errorf("ExtraKeys[%d].Values = %v, want nil", i, vals)
			}
			continue
		}
		if g, w := fmt.Sprint(vals), fmt.Sprint(want); g != w {
			t.Errorf("ExtraKeys[%d].Values = %s, want %s", i, g, w)
		}
	}
}

func TestDecodeFixtures(t *testing.T) {
	d := NewDecoder()
	var reused Batch
	for _, name := range payloadFixtureFiles {
		f := loadPayloadFixture(t, name)
		for _, m := range f.Messages {
			t.Run(fmt.Sprintf("%s/seq%d", name, m.Seq), func(t *testing.T) {
				payload := hexBytes(t, m.PayloadHex)
				decoded := parseJSON(t, m.Decoded)
				want := jsonBatch(t, decoded)

				got, err := Decode(payload)
				if err != nil {
					t.Fatal(err)
				}
				if d := diffBatch(got, want); d != "" {
					t.Fatal(d)
				}
				for i, ev := range decoded.([]any)[1].([]any) {
					checkExtraKeysJSON(t, ev, got.Events[i].ExtraKeys)
				}
				// The same through a reused Decoder and Batch.
				if err := d.Decode(payload, &reused); err != nil {
					t.Fatal(err)
				}
				if d := diffBatch(&reused, want); d != "" {
					t.Fatalf("reused: %s", d)
				}
			})
		}
	}
}

func TestDecodeFixtureDetails(t *testing.T) {
	// Spot checks written out by hand, so that a bug shared by jsonBatch and
	// the decoder cannot hide.
	for _, name := range payloadFixtureFiles {
		f := loadPayloadFixture(t, name)
		b, err := Decode(hexBytes(t, f.Messages[1].PayloadHex))
		if err != nil {
			t.Fatal(err)
		}
		e := b.Events[0]
		if b.Timestamp != 1764400000.75 || !b.HasDPRank || b.DPRank != 0 || len(b.Events) != 1 ||
			e.Kind != KindBlockStored || len(e.BlockHashes) != 1 || e.BlockHashes[0] != 14597225573604971310 ||
			!e.HasParent || e.ParentHash != 10046384494910993043 || len(e.TokenIDs) != 16 ||
			e.TokenIDs[0] != 132 || e.TokenIDs[15] != 147 || e.BlockSize != 16 ||
			!e.HasLoRAID || e.LoRAID != 1 || e.Medium != MediumGPU || e.MediumName != "GPU" ||
			e.LoRAName != "my-lora" || len(e.ExtraKeys) != 1 || e.ExtraKeys[0].String() != `("my-lora",)` ||
			!e.HasGroupIdx || e.GroupIdx != 1 || e.SpecKind != "sliding_window" ||
			!e.HasSlidingWindow || e.SlidingWindow != 4096 {
			t.Errorf("%s seq 1: %+v", name, b)
		}
		b, err = Decode(hexBytes(t, f.Messages[2].PayloadHex))
		if err != nil {
			t.Fatal(err)
		}
		r0, r1 := b.Events[0], b.Events[1]
		if r0.Kind != KindBlockRemoved || r0.BlockHashes[0] != 14597225573604971310 || r0.MediumName != "GPU" ||
			!r0.HasGroupIdx || r0.GroupIdx != 1 ||
			r1.Kind != KindBlockRemoved || r1.BlockHashes[0] != 11861665817516400925 || r1.Medium != MediumCPU ||
			r1.HasGroupIdx {
			t.Errorf("%s seq 2: %+v", name, b)
		}
	}
}

func TestDecodeReplayFrames(t *testing.T) {
	f := loadPayloadFixture(t, "current-main.json")
	if f.Replay == nil || len(f.Replay.Replies) == 0 {
		t.Fatal("no replay replies in fixture")
	}
	bySeq := map[uint64]string{}
	for _, m := range f.Messages {
		bySeq[m.Seq] = string(m.Decoded)
	}
	n := 0
	for i, frames := range f.Replay.Replies {
		if len(frames) != 4 {
			t.Fatalf("reply %d: %d frames, want 4", i, len(frames))
		}
		payload := hexBytes(t, frames[3])
		if len(payload) == 0 {
			// The end-of-replay marker carries no payload.
			if _, err := Decode(payload); !errors.Is(err, ErrMalformed) {
				t.Errorf("end marker: Decode(empty) = %v, want ErrMalformed", err)
			}
			continue
		}
		seqBytes := hexBytes(t, frames[2])
		var seq uint64
		for _, c := range seqBytes {
			seq = seq<<8 | uint64(c)
		}
		got, err := Decode(payload)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		want := jsonBatch(t, parseJSON(t, []byte(bySeq[seq])))
		if d := diffBatch(got, want); d != "" {
			t.Errorf("reply %d (seq %d): %s", i, seq, d)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no replay payloads decoded")
	}
}

func ekTuple(vals ...func([]byte) []byte) ExtraKeys {
	b := AppendTuple(nil, len(vals))
	for _, v := range vals {
		b = v(b)
	}
	return b
}

func ekStr(s string) func([]byte) []byte { return func(b []byte) []byte { return AppendString(b, s) } }
func ekInt(i int64) func([]byte) []byte  { return func(b []byte) []byte { return AppendInt(b, i) } }
func ekSub(vals ...func([]byte) []byte) func([]byte) []byte {
	return func(b []byte) []byte { return append(b, ekTuple(vals...)...) }
}

// specExtra is the spec's ("my-lora", ("mm-uuid-A", 0)).
var specExtra = ekTuple(ekStr("my-lora"), ekSub(ekStr("mm-uuid-A"), ekInt(0)))

// specVectors are payloads written by hand from the spec, not by the
// encoder, with the batch each stands for.
var specVectors = []struct {
	name string
	hex  string
	want Batch
}{
	{
		name: "v0.9 2-element envelope, 5-field BlockStored, 1-field BlockRemoved, int64 hashes",
		hex: `
			92 cb 41da4aa6e0200000             # [ts 1764400000.5,
			93                                 #  [
			96 ab 426c6f636b53746f726564       #   ["BlockStored",
			   92 d3 a49d1a371975611d ff       #    [int64 -6585078256193150691, -1],
			   c0                              #    parent nil
			   94 01 02 03 04                  #    tokens [1, 2, 3, 4]
			   02                              #    block_size 2
			   c0                              #    lora_id nil]
			92 ac 426c6f636b52656d6f766564     #   ["BlockRemoved",
			   91 d0 85                        #    [-123]]
			91 b0 416c6c426c6f636b73436c6561726564  # ["AllBlocksCleared"]]]`,
		want: Batch{Timestamp: 1764400000.5, Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{0xa49d1a371975611d, math.MaxUint64},
				TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},
			{Kind: KindBlockRemoved, BlockHashes: []uint64{uint64(1<<64 - 123)}},
			{Kind: KindAllBlocksCleared},
		}},
	},
	{
		name: "6-field BlockStored with cpu, 2-field BlockRemoved with CPU_PINNED, nil rank, extra envelope element",
		hex: `
			94 cb 4004000000000000 92          # [ts 2.5, [
			97 ab 426c6f636b53746f726564       #   ["BlockStored",
			   91 cf ffffffffffffffff          #    [2^64-1],
			   cd 1234                         #    parent 0x1234
			   90 00 c0                        #    tokens [], block_size 0, lora_id nil
			   a3 637075                       #    medium "cpu"]
			93 ac 426c6f636b52656d6f766564     #   ["BlockRemoved",
			   91 01 aa 4350555f50494e4e4544   #    [1], "CPU_PINNED"]]
			c0                                 #  rank nil
			a1 78]                             #  an element newer releases might add`,
		want: Batch{Timestamp: 2.5, Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{math.MaxUint64}, ParentHash: 0x1234, HasParent: true,
				Medium: MediumCPU, MediumName: "cpu"},
			{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, Medium: MediumCPU, MediumName: "CPU_PINNED"},
		}},
	},
	{
		name: "9-field BlockStored with an unknown medium, lora and the spec's extra keys",
		hex: `
			93 cb 4004000000000000 91
			9a ab 426c6f636b53746f726564       # ["BlockStored",
			   91 2a c0 92 05 06 01            #  [42], nil, [5, 6], 1,
			   07                              #  lora_id 7
			   a4 54415045                     #  medium "TAPE"
			   a7 6d792d6c6f7261               #  lora_name "my-lora"
			   91 92 a7 6d792d6c6f7261         #  extra_keys [("my-lora",
			         92 a9 6d6d2d757569642d41 00   #   ("mm-uuid-A", 0))]
			   03]                             #  group_idx 3
			05                                 # rank 5`,
		want: Batch{Timestamp: 2.5, HasDPRank: true, DPRank: 5, Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{42}, TokenIDs: []uint32{5, 6}, BlockSize: 1,
				LoRAID: 7, HasLoRAID: true, Medium: MediumOther, MediumName: "TAPE", LoRAName: "my-lora",
				ExtraKeys: []ExtraKeys{specExtra}, GroupIdx: 3, HasGroupIdx: true},
		}},
	},
	{
		name: "11 fields plus trailing fields, every integer width, float32 ts",
		hex: `
			93 ca 40200000 93                  # [ts float32 2.5, [
			9e ab 426c6f636b53746f726564       #   ["BlockStored" + 13 fields:
			   92 cc ff d2 ffffffff            #    [255, int32 -1],
			   d1 fffe                         #    parent int16 -2
			   98 cc 80 cd 0100 ce 00010000 cf 0000000000000005
			      d0 05 d1 0006 d2 00000007 d3 0000000000000008   # tokens
			   d0 10                           #    block_size int8 16
			   d3 8000000000000000             #    lora_id MinInt64
			   c0 c0 c0                        #    medium, lora_name, extra_keys nil
			   cd 0100                         #    group_idx 256
			   ae 66756c6c5f617474656e74696f6e #    "full_attention"
			   d1 ff00                         #    window -256
			   a3 616263 c3                    #    "abc", true: later fields, ignored]
			95 ac 426c6f636b52656d6f766564 90 c0 c0 c0   # ["BlockRemoved", [], nil, nil, nil]
			92 b0 416c6c426c6f636b73436c6561726564 c0]   # ["AllBlocksCleared", nil]
			cd 0100                            #  rank 256`,
		want: Batch{Timestamp: 2.5, HasDPRank: true, DPRank: 256, Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{255, math.MaxUint64}, ParentHash: math.MaxUint64 - 1,
				HasParent: true, TokenIDs: []uint32{128, 256, 65536, 5, 5, 6, 7, 8}, BlockSize: 16,
				LoRAID: math.MinInt64, HasLoRAID: true, GroupIdx: 256, HasGroupIdx: true,
				SpecKind: "full_attention", SlidingWindow: -256, HasSlidingWindow: true},
			{Kind: KindBlockRemoved},
			{Kind: KindAllBlocksCleared},
		}},
	},
	{
		name: "map envelope, shuffled map event with unknown keys and bin hashes",
		hex: `
			83 a6 6576656e7473 91              # {"events": [
			8a                                 #  {10 pairs:
			   a9 746f6b656e5f696473 92 05 06  #   "token_ids": [5, 6]
			   a8 6c6f63616c697479 a5 4c4f43414c   # "locality": "LOCAL"
			   ac 626c6f636b5f686173686573 91  #   "block_hashes": [
			      c4 20 000102030405060708090a0b0c0d0e0f1011121314151617 0102030405060708  # bin32]
			   a4 74797065 ab 426c6f636b53746f726564   # "type": "BlockStored"
			   aa 73657373696f6e5f6964 a3 616263       # "session_id": "abc"
			   aa 626c6f636b5f73697a65 02              # "block_size": 2
			   b1 706172656e745f626c6f636b5f68617368   # "parent_block_hash":
			      c4 0c aaaaaaaa 1122334455667788      #   bin12
			   a6 6d656469756d c0                      # "medium": nil
			   aa 65787472615f6b657973 91 92 a7 6d792d6c6f7261 92 a9 6d6d2d757569642d41 00  # extra_keys
			   bc 6b765f63616368655f737065635f736c6964696e675f77696e646f77 cd 1000  # window 4096}]
			a2 7473 cb 41da4aa6e0200000        #  "ts": 1764400000.5
			b2 646174615f706172616c6c656c5f72616e6b 01  # "data_parallel_rank": 1}`,
		want: Batch{Timestamp: 1764400000.5, HasDPRank: true, DPRank: 1, Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{0x0102030405060708}, ParentHash: 0x1122334455667788,
				HasParent: true, TokenIDs: []uint32{5, 6}, BlockSize: 2, ExtraKeys: []ExtraKeys{specExtra},
				SlidingWindow: 4096, HasSlidingWindow: true},
		}},
	},
	{
		name: "map events: type not first, keys of other kinds skipped, unknown envelope key",
		hex: `
			84 a2 7473 cb 4004000000000000     # {"ts": 2.5,
			   a3 616263 91 91 91 c0           #  "abc": [[[nil]]] (unknown)
			   a6 6576656e7473 92              #  "events": [
			85 a6 6d656469756d a4 54415045     #   {"medium": "TAPE",
			   a8 6c6f63616c697479 a6 52454d4f5445  # "locality": "REMOTE",
			   a9 746f6b656e5f696473 a3 7a7a7a #    "token_ids": "zzz" (not a BlockRemoved key),
			   a4 74797065 ac 426c6f636b52656d6f766564   # "type": "BlockRemoved",
			   ac 626c6f636b5f686173686573 92 d3 8000000000000000 7f}  # "block_hashes": [MinInt64, 127]
			82 a4 74797065 b0 416c6c426c6f636b73436c6561726564   # {"type": "AllBlocksCleared",
			   a8 6c6f63616c697479 a5 4c4f43414c]                  #  "locality": "LOCAL"}]
			b2 646174615f706172616c6c656c5f72616e6b c0           # "data_parallel_rank": nil}`,
		want: Batch{Timestamp: 2.5, Events: []Event{
			{Kind: KindBlockRemoved, BlockHashes: []uint64{1 << 63, 127}, Medium: MediumExternal, MediumName: "TAPE",
				Locality: LocalityRemote},
			{Kind: KindAllBlocksCleared},
		}},
	},
	{
		name: "map BlockStored with only a type: missing keys are nil",
		hex: `
			93 cb 4004000000000000 91 81 a4 74797065 ab 426c6f636b53746f726564 00`,
		want: Batch{Timestamp: 2.5, HasDPRank: true, Events: []Event{{Kind: KindBlockStored}}},
	},
	{
		name: "extra keys of every value type, nil entries, medium GPU lower case",
		hex: `
			93 cb 4004000000000000 91
			99 ab 426c6f636b53746f726564 92 01 02 c0 90 10 c0 a3 677075 c0  # 8 fields, medium "gpu"
			   92 c0                           # extra_keys [nil,
			   9a a1 73 c4 02 6869 ff cf ffffffffffffffff cb 3ff8000000000000 ca 3fc00000 c2 c3 c0 92 90 91 00
			                                   #   ("s", b"hi", -1, 2^64-1, 1.5, f32 1.5, False, True, None, ((), (0,)))]
			c0`,
		want: Batch{Timestamp: 2.5, Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{1, 2}, BlockSize: 16, Medium: MediumGPU, MediumName: "gpu",
				ExtraKeys: []ExtraKeys{nil, func() ExtraKeys {
					b := AppendTuple(nil, 10)
					b = AppendString(b, "s")
					b = AppendBytes(b, []byte("hi"))
					b = AppendInt(b, -1)
					b = AppendUint(b, math.MaxUint64)
					b = AppendFloat(b, 1.5)
					b = AppendFloat(b, 1.5)
					b = AppendBool(b, false)
					b = AppendBool(b, true)
					b = AppendNone(b)
					b = AppendTuple(b, 2)
					b = AppendTuple(b, 0)
					b = AppendTuple(b, 1)
					return AppendInt(b, 0)
				}()}},
		}},
	},
}

func TestDecodeSpecVectors(t *testing.T) {
	d := NewDecoder()
	var reused Batch
	for _, v := range specVectors {
		t.Run(v.name, func(t *testing.T) {
			got, err := Decode(hx(v.hex))
			if err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(got, &v.want); d != "" {
				t.Fatal(d)
			}
			if err := d.Decode(hx(v.hex), &reused); err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(&reused, &v.want); d != "" {
				t.Fatalf("reused: %s", d)
			}
		})
	}
}

func TestDecodeSpecExtraKeysString(t *testing.T) {
	b, err := Decode(hx(specVectors[2].hex))
	if err != nil {
		t.Fatal(err)
	}
	if s := b.Events[0].ExtraKeys[0].String(); s != `("my-lora", ("mm-uuid-A", 0))` {
		t.Errorf("String() = %s", s)
	}
	vals, err := b.Events[0].ExtraKeys[0].Values()
	if err != nil || fmt.Sprintf("%#v", vals) != `[]interface {}{"my-lora", []interface {}{"mm-uuid-A", 0}}` {
		t.Errorf("Values() = %#v, %v", vals, err)
	}
}

func TestDecodeMedium(t *testing.T) {
	for _, tc := range []struct {
		hex  string // the medium value
		name string
		m    Medium
	}{
		{"c0", "", MediumGPU},
		{"a3475055", "GPU", MediumGPU},
		{"a3637075", "cpu", MediumCPU},
		{"a3435055", "CPU", MediumCPU},
		{"aa4350555f50494e4e4544", "CPU_PINNED", MediumCPU},
		{"a753544f52414745", "STORAGE", MediumStorage},
		{"a44449534b", "DISK", MediumDisk},
		{"a845585445524e414c", "EXTERNAL", MediumExternal},
		{"a44e564d45", "NVME", MediumDisk},
		{"a454415045", "TAPE", MediumOther},
		{"a0", "", MediumGPU},
	} {
		for _, form := range []string{
			"93 cb 4004000000000000 91 93 ac426c6f636b52656d6f766564 91 01 %s c0",
			"93 cb 4004000000000000 91 83 a474797065 ac426c6f636b52656d6f766564 a66d656469756d %s ac626c6f636b5f686173686573 91 01 c0",
		} {
			b, err := Decode(hx(fmt.Sprintf(form, tc.hex)))
			if err != nil {
				t.Fatalf("%s: %v", tc.hex, err)
			}
			if e := b.Events[0]; e.Medium != tc.m || e.MediumName != tc.name || e.BlockHashes[0] != 1 {
				t.Errorf("%s: Medium %v %q, want %v %q", tc.hex, e.Medium, e.MediumName, tc.m, tc.name)
			}
		}
	}
}

func TestInternMediumAgreesWithParseMedium(t *testing.T) {
	// internMedium short-cuts ParseMedium for the names engines send; the
	// two must never disagree.
	names := []string{"gpu", "Disk", "TAPE", "", "OTHER"}
	for m := range Medium(NumMedia) {
		names = append(names, m.String())
	}
	for _, a := range mediumAliases {
		names = append(names, a.name)
	}
	for _, name := range names {
		gotName, got := internMedium([]byte(name))
		want, _ := ParseMedium(name)
		if gotName != name || got != want {
			t.Errorf("internMedium(%q) = %q, %v; want %q, %v", name, gotName, got, name, want)
		}
	}
}

// nestedArrays returns n nested single-element arrays around inner.
func nestedArrays(n int, inner string) string {
	return strings.Repeat("91", n) + inner
}

// roomForOneEvent is an envelope element that makes room for one event, so that short
// broken events get past the check that the events can fit.
const roomForOneEvent = "ad 00000000000000000000000000"

// malformedVectors are payloads the decoder must reject, with a part of the message
// that says what was wrong.
var malformedVectors = []struct {
	name, hex, want string
}{
	{"empty", "", "empty payload"},
	{"envelope str", "a3616263", "envelope: want envelope array or map, got str (0xa3) at offset 0"},
	{"envelope int", "05", "want envelope array or map, got int"},
	{"envelope one element", "91 cb 4004000000000000", "envelope is an array of 1 elements, want at least 2"},
	{"ts str", "92 a178 90", "envelope field ts: want float, got str"},
	{"ts nil", "92 c0 90", "envelope field ts: want float, got nil"},
	{"events map", "92 00 80", "envelope field events: want array of events, got map"},
	{"events nil", "93 00 c0 c0", "envelope field events: want array of events, got nil"},
	{"rank str", "93 00 90 a178", "envelope field data_parallel_rank: want integer, got str"},
	{"rank too big", "93 00 90 cf ffffffffffffffff", "data_parallel_rank: integer 18446744073709551615 out of range"},
	{"trailing bytes", "93 00 90 00 00", "1 trailing bytes after the envelope at offset 4"},
	{"map envelope without events", "81 a27473 00", `envelope map has no "events" key`},
	{"map envelope without ts", "81 a66576656e7473 90", `envelope map has no "ts" key`},
	{"map envelope int key", "82 01 02 a27473 00", "envelope field (key)[0]: want str, got int"},
	{"map envelope bad unknown value", "82 a27473 00 a178 c1", `envelope field "x": want a msgpack value, got reserved code (0xc1)`},
	{"event int", "94 00 91 05 00 " + roomForOneEvent, "event 0: want event array or map, got int"},
	{"event empty array", "94 00 91 90 00 " + roomForOneEvent, "event 0: event is an empty array"},
	{"unknown tag not a str", "94 00 92 91 ab426c6f636b53746f726564 91 01 00 " + roomForOneEvent, "event 1 field type: want str, got int"},
	{"unknown event malformed inside", "93 00 91 92 aa426c6f636b4d6f766564 c1 00", "event 0: want a msgpack value, got reserved code (0xc1)"},
	{"unknown map event with int key before type", "93 00 91 82 01 00 a474797065 a158 00", "event 0 field (key): want str, got int"},
	{"second type unknown", "93 00 91 82 a474797065 ab426c6f636b53746f726564 a474797065 a158 00",
		`second "type" key says "X", first said BlockStored`},
	{"tag int", "94 00 91 91 01 00 " + roomForOneEvent, "event 0 field type: want str, got int"},
	{"map event without type", "94 00 91 81 a178 00 00 " + roomForOneEvent, `event 0: event map has no "type" key`},
	{"map event conflicting types", "93 00 91 82 a474797065 ab426c6f636b53746f726564 a474797065 ac426c6f636b52656d6f766564 00",
		`second "type" key says BlockRemoved, first said BlockStored`},
	{"map event with int key", "94 00 91 81 01 00 00 " + roomForOneEvent, "event 0 field (key): want str, got int"},
	{"hash str", "93 00 91 92 ab426c6f636b53746f726564 91 a178 00",
		"event 0 (BlockStored) field block_hashes[0]: want integer or bin block hash, got str (0xa1)"},
	{"hash float", "93 00 91 92 ab426c6f636b53746f726564 92 01 cb 0000000000000000 00", "block_hashes[1]: want integer or bin block hash, got float64 (0xcb)"},
	{"hash nil", "93 00 91 92 ab426c6f636b53746f726564 91 c0 00", "block_hashes[0]: want integer or bin block hash, got nil"},
	{"hash bin too short", "93 00 91 92 ab426c6f636b53746f726564 91 c4 04 01020304 00", "block_hashes[0]: bin hash of 4 bytes, want at least 8"},
	{"parent bin too short", "93 00 91 93 ab426c6f636b53746f726564 90 c4 07 01020304050607 00", "field parent_block_hash: bin hash of 7 bytes, want at least 8"},
	{"hashes not array", "93 00 91 92 ab426c6f636b53746f726564 01 00", "field block_hashes: want array, got int"},
	{"token negative", "93 00 91 94 ab426c6f636b53746f726564 90 c0 92 01 ff 00",
		"event 0 (BlockStored) field token_ids[1]: integer -1 out of range [0, 4294967295]"},
	{"token too large", "93 00 91 94 ab426c6f636b53746f726564 90 c0 91 cf 0000000100000000 00", "field token_ids[0]: integer 4294967296 out of range"},
	{"token str", "93 00 91 94 ab426c6f636b53746f726564 90 c0 93 01 02 a3616263 00", "field token_ids[2]: want integer, got str (0xa3)"},
	{"block_size str", "93 00 91 95 ab426c6f636b53746f726564 90 c0 90 a0 00", "field block_size: want integer, got str"},
	{"lora_id uint64", "93 00 91 96 ab426c6f636b53746f726564 90 c0 90 00 cf 8000000000000000 00", "field lora_id: integer 9223372036854775808 out of range"},
	{"medium int", "93 00 91 93 ac426c6f636b52656d6f766564 90 01 00", "event 0 (BlockRemoved) field medium: want str, got int"},
	{"lora_name bin", "93 00 91 98 ab426c6f636b53746f726564 90 c0 90 00 c0 c0 c4 00 00", "field lora_name: want str, got bin"},
	{"group_idx str", "93 00 91 94 ac426c6f636b52656d6f766564 90 c0 a0 00", "event 0 (BlockRemoved) field group_idx: want integer, got str"},
	{"spec kind int", "93 00 91 9b ab426c6f636b53746f726564 90 c0 90 00 c0 c0 c0 c0 c0 01 00", "field kv_cache_spec_kind: want str, got int"},
	{"window str", "93 00 91 9c ab426c6f636b53746f726564 90 c0 90 00 c0 c0 c0 c0 c0 c0 a0 00", "field kv_cache_spec_sliding_window: want integer, got str"},
	{"huge events length", "93 00 dd ffffffff 00", "envelope field events: array of 4294967295 elements of at least 2 bytes each cannot fit in the 1 bytes left"},
	{"huge events length vs event size", "93 00 94 91 a0 00", "array of 4 elements of at least 2 bytes each cannot fit in the 3 bytes left"},
	{"huge token length", "93 00 91 94 ab426c6f636b53746f726564 90 c0 dd ffffffff 00", "field token_ids: array of 4294967295 elements cannot fit"},
	{"huge hash length", "93 00 91 92 ab426c6f636b53746f726564 dc ffff 00", "field block_hashes: array of 65535 elements cannot fit"},
	{"huge str length", "92 00 91 91 db ffffffff 0000000000000000", "event 0 field type: str of 4294967295 bytes overruns the payload (8 bytes left)"},
	{"huge bin hash", "93 00 91 92 ab426c6f636b53746f726564 91 c6 ffffffff 00", "block_hashes[0]: bin of 4294967295 bytes overruns the payload"},
	{"huge map", "94 00 91 df ffffffff 00 " + roomForOneEvent, "event 0: map of 4294967295 pairs cannot fit"},
	{"huge skipped array", "93 00 91 92 b0416c6c426c6f636b73436c6561726564 dd 7fffffff", "event 0 (AllBlocksCleared) field (trailing field)[1]: array of 2147483647 elements cannot fit"},
	{"huge skipped ext", "93 00 91 82 a474797065 b0416c6c426c6f636b73436c6561726564 a178 c9 ffffffff 01 00", `event 0 (AllBlocksCleared) field "x": ext value overruns the payload`},
	{"extra_keys length mismatch", "93 00 91 99 ab426c6f636b53746f726564 92 01 02 c0 90 00 c0 c0 c0 91 c0 00",
		"event 0 (BlockStored): extra_keys has 1 entries for 2 block hashes, want one per block"},
	{"extra_keys not array", "93 00 91 99 ab426c6f636b53746f726564 90 c0 90 00 c0 c0 c0 a178 00", "field extra_keys: want array, got str"},
	{"extra_keys bare scalar", "93 00 91 99 ab426c6f636b53746f726564 91 01 c0 90 00 c0 c0 c0 91 a178 00",
		"field extra_keys[0]: want tuple (array) or nil per block, got str (0xa1)"},
	{"extra_keys map value", "93 00 91 99 ab426c6f636b53746f726564 91 01 c0 90 00 c0 c0 c0 91 92 00 80 00",
		"field extra_keys[0][1]: want str, bin, int, float, bool, nil or tuple in extra keys, got map"},
	{"extra_keys ext value", "93 00 91 99 ab426c6f636b53746f726564 91 01 c0 90 00 c0 c0 c0 91 91 d4 01 01 00",
		"field extra_keys[0][0]: want str, bin, int, float, bool, nil or tuple in extra keys, got ext"},
	{"extra_keys deep nesting", "93 00 91 99 ab426c6f636b53746f726564 91 01 c0 90 00 c0 c0 c0 91 " + nestedArrays(40, "c0") + " 00",
		"field extra_keys" + strings.Repeat("[0]", 34) + ": extra keys nested deeper than 32"},
	{"truncated hash", "93 00 91 92 ab426c6f636b53746f726564 91 cf 0102", "block_hashes[0]: payload ends inside uint (0xcf) at offset 17"},
	{"truncated after tag", "93 00 91 92 ab426c6f636b53746f726564", "field block_hashes: unexpected end of payload at offset 16: ... 63 6b 53 74 6f 72 65 64 [EOF]"},
	{"truncated float", "92 cb 0102", "envelope field ts: payload ends inside float64 (0xcb)"},
}

func TestDecodeMalformed(t *testing.T) {
	d := NewDecoder()
	var b Batch
	for _, tc := range malformedVectors {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Decode(hx(tc.hex), &b)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v\nwant it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "events: malformed payload: ") || !strings.Contains(err.Error(), " at offset ") {
				t.Errorf("err = %v: does not say where", err)
			}
			if _, err2 := Decode(hx(tc.hex)); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("Decode: %v, Decoder.Decode: %v", err2, err)
			}
		})
	}
}

func TestDecodeErrorFormat(t *testing.T) {
	// One message in full, to pin the format down.
	payload := hx("93 cb 4004000000000000 91 94 ab426c6f636b53746f726564 90 c0 93 01 02 a3616263 00")
	_, err := Decode(payload)
	const want = "events: malformed payload: event 0 (BlockStored) field token_ids[2]: " +
		"want integer, got str (0xa3) at offset 29: ... 72 65 64 90 c0 93 01 02 [a3] 61 62 63 00"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant  %s", err, want)
	}
}

func TestDecodeTruncated(t *testing.T) {
	var payloads [][]byte
	for _, name := range payloadFixtureFiles {
		for _, m := range loadPayloadFixture(t, name).Messages {
			payloads = append(payloads, hexBytes(t, m.PayloadHex))
		}
	}
	for _, v := range specVectors {
		payloads = append(payloads, hx(v.hex))
	}
	d := NewDecoder()
	var b Batch
	for i, p := range payloads {
		for n := 0; n < len(p); n++ {
			err := d.Decode(p[:n], &b)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("payload %d cut to %d of %d bytes: err = %v, want ErrMalformed", i, n, len(p), err)
			}
		}
		if err := d.Decode(p, &b); err != nil {
			t.Fatalf("payload %d whole: %v", i, err)
		}
	}
}

func TestDecodeDeepUnknownValue(t *testing.T) {
	// Unknown keys are skipped without recursion, so nesting as deep as the
	// payload allows is fine there (msgspec would accept it too).
	const n = 1 << 20
	payload := hx("93 00 91 82 a474797065 b0416c6c426c6f636b73436c6561726564 a178")
	payload = append(payload, bytes.Repeat([]byte{0x91}, n)...)
	payload = append(payload, 0xc0, 0x00)
	b, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.Events[0].Kind != KindAllBlocksCleared {
		t.Errorf("got %+v", b)
	}
}

func TestDecodeReuse(t *testing.T) {
	// Decoding different payloads into one Batch must give the same result
	// as decoding each into a fresh one, whatever the Batch held before.
	var payloads [][]byte
	for _, name := range payloadFixtureFiles {
		for _, m := range loadPayloadFixture(t, name).Messages {
			payloads = append(payloads, hexBytes(t, m.PayloadHex))
		}
	}
	for _, v := range specVectors {
		payloads = append(payloads, hx(v.hex))
	}
	d := NewDecoder()
	var b Batch
	for round := 0; round < 3; round++ {
		for i := range payloads {
			p := payloads[(i*7+round)%len(payloads)]
			want, err := Decode(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
			if diff := diffBatch(&b, want); diff != "" {
				t.Fatalf("round %d payload %d: %s", round, i, diff)
			}
			// A failed decode in between must not break the next one.
			_ = d.Decode(p[:len(p)/2], &b)
		}
	}
}

func TestDecodeDoesNotRetainPayload(t *testing.T) {
	f := loadPayloadFixture(t, "current-main.json")
	p := hexBytes(t, f.Messages[1].PayloadHex)
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(b.Events[0].LoRAName, b.Events[0].MediumName, b.Events[0].SpecKind, b.Events[0].ExtraKeys[0].String())
	for i := range p {
		p[i] = 0
	}
	if got := fmt.Sprint(b.Events[0].LoRAName, b.Events[0].MediumName, b.Events[0].SpecKind, b.Events[0].ExtraKeys[0].String()); got != want {
		t.Errorf("after clearing the payload: %s, want %s", got, want)
	}
}

// benchBatch is a realistic step: 8 requests each storing 4 full blocks of
// 16 tokens, int hashes, extra_keys of None per block, group 0.
func benchBatch() *Batch { return benchBatchSeed(0) }

// benchBatchSeed is benchBatch with hashes and token ids drawn from seed.
// Token ids are spread over a 151 k vocabulary, so they are a random mix
// of msgpack's uint16 and uint32 forms.
func benchBatchSeed(seed uint64) *Batch {
	b := &Batch{Timestamp: 1764400000.5, HasDPRank: true}
	h := 0x9e3779b97f4a7c15 + seed
	tok := uint32(100 + seed)
	for r := 0; r < 8; r++ {
		e := Event{Kind: KindBlockStored, BlockSize: 16, MediumName: "GPU", HasGroupIdx: true, SpecKind: "full_attention",
			ExtraKeys: make([]ExtraKeys, 4)}
		if r%2 == 1 {
			e.ParentHash, e.HasParent = h, true
		}
		for i := 0; i < 4; i++ {
			h = splitmix64(h)
			e.BlockHashes = append(e.BlockHashes, h)
			for j := 0; j < 16; j++ {
				tok = tok*1103515245 + 12345
				e.TokenIDs = append(e.TokenIDs, (tok>>8)%151000)
			}
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func TestDecodeSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("alloc counts")
	}
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		payload, err := AppendPayload(nil, benchBatch(), EncodeOptions{Encoding: enc})
		if err != nil {
			t.Fatal(err)
		}
		d := NewDecoder()
		var b Batch
		allocs := testing.AllocsPerRun(100, func() {
			if err := d.Decode(payload, &b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocs per Decode into a reused Batch, want 0", enc, allocs)
		}
	}
}

// BenchmarkDecode decodes realistic batches (benchBatch: 8 BlockStored
// events x 4 blocks x 16 tokens, ~2.8 KB) into a reused Batch. It cycles
// through 64 distinct payloads: decoding one payload over and over lets
// the branch predictor learn its token forms, which no real stream allows.
//
// Measured on the 2-core Xeon of docs/benchmarks.md, Go 1.26.8, medians
// of -count=6 (benchstat: -86% sec/op, p=0.002):
//
//	                     array era            map era        allocs/op
//	vmihailenco/msgpack  15.6 µs  2.0 M/s     17.0 µs  1.9 M/s     0
//	hand-written          2.1 µs 15.0 M/s      2.4 µs 13.1 M/s     0
func BenchmarkDecode(b *testing.B) {
	const distinct = 64
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		var payloads [][]byte
		size, blocks := 0, 0
		for seed := range uint64(distinct) {
			batch := benchBatchSeed(seed)
			for _, e := range batch.Events {
				blocks += len(e.BlockHashes)
			}
			p, err := AppendPayload(nil, batch, EncodeOptions{Encoding: enc})
			if err != nil {
				b.Fatal(err)
			}
			payloads = append(payloads, p)
			size += len(p)
		}
		b.Run(enc.String(), func(b *testing.B) {
			d := NewDecoder()
			var out Batch
			b.SetBytes(int64(size / distinct))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := d.Decode(payloads[i%distinct], &out); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(blocks/distinct*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
