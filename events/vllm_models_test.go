package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// vllmModelFiles are testdata/vllm-*.json: messages captured from vLLM's own
// ZmqEventPublisher and msgspec structs (the kv_events.py that reproduces
// current-main.json byte for byte), publishing over ZMQ on loopback, with
// the events vLLM's block pool, KV-cache manager and offloading connector
// send for one model shape per file. Each file's "description" says which
// model it stands for, which vLLM sources the values follow and how it was
// captured; "decoded" is what msgspec decoded from each payload.
var vllmModelFiles = []string{
	"vllm-mla.json", "vllm-mla-256.json", "vllm-sink.json", "vllm-hybrid-window.json",
	"vllm-hybrid-mamba.json", "vllm-tiers.json", "vllm-locality.json", "vllm-dp-push.json",
}

// loadVLLMModel decodes every message of a vllm-*.json capture, checking
// each against what msgspec decoded (through Decode, a reused Decoder and
// the reference decoder) and that every truncation of it is rejected.
// It returns the decoded batches in message order and the description.
func loadVLLMModel(t *testing.T, name string) ([]*Batch, string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Description string `json:"description"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	f := loadPayloadFixture(t, name)
	d := NewDecoder()
	var reused Batch
	batches := make([]*Batch, len(f.Messages))
	for i, m := range f.Messages {
		if m.Topic != "kv-events" || m.Seq != uint64(i) {
			t.Fatalf("%s message %d: topic %q seq %d", name, i, m.Topic, m.Seq)
		}
		payload := hexBytes(t, m.PayloadHex)
		decoded := parseJSON(t, m.Decoded)
		want := jsonBatch(t, decoded)
		got, err := Decode(payload)
		if err != nil {
			t.Fatalf("%s seq %d: %v", name, i, err)
		}
		if diff := diffBatch(got, want); diff != "" {
			t.Fatalf("%s seq %d: Decode: %s", name, i, diff)
		}
		for j, ev := range decoded.([]any)[1].([]any) {
			checkExtraKeysJSON(t, ev, got.Events[j].ExtraKeys)
		}
		if err := d.Decode(payload, &reused); err != nil {
			t.Fatalf("%s seq %d: reused Decoder: %v", name, i, err)
		}
		if diff := diffBatch(&reused, want); diff != "" {
			t.Fatalf("%s seq %d: reused Decoder: %s", name, i, diff)
		}
		ref, err := refDecode(payload)
		if err != nil {
			t.Fatalf("%s seq %d: refDecode: %v", name, i, err)
		}
		if diff := diffBatch(ref, want); diff != "" {
			t.Fatalf("%s seq %d: refDecode: %s", name, i, diff)
		}
		for n := range len(payload) {
			if err := d.Decode(payload[:n], &reused); !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s seq %d cut to %d bytes: err = %v, want ErrMalformed", name, i, n, err)
			}
		}
		if ts := 1764400000.5 + 0.25*float64(i); got.Timestamp != ts {
			t.Fatalf("%s seq %d: Timestamp %v, want %v", name, i, got.Timestamp, ts)
		}
		batches[i] = got
	}
	return batches, doc.Description
}

// storedWant is what one BlockStored must decode to, written out by hand
// so that a bug shared by jsonBatch and the decoder cannot hide.
type storedWant struct {
	group, blocks, tokens, blockSize int
	kind                             string
	window                           int // 0: no kv_cache_spec_sliding_window
	medium                           Medium
	mediumName                       string
	parent                           *uint64 // nil: no parent
	extraKeys                        int     // -1: extra_keys not sent
}

func checkStored(t *testing.T, where string, e Event, w storedWant) {
	t.Helper()
	if e.Kind != KindBlockStored || len(e.BlockHashes) != w.blocks || len(e.TokenIDs) != w.tokens ||
		e.BlockSize != w.blockSize || !e.HasGroupIdx || e.GroupIdx != w.group || e.SpecKind != w.kind ||
		e.HasSlidingWindow != (w.window != 0) || e.SlidingWindow != w.window ||
		e.Medium != w.medium || e.MediumName != w.mediumName || e.HasLoRAID || e.LoRAName != "" ||
		e.CacheSalt != "" {
		t.Fatalf("%s: %+v\nwant %+v", where, e, w)
	}
	if (w.parent == nil) == e.HasParent || (w.parent != nil && e.ParentHash != *w.parent) {
		t.Fatalf("%s: parent %d (has %v), want %v", where, e.ParentHash, e.HasParent, w.parent)
	}
	switch {
	case w.extraKeys < 0 && e.ExtraKeys != nil:
		t.Fatalf("%s: ExtraKeys %v, want none", where, e.ExtraKeys)
	case w.extraKeys >= 0 && (len(e.ExtraKeys) != w.extraKeys || slices.ContainsFunc(e.ExtraKeys, func(k ExtraKeys) bool { return k != nil })):
		t.Fatalf("%s: ExtraKeys %v, want %d null entries", where, e.ExtraKeys, w.extraKeys)
	}
}

func checkRemoved(t *testing.T, where string, e Event, group int, medium Medium, name string, hashes ...uint64) {
	t.Helper()
	if e.Kind != KindBlockRemoved || !slices.Equal(e.BlockHashes, hashes) || !e.HasGroupIdx || e.GroupIdx != group ||
		e.Medium != medium || e.MediumName != name || len(e.TokenIDs) != 0 || e.BlockSize != 0 || e.SpecKind != "" {
		t.Fatalf("%s: %+v, want removal of %v from %s group %d", where, e, hashes, name, group)
	}
}

func eventCounts(t *testing.T, name string, batches []*Batch, want ...int) {
	t.Helper()
	if len(batches) != len(want) {
		t.Fatalf("%s: %d messages, want %d", name, len(batches), len(want))
	}
	for i, b := range batches {
		if len(b.Events) != want[i] || !b.HasDPRank || (b.DPRank != 0) != (name == "vllm-dp-push.json") {
			t.Fatalf("%s seq %d: %d events, rank %d (has %v); want %d events", name, i, len(b.Events), b.DPRank, b.HasDPRank, want[i])
		}
	}
}

// TestVLLMModelCaptures decodes every message of every vllm-*.json capture
// and checks it against msgspec's decoding, then checks the shape each model
// gives the events against values written out here.
func TestVLLMModelCaptures(t *testing.T) {
	checks := map[string]func(*testing.T, string, []*Batch, string){
		"vllm-mla.json":           checkMLA(64),
		"vllm-mla-256.json":       checkMLA(256),
		"vllm-sink.json":          checkSink,
		"vllm-hybrid-window.json": checkHybridWindow,
		"vllm-hybrid-mamba.json":  checkHybridMamba,
		"vllm-tiers.json":         checkTiers,
		"vllm-locality.json":      checkLocality,
		"vllm-dp-push.json":       checkDPPush,
	}
	if len(checks) != len(vllmModelFiles) {
		t.Fatalf("%d checks for %d files", len(checks), len(vllmModelFiles))
	}
	for _, name := range vllmModelFiles {
		t.Run(name, func(t *testing.T) {
			batches, desc := loadVLLMModel(t, name)
			if !strings.Contains(desc, "vllm/") || !strings.Contains(desc, "ZmqEventPublisher") {
				t.Fatalf("description names no vLLM source or capture: %q", desc)
			}
			checks[name](t, name, batches, desc)
		})
	}
}

func checkMLA(bs int) func(*testing.T, string, []*Batch, string) {
	return func(t *testing.T, name string, b []*Batch, _ string) {
		eventCounts(t, name, b, 1, 1, 3, 1)
		mla := storedWant{kind: "mla_attention", blockSize: bs, medium: MediumGPU, mediumName: "GPU"}
		w := mla
		w.blocks, w.tokens, w.extraKeys = 3, 3*bs, 3
		checkStored(t, "seq 0", b[0].Events[0], w)
		a := b[0].Events[0].BlockHashes
		w.blocks, w.tokens, w.extraKeys, w.parent = 1, bs, 1, &a[2] // chained across batches
		checkStored(t, "seq 1", b[1].Events[0], w)
		a3 := b[1].Events[0].BlockHashes[0]
		checkRemoved(t, "seq 2", b[2].Events[0], 0, MediumGPU, "GPU", a3)
		checkRemoved(t, "seq 2", b[2].Events[1], 0, MediumGPU, "GPU", a[2])
		w = mla
		w.blocks, w.tokens, w.extraKeys = 2, 2*bs, 2
		checkStored(t, "seq 2", b[2].Events[2], w)
		if b[3].Events[0].Kind != KindAllBlocksCleared {
			t.Fatalf("seq 3: %+v, want AllBlocksCleared", b[3].Events[0])
		}
	}
}

func checkSink(t *testing.T, name string, b []*Batch, _ string) {
	eventCounts(t, name, b, 1, 1, 1, 3)
	w := storedWant{kind: "sink_full_attention", blockSize: 16, medium: MediumGPU, mediumName: "GPU", blocks: 3, tokens: 48, extraKeys: 3}
	checkStored(t, "seq 0", b[0].Events[0], w)
	for i := 1; i <= 2; i++ {
		prev := b[i-1].Events[0].BlockHashes
		w.blocks, w.tokens, w.extraKeys, w.parent = 1, 16, 1, &prev[len(prev)-1]
		checkStored(t, fmt.Sprintf("seq %d", i), b[i].Events[0], w)
	}
	checkRemoved(t, "seq 3", b[3].Events[0], 0, MediumGPU, "GPU", b[2].Events[0].BlockHashes[0])
	checkRemoved(t, "seq 3", b[3].Events[1], 0, MediumGPU, "GPU", b[1].Events[0].BlockHashes[0])
	w.blocks, w.tokens, w.extraKeys, w.parent = 2, 32, 2, nil
	checkStored(t, "seq 3", b[3].Events[2], w)
}

// checkHybridWindow: group 0 is gpt-oss's sliding-window group, group 1
// its full-attention group; every store comes once per group with the same
// hashes, window-group removals come before any full-attention removal, and
// a late joiner starting at seq 4 sees window-group removals of blocks
// stored only in seq 0.
func checkHybridWindow(t *testing.T, name string, b []*Batch, _ string) {
	eventCounts(t, name, b, 2, 2, 2, 2, 6, 2, 5, 11)
	window := storedWant{group: 0, kind: "sliding_window", window: 128, blockSize: 16, medium: MediumGPU, mediumName: "GPU"}
	full := storedWant{group: 1, kind: "full_attention", blockSize: 16, medium: MediumGPU, mediumName: "GPU"}
	stored := map[[2]uint64]int{} // {hash, group} -> message that stored it
	firstFull := -1
	for i, batch := range b {
		for j := 0; j < len(batch.Events); j++ {
			e := batch.Events[j]
			where := fmt.Sprintf("seq %d event %d", i, j)
			if e.Kind == KindBlockRemoved {
				if !e.HasGroupIdx || e.Medium != MediumGPU || len(e.BlockHashes) != 1 {
					t.Fatalf("%s: %+v", where, e)
				}
				if e.GroupIdx == 1 && firstFull < 0 {
					firstFull = i
				}
				if e.GroupIdx == 0 && firstFull >= 0 {
					t.Fatalf("%s: window-group removal after a full-attention removal", where)
				}
				if _, ok := stored[[2]uint64{e.BlockHashes[0], uint64(e.GroupIdx)}]; !ok {
					t.Fatalf("%s: removal of a block never stored", where)
				}
				continue
			}
			// A pair: the window group's store, then the full group's.
			w, f := window, full
			n := len(e.BlockHashes)
			w.blocks, w.tokens, w.extraKeys = n, 16*n, n
			f.blocks, f.tokens, f.extraKeys = n, 16*n, n
			if e.HasParent {
				w.parent, f.parent = &e.ParentHash, &e.ParentHash
			}
			next := batch.Events[j+1]
			checkStored(t, where, e, w)
			checkStored(t, where+"+1", next, f)
			if !slices.Equal(e.BlockHashes, next.BlockHashes) || !slices.Equal(e.TokenIDs, next.TokenIDs) {
				t.Fatalf("%s: the groups stored different blocks", where)
			}
			for _, h := range e.BlockHashes {
				stored[[2]uint64{h, 0}], stored[[2]uint64{h, 1}] = i, i
			}
			j++
		}
	}
	if firstFull != 7 {
		t.Fatalf("first full-attention removal in seq %d, want 7", firstFull)
	}
	// Late join at seq 4: its window-group removals name blocks stored in seq 0.
	for _, e := range b[4].Events[2:4] {
		if e.Kind != KindBlockRemoved || e.GroupIdx != 0 || stored[[2]uint64{e.BlockHashes[0], 0}] != 0 {
			t.Fatalf("seq 4: %+v, want a window-group removal of a block stored in seq 0", e)
		}
	}
	// C's store continues B's block, stored in another message.
	if c := b[6].Events[3]; !c.HasParent || c.ParentHash != b[4].Events[4].BlockHashes[0] {
		t.Fatalf("seq 6: C's parent %d, want B's block %d", c.ParentHash, b[4].Events[4].BlockHashes[0])
	}
}

// checkHybridMamba: groups 0-2 are Qwen3-Next's mamba groups, group 3 its
// full-attention group, block_size 544; in align mode a mamba store carries
// one hash for a chunk whose tokens span several blocks.
func checkHybridMamba(t *testing.T, name string, b []*Batch, _ string) {
	const bs = 544
	eventCounts(t, name, b, 4, 4, 7, 5)
	mamba := storedWant{kind: "mamba", blockSize: bs, medium: MediumGPU, mediumName: "GPU", blocks: 1, extraKeys: 1}
	full := storedWant{group: 3, kind: "full_attention", blockSize: bs, medium: MediumGPU, mediumName: "GPU"}
	a := b[0].Events[3].BlockHashes
	for g := range 3 {
		w := mamba
		w.group, w.tokens = g, 2*bs // one hash, two blocks of tokens
		checkStored(t, "seq 0", b[0].Events[g], w)
		if b[0].Events[g].BlockHashes[0] != a[1] || !slices.Equal(b[0].Events[g].TokenIDs, b[0].Events[3].TokenIDs) {
			t.Fatalf("seq 0 group %d: mamba store differs from the full group's block 1", g)
		}
	}
	f := full
	f.blocks, f.tokens, f.extraKeys = 2, 2*bs, 2
	checkStored(t, "seq 0", b[0].Events[3], f)
	for g := range 4 {
		w := mamba
		if g == 3 {
			w = full
			w.blocks, w.extraKeys = 1, 1
		}
		w.group, w.tokens, w.parent = g, bs, &a[1]
		checkStored(t, "seq 1", b[1].Events[g], w)
	}
	a2 := b[1].Events[3].BlockHashes[0]
	for g := range 3 {
		checkRemoved(t, "seq 2", b[2].Events[g], g, MediumGPU, "GPU", a[1])
		checkRemoved(t, "seq 3", b[3].Events[g], g, MediumGPU, "GPU", a2)
		w := mamba
		w.group, w.tokens = g, bs
		checkStored(t, "seq 2", b[2].Events[3+g], w)
	}
	f.blocks, f.tokens, f.extraKeys = 1, bs, 1
	checkStored(t, "seq 2", b[2].Events[6], f)
	checkRemoved(t, "seq 3", b[3].Events[3], 3, MediumGPU, "GPU", a2)
	checkRemoved(t, "seq 3", b[3].Events[4], 3, MediumGPU, "GPU", a[1])
}

// wireLocality returns each event's "locality" as msgspec decoded it: the
// decoder has no field for it yet and skips it as an unknown key.
func wireLocality(t *testing.T, name string) [][]string {
	t.Helper()
	var out [][]string
	for _, m := range loadPayloadFixture(t, name).Messages {
		var env []json.RawMessage
		var evs []map[string]any
		if err := json.Unmarshal(m.Decoded, &env); err != nil || json.Unmarshal(env[1], &evs) != nil {
			t.Fatalf("%s seq %d: decoded is not an envelope", name, m.Seq)
		}
		var l []string
		for _, e := range evs {
			s, _ := e["locality"].(string)
			l = append(l, s)
		}
		out = append(out, l)
	}
	return out
}

// checkTiers: the offloading connector's placeholder stores (no tokens,
// block_size 0, no spec kind) name the offloaded chunk by its last block's
// hash; CPU and STORAGE removals name the same hashes.
func checkTiers(t *testing.T, name string, b []*Batch, _ string) {
	eventCounts(t, name, b, 1, 2, 3, 3, 2)
	gpu := storedWant{kind: "full_attention", blockSize: 16, medium: MediumGPU, mediumName: "GPU", blocks: 8, tokens: 128, extraKeys: 8}
	checkStored(t, "seq 0", b[0].Events[0], gpu)
	a := b[0].Events[0].BlockHashes
	k0, k1 := a[3], a[7]
	cpu := storedWant{blocks: 1, medium: MediumCPU, mediumName: "CPU", extraKeys: -1}
	storage := storedWant{blocks: 1, medium: MediumStorage, mediumName: "STORAGE", extraKeys: -1}
	for i, e := range b[1].Events {
		checkStored(t, "seq 1", e, cpu)
		if e.BlockHashes[0] != []uint64{k0, k1}[i] {
			t.Fatalf("seq 1 event %d: hash %d, want chunk %d's last block", i, e.BlockHashes[0], i)
		}
	}
	remote := storage
	remote.medium = MediumExternal // locality REMOTE: not the engine's own
	for i, e := range b[2].Events {
		checkStored(t, "seq 2", e, []storedWant{storage, storage, remote}[i])
		if e.BlockHashes[0] != []uint64{k0, k1, k0}[i] {
			t.Fatalf("seq 2 event %d: hash %d", i, e.BlockHashes[0])
		}
	}
	checkRemoved(t, "seq 3", b[3].Events[0], 0, MediumGPU, "GPU", a[7])
	checkRemoved(t, "seq 3", b[3].Events[1], 0, MediumGPU, "GPU", a[6])
	checkRemoved(t, "seq 3", b[3].Events[2], 0, MediumCPU, "CPU", k1)
	checkRemoved(t, "seq 4", b[4].Events[0], 0, MediumStorage, "STORAGE", k0, k1)
	checkRemoved(t, "seq 4", b[4].Events[1], 0, MediumExternal, "STORAGE", k0)
	want := [][]string{{""}, {"", ""}, {"LOCAL", "LOCAL", "REMOTE"}, {"", "", ""}, {"LOCAL", "REMOTE"}}
	if got := wireLocality(t, name); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("locality on the wire %q, want %q", got, want)
	}
}

// checkLocality: self-describing offload stores carry the chunk's per-block
// hashes, tokens and spec kind, and removals fan out to the same hashes.
func checkLocality(t *testing.T, name string, b []*Batch, _ string) {
	eventCounts(t, name, b, 1, 1, 1, 1, 2, 1)
	w := storedWant{kind: "full_attention", blockSize: 16, medium: MediumGPU, mediumName: "GPU", blocks: 4, tokens: 64, extraKeys: 4}
	checkStored(t, "seq 0", b[0].Events[0], w)
	a, toks := b[0].Events[0].BlockHashes, b[0].Events[0].TokenIDs
	w.extraKeys = -1
	for i, m := range []struct {
		medium Medium
		name   string
	}{{MediumCPU, "CPU"}, {MediumStorage, "STORAGE"}, {MediumExternal, "STORAGE"}} { // the last REMOTE
		w.medium, w.mediumName = m.medium, m.name
		e := b[i+1].Events[0]
		checkStored(t, fmt.Sprintf("seq %d", i+1), e, w)
		if !slices.Equal(e.BlockHashes, a) || !slices.Equal(e.TokenIDs, toks) {
			t.Fatalf("seq %d: offloaded chunk differs from the GPU blocks", i+1)
		}
	}
	checkRemoved(t, "seq 4", b[4].Events[0], 0, MediumExternal, "STORAGE", a...) // REMOTE
	checkRemoved(t, "seq 4", b[4].Events[1], 0, MediumCPU, "CPU", a...)
	checkRemoved(t, "seq 5", b[5].Events[0], 0, MediumStorage, "STORAGE", a...)
	want := [][]string{{""}, {""}, {"LOCAL"}, {"REMOTE"}, {"REMOTE", ""}, {"LOCAL"}}
	if got := wireLocality(t, name); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("locality on the wire %q, want %q", got, want)
	}
}

// checkDPPush: rank 2's publisher stamps its rank on every batch, and its
// connecting endpoint was offset by the rank.
func checkDPPush(t *testing.T, name string, b []*Batch, desc string) {
	eventCounts(t, name, b, 1, 1, 2)
	for i, batch := range b {
		if batch.DPRank != 2 {
			t.Fatalf("seq %d: DPRank %d, want 2", i, batch.DPRank)
		}
	}
	if !strings.Contains(desc, `"tcp://127.0.0.1:47600"`) || !strings.Contains(desc, "connected to tcp://127.0.0.1:47602") {
		t.Fatalf("description does not record the configured and the offset endpoint: %q", desc)
	}
	w := storedWant{kind: "mla_attention", blockSize: 64, medium: MediumGPU, mediumName: "GPU", blocks: 2, tokens: 128, extraKeys: 2}
	checkStored(t, "seq 0", b[0].Events[0], w)
	a := b[0].Events[0].BlockHashes
	w.blocks, w.tokens, w.extraKeys, w.parent = 1, 64, 1, &a[1]
	checkStored(t, "seq 1", b[1].Events[0], w)
	checkRemoved(t, "seq 2", b[2].Events[0], 0, MediumGPU, "GPU", b[1].Events[0].BlockHashes[0])
	checkRemoved(t, "seq 2", b[2].Events[1], 0, MediumGPU, "GPU", a[1])
}
