package integration

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestExtraKeysMediaAndGroups: blocks whose extra keys carry a cache_salt
// or multimodal identifiers match only prompts that give the same inputs;
// CPU-offload events (empty token_ids) add a tier to known blocks; events
// of a sliding-window group do not inflate residency. Over real ZMQ, in
// both event encodings.
func TestExtraKeysMediaAndGroups(t *testing.T) {
	for _, e := range encodings {
		t.Run(e.name, func(t *testing.T) {
			f := startFleet(t, podSpec{name: "a", enc: e.enc})
			var eng engine
			tup := func(vals ...any) events.ExtraKeys {
				b := events.AppendTuple(nil, len(vals))
				for _, v := range vals {
					switch x := v.(type) {
					case string:
						b = events.AppendString(b, x)
					case int:
						b = events.AppendInt(b, int64(x))
					case events.ExtraKeys:
						b = append(b, x...)
					}
				}
				return b
			}

			// A salted prompt: cache_salt in block 0's extra keys only.
			salted := tokens("salted", 3*blockSize)
			ev, _ := eng.store(0, salted)
			ev.ExtraKeys = []events.ExtraKeys{tup("tenant-7-salt"), nil, nil}
			f.publish("a", 0, ev)
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: salted, CacheSalt: "tenant-7-salt"}), "a", 0); n != 3 {
				t.Fatalf("same salt: %d, want 3", n)
			}
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: salted}), "a", 0); n != 0 {
				t.Fatalf("unsalted prompt matched salted blocks: %d", n)
			}
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: salted, CacheSalt: "tenant-8-salt"}), "a", 0); n != 0 {
				t.Fatalf("other salt matched: %d", n)
			}
			unsalted := tokens("unsalted", 2*blockSize)
			ev, _ = eng.store(0, unsalted)
			f.publish("a", 0, ev)
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: unsalted, CacheSalt: "x"}), "a", 0); n != 0 {
				t.Fatalf("salted prompt matched unsalted blocks: %d", n)
			}

			// A multimodal prompt: an image's (identifier, offset) in the
			// extra keys of the blocks it covers.
			mm := tokens("image placeholder tokens", 4*blockSize)
			ev, _ = eng.store(0, mm)
			ev.ExtraKeys = []events.ExtraKeys{nil, tup(tup("mm-uuid-A", 0)), tup(tup("mm-uuid-A", 0)), nil}
			f.publish("a", 0, ev)
			img := func(id string) *kvindexv1.ExtraKeys {
				return &kvindexv1.ExtraKeys{Values: []*kvindexv1.ExtraValue{{Kind: &kvindexv1.ExtraValue_Tuple{Tuple: &kvindexv1.ExtraKeys{Values: []*kvindexv1.ExtraValue{
					{Kind: &kvindexv1.ExtraValue_Str{Str: id}}, {Kind: &kvindexv1.ExtraValue_Int{Int: 0}},
				}}}}}}
			}
			same := []*kvindexv1.ExtraKeys{{}, img("mm-uuid-A"), img("mm-uuid-A"), {}}
			other := []*kvindexv1.ExtraKeys{{}, img("mm-uuid-B"), img("mm-uuid-B"), {}}
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: mm, BlockExtraKeys: same}), "a", 0); n != 4 {
				t.Fatalf("same image: %d, want 4", n)
			}
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: mm, BlockExtraKeys: other}), "a", 0); n != 1 {
				t.Fatalf("another image with the same placeholder tokens: %d, want 1 (the text block before it)", n)
			}

			// CPU offload of the unsalted prompt's blocks, then GPU eviction.
			var hashes []uint64
			evU, hs := eng.store(0, unsalted)
			f.publish("a", 0, evU)
			hashes = hs
			f.publish("a", 0, events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, MediumName: "cpu"}) // LMCache's lower case
			f.publish("a", 0, events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes[1:], MediumName: "GPU"})
			_, by := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: unsalted}), "a", 0)
			if by["CPU"] != 2 || by["GPU"] != 2 {
				// GPU still holds both blocks of the first store (two stores, one removal).
				t.Fatalf("by medium %v, want GPU 2 CPU 2", by)
			}

			// A hybrid model's sliding-window group, learned from its spec
			// kind: its removals never touch the full-attention group's
			// residency, but vLLM realizes a hit only where the window
			// group holds the blocks before the cut, so the answer is capped
			// and says by which group.
			sw := tokens("sliding", 2*blockSize)
			full, fh := eng.store(0, sw)
			full.SpecKind, full.GroupIdx, full.HasGroupIdx = "full_attention", 0, true
			win := full
			win.SpecKind, win.GroupIdx, win.SlidingWindow, win.HasSlidingWindow = "sliding_window", 1, 4096, true
			f.publish("a", 0, full, win)
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: sw}), "a", 0); n != 2 {
				t.Fatalf("both groups hold the prompt: %d, want 2", n)
			}
			f.publish("a", 0, events.Event{Kind: events.KindBlockRemoved, BlockHashes: fh, MediumName: "GPU", GroupIdx: 1, HasGroupIdx: true})
			resp := f.score(&kvindexv1.ScoreRequest{TokenIds: sw})
			var ws *kvindexv1.WorkerScore
			for _, s := range resp.GetWorkers() {
				if s.GetWorker().GetPod() == "a" {
					ws = s
				}
			}
			if ws == nil || ws.GetMatchedBlocks() != 0 || ws.GetPrefixBlocks() != 2 || ws.GetCappedBy().GetIndex() != 1 || ws.GetCappedBy().GetKind() != "sliding_window" {
				t.Fatalf("after the window's removal: %v, want 0 blocks capped by group 1 from a prefix of 2", ws)
			}
			if w := f.status("a", 0); w.GetSkippedGroupEvents() != 0 || len(w.GetGroups()) != 2 || w.GetGroups()[1].GetRole() != "cap" || w.GetGroups()[1].GetSlidingWindow() != 4096 {
				t.Fatalf("status: %v", w)
			}
		})
	}
}

