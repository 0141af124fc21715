package scoring

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// The tests here apply the payloads of events/testdata/vllm-*.json, which
// vLLM's own publisher produced (each file's "description" says for which
// model and how), to a worker message by message, as the subscriber does,
// and check what the index answers against the hit vLLM realizes, worked
// out by hand from the events.

// capture is one vllm-*.json file: its payloads in seq order and their
// decodings (for the prompts the tests build from the events' tokens).
type capture struct {
	name     string
	payloads [][]byte
	batches  []*events.Batch
}

func loadCapture(t *testing.T, name string) *capture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "events", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Messages []struct {
			Seq        uint64 `json:"seq"`
			PayloadHex string `json:"payload_hex"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := &capture{name: name}
	for i, m := range doc.Messages {
		p, err := hex.DecodeString(m.PayloadHex)
		if err != nil || m.Seq != uint64(i) {
			t.Fatalf("%s message %d (seq %d): %v", name, i, m.Seq, err)
		}
		b, err := events.Decode(p)
		if err != nil {
			t.Fatalf("%s seq %d: %v", name, i, err)
		}
		c.payloads, c.batches = append(c.payloads, p), append(c.batches, b)
	}
	return c
}

// ev returns event i of message seq.
func (c *capture) ev(seq, i int) *events.Event { return &c.batches[seq].Events[i] }

// replay decodes messages [from, to) with one Decoder and Batch, reused as
// the subscriber reuses them, and applies each to w; it returns the
// messages' apply errors joined.
func (c *capture) replay(t *testing.T, w *indexer.Worker, from, to int) error {
	t.Helper()
	d := events.NewDecoder()
	var b events.Batch
	var errs []error
	for seq := from; seq < to; seq++ {
		if err := d.Decode(c.payloads[seq], &b); err != nil {
			t.Fatalf("%s seq %d: %v", c.name, seq, err)
		}
		if err := w.ApplyBatch(&b); err != nil {
			errs = append(errs, fmt.Errorf("seq %d: %w", seq, err))
		}
	}
	return errors.Join(errs...)
}

// replayClean is replay that fails the test on an apply error.
func (c *capture) replayClean(t *testing.T, w *indexer.Worker, from, to int) {
	t.Helper()
	if err := c.replay(t, w, from, to); err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
}

// prompt is the first blocks*bs of tokens, the events' token_ids
// concatenated, and one more token: vLLM computes at least a prompt's last
// token, so a prompt of exactly n blocks could hit at most n-1.
func prompt(bs, blocks int, tokens ...[]uint32) []uint32 {
	all := slices.Concat(tokens...)
	return append(slices.Clone(all[:blocks*bs]), 1)
}

// captureWorker is an index whose model "m" is configured with 16-token
// blocks and its worker "p" (rank rank).
func captureWorker(t *testing.T, rank int) (*indexer.Index, *indexer.Model, *indexer.Worker) {
	t.Helper()
	ix := indexer.New(indexer.Config{})
	m, err := ix.AddModel("m", 16)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "p", DPRank: rank}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	return ix, m, w
}

// hit is a worker's answer for a prompt: matched blocks, the prefix
// group's own match when a group capped it (else 0) and the capping
// group (-1 when none), and the per-medium prefixes.
type hit struct {
	blocks, prefix, by int
	media              [events.NumMedia]int
}

// scoreHit scores tokens over ix and returns w's hit (zero, by -1, when w
// is not ranked), checking the prompt was keyed at the model's block size.
func scoreHit(t *testing.T, ix *indexer.Index, m *indexer.Model, w *indexer.Worker, tokens []uint32) hit {
	t.Helper()
	var res Result
	if err := New(ix, Options{}).Score(&Request{Model: m, Tokens: tokens}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Prompt.BlockSize != m.BlockSize() || res.Prompt.Blocks != len(tokens)/m.BlockSize() {
		t.Fatalf("prompt of %d tokens scored as %d blocks of %d, model at %d", len(tokens), res.Prompt.Blocks, res.Prompt.BlockSize, m.BlockSize())
	}
	for i := range res.Ranked {
		c := &res.Ranked[i]
		if c.Ref != w.Info().Ref {
			continue
		}
		h := hit{blocks: c.Match.Blocks, prefix: c.Match.Prefix, by: -1, media: c.Match.ByMedium}
		if g, ok := res.CapGroup(c); ok {
			h.by = g.Index
			if g.Index != c.Match.CappedBy {
				t.Fatalf("CapGroup %d, CappedBy %d", g.Index, c.Match.CappedBy)
			}
		}
		return h
	}
	return hit{by: -1}
}

// wantHit checks w's hit for tokens: blocks, prefix and capping group.
func wantHit(t *testing.T, ix *indexer.Index, m *indexer.Model, w *indexer.Worker, what string, tokens []uint32, blocks, prefix, by int) hit {
	t.Helper()
	h := scoreHit(t, ix, m, w, tokens)
	if h.blocks != blocks || h.prefix != prefix || h.by != by {
		t.Fatalf("%s: %d blocks, prefix %d, capped by %d; want %d, %d, %d", what, h.blocks, h.prefix, h.by, blocks, prefix, by)
	}
	if h.media[events.MediumGPU] > blocks {
		t.Fatalf("%s: GPU prefix %d over the hit %d", what, h.media[events.MediumGPU], blocks)
	}
	return h
}

// layout describes w's groups as "idx:kind:role:window:block size:blocks".
func layout(w *indexer.Worker) string {
	var parts []string
	for _, g := range w.Groups() {
		parts = append(parts, fmt.Sprintf("%d:%s:%s:%d:%d:%d", g.Index, g.Kind, g.Role(), g.Window, g.BlockSize, g.Blocks))
	}
	return strings.Join(parts, " ")
}

func wantLayout(t *testing.T, w *indexer.Worker, when, want string) {
	t.Helper()
	if got := layout(w); got != want {
		t.Fatalf("%s: groups %q, want %q", when, got, want)
	}
}

// TestVLLMSingleGroupCaptures: MLA at 64 and 256-token blocks, sink full
// attention, and rank 2's MLA stream of vllm-dp-push.json. The block size is
// learned from the events (the model is configured at 16), prompts of the
// captured tokens match what the engine holds after each step, and a
// cleared cache keeps its layout.
func TestVLLMSingleGroupCaptures(t *testing.T) {
	for _, tc := range []struct {
		name, kind string
		bs         int
	}{{"vllm-mla.json", "mla_attention", 64}, {"vllm-mla-256.json", "mla_attention", 256}} {
		t.Run(tc.name, func(t *testing.T) {
			c := loadCapture(t, tc.name)
			ix, m, w := captureWorker(t, 0)
			a := prompt(tc.bs, 4, c.ev(0, 0).TokenIDs, c.ev(1, 0).TokenIDs) // A's blocks 0-3
			b := prompt(tc.bs, 2, c.ev(2, 2).TokenIDs)                      // B's blocks 0-1
			c.replayClean(t, w, 0, 2)
			if m.BlockSize() != tc.bs || m.ConfiguredBlockSize() != 16 || w.Stats().BlockSize != tc.bs || w.BlockSizeMismatch() {
				t.Fatalf("model at %d (configured %d), worker at %d: want %d learned", m.BlockSize(), m.ConfiguredBlockSize(), w.Stats().BlockSize, tc.bs)
			}
			wantLayout(t, w, "seq 1", fmt.Sprintf("0:%s:prefix:0:%d:4", tc.kind, tc.bs))
			if h := wantHit(t, ix, m, w, "A after seq 1", a, 4, 0, -1); h.media[events.MediumGPU] != 4 {
				t.Fatalf("A: GPU prefix %d, want 4", h.media[events.MediumGPU])
			}
			// A's blocks 3 and 2 evicted, B's two cached.
			c.replayClean(t, w, 2, 3)
			wantHit(t, ix, m, w, "A after seq 2", a, 2, 0, -1)
			wantHit(t, ix, m, w, "B after seq 2", b, 2, 0, -1)
			if s := w.Stats(); s.ResidentBlocks != 4 || s.BlocksStored != 6 || s.BlocksRemoved != 2 {
				t.Fatalf("seq 2: %+v", s)
			}
			c.replayClean(t, w, 3, 4) // AllBlocksCleared
			wantHit(t, ix, m, w, "A after the clear", a, 0, 0, -1)
			wantLayout(t, w, "the clear", fmt.Sprintf("0:%s:prefix:0:%d:0", tc.kind, tc.bs))
			if s := w.Stats(); s.ResidentBlocks != 0 || s.Clears != 1 || m.BlockSize() != tc.bs {
				t.Fatalf("after the clear: %+v, model at %d", s, m.BlockSize())
			}
		})
	}
	t.Run("vllm-sink.json", func(t *testing.T) {
		c := loadCapture(t, "vllm-sink.json")
		ix, m, w := captureWorker(t, 0)
		a := prompt(16, 5, c.ev(0, 0).TokenIDs, c.ev(1, 0).TokenIDs, c.ev(2, 0).TokenIDs)
		c.replayClean(t, w, 0, 3)
		wantLayout(t, w, "seq 2", "0:sink_full_attention:prefix:0:16:5")
		wantHit(t, ix, m, w, "A after seq 2", a, 5, 0, -1)
		c.replayClean(t, w, 3, 4) // A's blocks 4 and 3 evicted, B's 2 cached
		wantHit(t, ix, m, w, "A after seq 3", a, 3, 0, -1)
		wantHit(t, ix, m, w, "B after seq 3", prompt(16, 2, c.ev(3, 2).TokenIDs), 2, 0, -1)
		if s := w.Stats(); s.ResidentBlocks != 5 || s.SideBlocks != 0 || m.BlockSize() != 16 {
			t.Fatalf("seq 3: %+v, model at %d", s, m.BlockSize())
		}
	})
	t.Run("vllm-dp-push.json", func(t *testing.T) {
		c := loadCapture(t, "vllm-dp-push.json")
		ix, m, w := captureWorker(t, 2)
		a := prompt(64, 3, c.ev(0, 0).TokenIDs, c.ev(1, 0).TokenIDs)
		c.replayClean(t, w, 0, 2)
		wantHit(t, ix, m, w, "A after seq 1", a, 3, 0, -1)
		c.replayClean(t, w, 2, 3) // blocks 2 and 1 evicted
		wantHit(t, ix, m, w, "A after seq 2", a, 1, 0, -1)
		wantLayout(t, w, "seq 2", "0:mla_attention:prefix:0:64:1")
	})
}

// gptOSS is vllm-hybrid-window.json's prompts: A's 11 blocks (hashes
// a0-a10), B's block b0, C's b0 c1 and D's d0-d3, each block 16 tokens.
type gptOSS struct{ a, b, c, d []uint32 }

func gptOSSPrompts(c *capture) gptOSS {
	var a [][]uint32
	for seq := range 6 { // the full-attention group's store of A in seq 0-5
		a = append(a, c.ev(seq, 1).TokenIDs)
	}
	// seq 4: [win a9, full a9, rm a0, rm a1, win b0, full b0]; seq 6:
	// [rm a2, rm a10, rm a9, win c1, full c1]; seq 7: 6 window removals, 3
	// full-attention ones, [win d0-d3, full d0-d3].
	return gptOSS{a: slices.Concat(a...), b: c.ev(4, 5).TokenIDs, c: slices.Concat(c.ev(4, 5).TokenIDs, c.ev(6, 4).TokenIDs), d: c.ev(7, 10).TokenIDs}
}

// TestVLLMHybridWindowCapture: gpt-oss's sliding-window group (group 0,
// window 128) and full-attention group (group 1, the anchor). vLLM's rule
// for a hit of L blocks: the window group must hold the
// cdiv(128-1, 16) = 8 blocks before the cut (blocks L-8..L-1), or, when
// shorter, every block from the first. Without the cap, the last two
// checks would answer 11 and 8 blocks instead of 0.
func TestVLLMHybridWindowCapture(t *testing.T) {
	c := loadCapture(t, "vllm-hybrid-window.json")
	p := gptOSSPrompts(c)
	ix, m, w := captureWorker(t, 0)
	c.replayClean(t, w, 0, 4) // A's blocks 0-8 in both groups
	wantLayout(t, w, "seq 3", "0:sliding_window:cap:128:16:9 1:full_attention:prefix:0:16:9")
	wantHit(t, ix, m, w, "A9 after seq 3", prompt(16, 9, p.a), 9, 0, -1)

	// seq 4: the window group lost a0 and a1. A 10-block hit needs a2-a9,
	// all held; a 6-block one needs a0-a5 (shorter than the window: every
	// block from the first), and a0 is gone.
	c.replayClean(t, w, 4, 5)
	wantLayout(t, w, "seq 4", "0:sliding_window:cap:128:16:9 1:full_attention:prefix:0:16:11")
	wantHit(t, ix, m, w, "A10 after seq 4", prompt(16, 10, p.a), 10, 0, -1)
	wantHit(t, ix, m, w, "A6 after seq 4", prompt(16, 6, p.a), 0, 6, 0)

	c.replayClean(t, w, 5, 6) // a10 in both groups: a3-a10 held for L = 11
	wantHit(t, ix, m, w, "A11 after seq 5", prompt(16, 11, p.a), 11, 0, -1)

	// seq 6: the window group lost a2, a10 and a9: for L = 11 it holds
	// a3-a8, 6 of the 8 blocks, and no shorter cut has 8 (a0-a2 gone).
	c.replayClean(t, w, 6, 7)
	wantLayout(t, w, "seq 6", "0:sliding_window:cap:128:16:8 1:full_attention:prefix:0:16:13")
	wantHit(t, ix, m, w, "A11 after seq 6", prompt(16, 11, p.a), 0, 11, 0)
	wantHit(t, ix, m, w, "C after seq 6", prompt(16, 2, p.c), 2, 0, -1) // 2 blocks from the first: a hit

	// seq 7: the window group lost a8-a3, the full-attention group a10-a8.
	c.replayClean(t, w, 7, 8)
	wantLayout(t, w, "seq 7", "0:sliding_window:cap:128:16:6 1:full_attention:prefix:0:16:14")
	wantHit(t, ix, m, w, "A11 after seq 7", prompt(16, 11, p.a), 0, 8, 0)
	wantHit(t, ix, m, w, "D after seq 7", prompt(16, 4, p.d), 4, 0, -1)
	if s := w.Stats(); s.ResidentBlocks != 14 || s.SideBlocks != 6 || s.UnknownBlocks+s.UnknownGroupBlocks+s.Orphans+s.InvalidEvents != 0 || m.BlockSize() != 16 {
		t.Fatalf("end: %+v, model at %d", s, m.BlockSize())
	}
}

// TestVLLMHybridWindowLateJoin: kvindex joins gpt-oss's stream late. A
// window-group removal of a block it never saw is counted (as an unknown
// block once the group was stored, an unknown group's block before), and
// never touches the full-attention group.
func TestVLLMHybridWindowLateJoin(t *testing.T) {
	c := loadCapture(t, "vllm-hybrid-window.json")
	p := gptOSSPrompts(c)
	for _, tc := range []struct {
		from int
		// after seq 6: the groups, and the full-attention group's blocks
		// the window removals of seq 4 and 6 must have left.
		at6 string
		// at the end: the groups and counters.
		end                            string
		unknown, unknownGroup, orphans int64
		cBlocks                        int
	}{
		// From seq 1: a6 onwards, chained to an unseen parent. The seq 4
		// removals of a0 and a1 (stored in seq 0) and seq 6's of a2 are of
		// blocks never seen; a10 and a9 leave the window group only.
		{1, "0:sliding_window:cap:128:16:5 1:full_attention:prefix:0:16:7",
			"0:sliding_window:cap:128:16:6 1:full_attention:prefix:0:16:8", 2 + 1 + 3, 0, 2, 2},
		// From seq 4, the late-join point: a9 is an orphan in both groups.
		{4, "0:sliding_window:cap:128:16:2 1:full_attention:prefix:0:16:4",
			"0:sliding_window:cap:128:16:6 1:full_attention:prefix:0:16:6", 2 + 1 + 6 + 1, 0, 2, 2},
		// From seq 6: its window removals come before any store of the
		// group: counted as an unknown group's, nothing touched.
		{6, "0:sliding_window:cap:128:16:1 1:full_attention:prefix:0:16:1",
			"0:sliding_window:cap:128:16:5 1:full_attention:prefix:0:16:5", 6 + 3, 3, 2, 0},
		// From seq 7: both groups' removals come before their stores.
		{7, "", "0:sliding_window:cap:128:16:4 1:full_attention:prefix:0:16:4", 0, 9, 0, 0},
	} {
		t.Run(fmt.Sprintf("from seq %d", tc.from), func(t *testing.T) {
			ix, m, w := captureWorker(t, 0)
			err := c.replay(t, w, tc.from, max(tc.from, 7))
			if tc.at6 != "" {
				wantLayout(t, w, "seq 6", tc.at6)
			}
			err = errors.Join(err, c.replay(t, w, max(tc.from, 7), 8))
			wantLayout(t, w, "the end", tc.end)
			s := w.Stats()
			if s.UnknownBlocks != tc.unknown || s.UnknownGroupBlocks != tc.unknownGroup || s.Orphans != tc.orphans || s.InvalidEvents != 0 {
				t.Fatalf("unknown %d, unknown group %d, orphans %d, invalid %d; want %d, %d, %d, 0",
					s.UnknownBlocks, s.UnknownGroupBlocks, s.Orphans, s.InvalidEvents, tc.unknown, tc.unknownGroup, tc.orphans)
			}
			if err == nil {
				t.Fatal("no apply error for blocks never seen")
			}
			wantHit(t, ix, m, w, "D", prompt(16, 4, p.d), 4, 0, -1)
			wantHit(t, ix, m, w, "C", prompt(16, 2, p.c), tc.cBlocks, 0, -1)
		})
	}

	// With the window group's stores of seq 0-5 withheld, every window
	// removal of seq 4 and 6 is for a group never stored and names a block
	// the full-attention group holds: counted (2 + 3), and the
	// full-attention group keeps all 13 blocks (A's prefix is 11).
	ix, m, w := captureWorker(t, 0)
	d := events.NewDecoder()
	for seq := range 7 {
		var b events.Batch
		if err := d.Decode(c.payloads[seq], &b); err != nil {
			t.Fatal(err)
		}
		b.Events = slices.DeleteFunc(b.Events, func(e events.Event) bool {
			return seq < 6 && e.Kind == events.KindBlockStored && e.GroupIdx == 0
		})
		if err := w.ApplyBatch(&b); (err != nil) != (seq == 4 || seq == 6) {
			t.Fatalf("seq %d: %v", seq, err)
		}
	}
	wantLayout(t, w, "seq 6 without the window's stores", "0:sliding_window:cap:128:16:1 1:full_attention:prefix:0:16:13")
	if s := w.Stats(); s.UnknownGroupBlocks != 5 || s.UnknownBlocks != 0 || s.BlocksRemoved != 0 {
		t.Fatalf("stats %+v, want 5 unknown group blocks and nothing removed", s)
	}
	// The window group holds none of A's blocks: no hit.
	wantHit(t, ix, m, w, "A11", prompt(16, 11, p.a), 0, 11, 0)
}

// TestVLLMHybridMambaCapture: Qwen3-Next's three mamba groups (0-2) and
// full-attention group (3, the anchor), 544-token blocks. In align mode a
// mamba store names the state of a chunk's last block only, its token_ids
// spanning the chunk. vLLM's rule for a hit of L blocks: every mamba group
// holds the state at block L-1, else the hit is the longest shorter L
// where they do. Without the cap, "A2 after seq 2" and "A3 after seq 3"
// would answer 2 and 1 blocks instead of 0.
func TestVLLMHybridMambaCapture(t *testing.T) {
	const bs = 544
	c := loadCapture(t, "vllm-hybrid-mamba.json")
	a := slices.Concat(c.ev(0, 3).TokenIDs, c.ev(1, 3).TokenIDs) // A's blocks 0-2
	b := prompt(bs, 1, c.ev(2, 6).TokenIDs)
	ix, m, w := captureWorker(t, 0)
	mamba := func(n, full int) string {
		return fmt.Sprintf("0:mamba:cap:0:544:%d 1:mamba:cap:0:544:%d 2:mamba:cap:0:544:%d 3:full_attention:prefix:0:544:%d", n, n, n, full)
	}
	c.replayClean(t, w, 0, 1) // a1's state in each mamba group, a0-a1 in full attention
	if m.BlockSize() != bs || w.Stats().BlockSize != bs || w.Stats().BlockSizeMismatches != 0 {
		t.Fatalf("model at %d, worker at %d (%d mismatches), want %d learned", m.BlockSize(), w.Stats().BlockSize, w.Stats().BlockSizeMismatches, bs)
	}
	wantLayout(t, w, "seq 0", mamba(1, 2))
	wantHit(t, ix, m, w, "A2 after seq 0", prompt(bs, 2, a), 2, 0, -1)

	c.replayClean(t, w, 1, 2) // a2 in every group
	wantLayout(t, w, "seq 1", mamba(2, 3))
	wantHit(t, ix, m, w, "A3 after seq 1", prompt(bs, 3, a), 3, 0, -1)
	wantHit(t, ix, m, w, "A2 after seq 1", prompt(bs, 2, a), 2, 0, -1) // a1's state

	// seq 2: a1's state evicted from the mamba groups (full attention keeps
	// a1); B's block in every group. For L = 2 no group holds a state at
	// block 1 or 0: no hit. For L = 3, a2's state serves.
	c.replayClean(t, w, 2, 3)
	wantLayout(t, w, "seq 2", mamba(2, 4))
	wantHit(t, ix, m, w, "A2 after seq 2", prompt(bs, 2, a), 0, 2, 0)
	wantHit(t, ix, m, w, "A3 after seq 2", prompt(bs, 3, a), 3, 0, -1)
	wantHit(t, ix, m, w, "B after seq 2", b, 1, 0, -1)

	// seq 3: a2's state evicted, then full attention's a2 and a1: its prefix
	// of A is a0, whose state no mamba group ever held.
	c.replayClean(t, w, 3, 4)
	wantLayout(t, w, "seq 3", mamba(1, 2))
	wantHit(t, ix, m, w, "A3 after seq 3", prompt(bs, 3, a), 0, 1, 0)
	wantHit(t, ix, m, w, "B after seq 3", b, 1, 0, -1)
	if s := w.Stats(); s.SideBlocks != 3 || s.UnknownBlocks+s.InvalidEvents+s.Orphans+s.UnknownGroupBlocks != 0 {
		t.Fatalf("end: %+v", s)
	}
}

// TestVLLMTierCaptures: the offloading connector's tiers. With
// self-describing events (vllm-locality.json) each offloaded block is
// named with its tokens, and the CPU, local STORAGE and shared (REMOTE,
// held as EXTERNAL) tiers are each credited with the whole prefix. Without
// (vllm-tiers.json), a placeholder names a chunk by its last block only
// and says nothing of the chunk's size, so kvindex marks that block alone:
// no tier holds the prompt's first block and no tier prefix is credited
// (vLLM's connector would load the chunk whole). Media are listed as GPU,
// CPU, STORAGE, DISK, EXTERNAL, OTHER.
func TestVLLMTierCaptures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks int // A's blocks (the GPU store of seq 0)
		steps  []struct {
			blocks          int
			media, resident string
		}
	}{
		{"vllm-locality.json", 4, []struct {
			blocks          int
			media, resident string
		}{
			{4, "[4 0 0 0 0 0]", "[4 0 0 0 0 0]"}, // seq 0: GPU
			{4, "[4 4 0 0 0 0]", "[4 4 0 0 0 0]"}, // seq 1: the CPU tier
			{4, "[4 4 4 0 0 0]", "[4 4 4 0 0 0]"}, // seq 2: the local tier (LOCAL)
			{4, "[4 4 4 0 4 0]", "[4 4 4 0 4 0]"}, // seq 3: the shared tier (REMOTE): EXTERNAL
			{4, "[4 0 4 0 0 0]", "[4 0 4 0 0 0]"}, // seq 4: the shared and CPU tiers evict
			{4, "[4 0 0 0 0 0]", "[4 0 0 0 0 0]"}, // seq 5: the local tier evicts
		}},
		{"vllm-tiers.json", 8, []struct {
			blocks          int
			media, resident string
		}{
			{8, "[8 0 0 0 0 0]", "[8 0 0 0 0 0]"}, // seq 0: GPU
			{8, "[8 0 0 0 0 0]", "[8 2 0 0 0 0]"}, // seq 1: CPU, chunks 0 and 1 (blocks 3, 7)
			{8, "[8 0 0 0 0 0]", "[8 2 2 0 1 0]"}, // seq 2: local both, shared (EXTERNAL) chunk 0
			{6, "[6 0 0 0 0 0]", "[6 1 2 0 1 0]"}, // seq 3: GPU evicts 7 and 6, CPU chunk 1
			{6, "[6 0 0 0 0 0]", "[6 1 0 0 0 0]"}, // seq 4: the secondary tiers evict
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := loadCapture(t, tc.name)
			ix, m, w := captureWorker(t, 0)
			a := prompt(16, tc.blocks, c.ev(0, 0).TokenIDs)
			if len(tc.steps) != len(c.payloads) {
				t.Fatalf("%d steps for %d messages", len(tc.steps), len(c.payloads))
			}
			for seq, st := range tc.steps {
				c.replayClean(t, w, seq, seq+1)
				h := wantHit(t, ix, m, w, fmt.Sprintf("A after seq %d", seq), a, st.blocks, 0, -1)
				if got := fmt.Sprint(h.media); got != st.media {
					t.Fatalf("seq %d: A's prefix per medium %s, want %s", seq, got, st.media)
				}
				if got := fmt.Sprint(w.Stats().ResidentByMedium); got != st.resident {
					t.Fatalf("seq %d: resident per medium %s, want %s", seq, got, st.resident)
				}
				// Offloads keep the group as the GPU stores described it.
				wantLayout(t, w, fmt.Sprintf("seq %d", seq), fmt.Sprintf("0:full_attention:prefix:0:16:%d", w.Stats().ResidentBlocks))
			}
			if s := w.Stats(); s.UnknownBlocks+s.InvalidEvents+s.LayoutChanges != 0 {
				t.Fatalf("end: %+v", s)
			}
		})
	}
}