// TestSGLangEngine: an engine speaking SGLang's variant (map events with
// signed int64 hashes, attention-DP rank in the envelope, cache_salt on the
// event) is indexed like vLLM's, salt included.
func TestSGLangEngine(t *testing.T) {
	f := startFleet(t, podSpec{name: "sgl", dpSize: 2, enc: events.EncodeOptions{Encoding: events.EncodingMap, HashForm: events.HashInt64}})
	var eng engine
	p := tokens("sglang prompt", 4*blockSize)
	ev, h := eng.store(0, p[:2*blockSize])
	ev.CacheSalt = "s1"
	ev2, _ := eng.store(h[1], p[2*blockSize:])
	ev2.MediumName = "CPU_PINNED"
	f.publish("sgl", 1, ev, ev2)
	// Blocks 0-1 on GPU, 2-3 in pinned host memory: 4 in any medium, a
	// GPU prefix of 2, and no CPU prefix (block 0 is not on CPU).
	n, by := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: p, CacheSalt: "s1"}), "sgl", 1)
	if n != 4 || by["GPU"] != 2 || by["CPU"] != 0 {
		t.Fatalf("salted SGLang prompt: %d %v, want 4 (GPU 2, CPU 0)", n, by)
	}
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: p}), "sgl", 1); n != 0 {
		t.Fatalf("unsalted prompt matched SGLang's salted blocks: %d", n)
	}
}

// TestCapacityBoundsLostRemovals: a worker configured with a capacity of
// 4 blocks that is told of 6 (its engine's removals were lost) keeps the 4
// stored most recently, and says so.
func TestCapacityBoundsLostRemovals(t *testing.T) {
	f := startFleet(t, podSpec{name: "a", capacity: 4})
	var eng engine
	old := tokens("old", 2*blockSize)
	fresh := tokens("fresh", 4*blockSize)
	ev, _ := eng.store(0, old)
	f.publish("a", 0, ev)
	ev, _ = eng.store(0, fresh)
	f.publish("a", 0, ev)
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: fresh}), "a", 0); n != 4 {
		t.Fatalf("fresh: %d, want 4", n)
	}
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: old}), "a", 0); n != 0 {
		t.Fatalf("old blocks beyond capacity still match: %d", n)
	}
	w := f.status("a", 0)
	if w.GetEvictions() != 2 || w.GetCapacity() != 4 || w.GetResidentBlocks() != 4 {
		t.Fatalf("status %v", w)
	}
	if !strings.Contains(f.metrics(), `kvindex_evictions_total{dp_rank="0",model="test/model",pod="a",reason="capacity"} 2`) {
		t.Fatal("/metrics lacks the capacity evictions")
	}
}
