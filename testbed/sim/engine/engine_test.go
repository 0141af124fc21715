package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// req builds a request whose prompt is the given segments.
func req(id, out int, segs ...workload.Segment) *workload.Request {
	r := &workload.Request{ID: id, Prompt: segs, OutputLen: out}
	for _, s := range segs {
		r.PromptLen += s.Len
	}
	return r
}

// tiny returns an engine with 4-token blocks and KV events on.
func tiny(t *testing.T, blocks, budget int) *Engine {
	t.Helper()
	e, err := New(0, Config{BlockSize: 4, CacheBlocks: blocks, MaxBatchedTokens: budget, Events: true, HashSeed: 7})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func submit(t *testing.T, e *Engine, r *workload.Request) {
	t.Helper()
	content := r.AppendBlockContent(nil, e.cfg.BlockSize, r.OutputSegment(e.cfg.OutputSeed))
	if !e.Submit(r, content) {
		t.Fatalf("request %d rejected", r.ID)
	}
}

// step runs one step at time now and returns its result and a compact
// rendering of its events ("S[a b]<p" stored with parent, "R[h]" removed),
// with hashes renamed through names (new hashes get the next letter).
func step(t *testing.T, e *Engine, now time.Duration, names map[uint64]string) (*StepResult, string) {
	t.Helper()
	d, ok := e.StartStep(now)
	if !ok {
		t.Fatal("nothing to schedule")
	}
	res := e.FinishStep(now + d)
	if res.Batch == nil {
		return res, ""
	}
	name := func(h uint64) string {
		if n, ok := names[h]; ok {
			return n
		}
		n := string(rune('a' + len(names)))
		names[h] = n
		return n
	}
	var parts []string
	for _, ev := range res.Batch.Events {
		var hs []string
		for _, h := range ev.BlockHashes {
			hs = append(hs, name(h))
		}
		switch ev.Kind {
		case events.KindBlockStored:
			p := "-"
			if ev.HasParent {
				p = name(ev.ParentHash)
			}
			if len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize || ev.BlockSize != 4 || ev.MediumName != "GPU" {
				t.Fatalf("BlockStored %+v: %d tokens for %d blocks", ev, len(ev.TokenIDs), len(ev.BlockHashes))
			}
			parts = append(parts, "S["+strings.Join(hs, " ")+"]<"+p)
		case events.KindBlockRemoved:
			parts = append(parts, "R["+strings.Join(hs, " ")+"]")
		default:
			parts = append(parts, ev.Kind.String())
		}
	}
	return res, strings.Join(parts, " ")
}

func TestScriptedEventsMatchVLLM(t *testing.T) {
	e := tiny(t, 8, 64)
	names := map[uint64]string{}
	// A: 10 prompt tokens (2 full blocks + 2), 3 output tokens.
	a := req(1, 3, workload.Segment{ID: 100, Len: 10})
	submit(t, e, a)

	// Step 1 prefills A: blocks a, b become full; first token.
	res, evs := step(t, e, 0, names)
	if evs != "S[a b]<-" {
		t.Fatalf("step 1 events %q", evs)
	}
	if len(res.FirstTokens) != 1 || res.FirstTokens[0].CachedTokens != 0 {
		t.Fatalf("step 1 first tokens %+v", res.FirstTokens)
	}
	// Step 2 decodes token 11 (position 10): no block fills.
	if _, evs = step(t, e, time.Second, names); evs != "" {
		t.Fatalf("step 2 events %q", evs)
	}
	// Step 3 computes position 11: block c (2 prompt + 2 output tokens)
	// fills, chained on b; A generates its 3rd token and finishes.
	res, evs = step(t, e, 2*time.Second, names)
	if evs != "S[c]<b" || len(res.Finished) != 1 {
		t.Fatalf("step 3 events %q, finished %d", evs, len(res.Finished))
	}

	// B shares A's first 8 prompt tokens: a hit emits nothing; only its new
	// block d is stored, chained on b.
	b := req(2, 1, workload.Segment{ID: 100, Len: 8}, workload.Segment{ID: 200, Len: 5})
	submit(t, e, b)
	res, evs = step(t, e, 3*time.Second, names)
	if evs != "S[d]<b" {
		t.Fatalf("B events %q", evs)
	}
	if res.FirstTokens[0].CachedTokens != 8 {
		t.Fatalf("B hit %d tokens, want 8", res.FirstTokens[0].CachedTokens)
	}
	if got := e.CachedBlocks(); got != 4 {
		t.Fatalf("cached blocks %d, want 4 (a b c d)", got)
	}

	// C needs 6 new blocks in a cache of 8 with 4 cached, all free. The
	// free queue holds, least recently freed first: the 4 never-used blocks,
	// then A's blocks in reverse (c b a; freed at step 3), then B's (d b a
	// minus the shared ones). So C's 6th block evicts A's tail block c,
	// then its parent... lazily, one BlockRemoved per evicted block.
	c := req(3, 1, workload.Segment{ID: 300, Len: 24})
	submit(t, e, c)
	_, evs = step(t, e, 4*time.Second, names)
	if evs != "R[c] R[d] S[e f g h i j]<-" {
		t.Fatalf("C events %q", evs)
	}
}

func TestFullPromptHitStillComputesOneToken(t *testing.T) {
	e := tiny(t, 16, 64)
	names := map[uint64]string{}
	a := req(1, 1, workload.Segment{ID: 9, Len: 8})
	submit(t, e, a)
	step(t, e, 0, names)
	// The same 8-token prompt: vLLM caps the hit at (8-1)/4 = 1 block and
	// recomputes block 2, storing it again (a duplicate of b).
	b := req(2, 1, workload.Segment{ID: 9, Len: 8})
	submit(t, e, b)
	res, evs := step(t, e, time.Second, names)
	if res.FirstTokens[0].CachedTokens != 4 {
		t.Fatalf("hit %d tokens, want 4", res.FirstTokens[0].CachedTokens)
	}
	if evs != "S[b]<a" {
		t.Fatalf("events %q, want a second store of b", evs)
	}
}

func TestDuplicateStoresAreRefcounted(t *testing.T) {
	// Chunked prefill: A's 16-token prompt takes 12 tokens in step 1 and 4
	// in step 2, where B (the same prompt) is admitted with A's 3 blocks as
	// hits and computes block 4 too: two stores of the same hash.
	e := tiny(t, 32, 12)
	names := map[uint64]string{}
	a := req(1, 2, workload.Segment{ID: 5, Len: 16})
	b := req(2, 2, workload.Segment{ID: 5, Len: 16})
	submit(t, e, a)
	if _, evs := step(t, e, 0, names); evs != "S[a b c]<-" {
		t.Fatalf("step 1 %q", evs)
	}
	submit(t, e, b)
	_, evs := step(t, e, time.Second, names)
	if evs != "S[d]<c S[d]<c" {
		t.Fatalf("step 2 %q, want two stores of d", evs)
	}
	h := e.p.cached.get(findHash(names, "d"))
	if h == none || e.p.blocks[h].dup == none {
		t.Fatal("the two copies of d are not chained")
	}
	// Evicting one copy keeps the hash cached.
	e.p.uncache(h)
	if e.p.lookup(findHash(names, "d")) == none {
		t.Fatal("hash d gone after evicting one of two copies")
	}
}

func findHash(names map[uint64]string, n string) uint64 {
	for h, v := range names {
		if v == n {
			return h
		}
	}
	panic("no hash named " + n)
}

func TestPreemptionRecomputesAndFinishes(t *testing.T) {
	// 6 blocks of 4 tokens: two requests of 8-token prompts and 12 output
	// tokens need 5 blocks each at the end, so one is preempted.
	e := tiny(t, 6, 64)
	a := req(1, 12, workload.Segment{ID: 1, Len: 8})
	b := req(2, 12, workload.Segment{ID: 2, Len: 8})
	submit(t, e, a)
	submit(t, e, b)
	done := map[int]bool{}
	now := time.Duration(0)
	for i := 0; i < 200 && !e.Idle(); i++ {
		d, ok := e.StartStep(now)
		if !ok {
			t.Fatal("stalled")
		}
		now += d
		for _, r := range e.FinishStep(now).Finished {
			done[r.ID] = true
		}
	}
	if !done[1] || !done[2] {
		t.Fatalf("finished %v", done)
	}
	st := e.Stats()
	if st.Preemptions == 0 {
		t.Fatal("no preemption")
	}
	if st.PrefillTokens <= 16 {
		t.Fatalf("prefill tokens %d: recomputation not counted", st.PrefillTokens)
	}
	if e.p.numFree != 6 {
		t.Fatalf("%d free blocks after all finished, want 6", e.p.numFree)
	}
}

func TestRejectsWhatCanNeverFit(t *testing.T) {
	e := tiny(t, 4, 64)
	r := req(1, 1, workload.Segment{ID: 1, Len: 16})
	if e.Submit(r, r.AppendBlockContent(nil, 4, r.OutputSegment(0))) {
		t.Fatal("a 17-token sequence fits 4 blocks of 4?")
	}
	if e.Stats().Rejected != 1 {
		t.Fatal("rejection not counted")
	}
}

func TestStepTime(t *testing.T) {
	tm := TimeModel{PrefillTokensPerSec: 1000, StepOverhead: 5 * time.Millisecond, DecodePerSeq: time.Millisecond, DecodePerContextToken: time.Microsecond}
	// 5ms + 500 tokens/1000/s + 2 x 1ms + 3000 x 1us = 5 + 500 + 2 + 3 ms.
	if got, want := tm.StepTime(500, 0, 2, 3000), 510*time.Millisecond; got != want {
		t.Fatalf("StepTime = %v, want %v", got, want)
	}
}

func TestBudgetChunksPrefillAndQueuesFIFO(t *testing.T) {
	e := tiny(t, 64, 8)
	a := req(1, 1, workload.Segment{ID: 1, Len: 20})
	b := req(2, 1, workload.Segment{ID: 2, Len: 4})
	submit(t, e, a)
	submit(t, e, b)
	var firsts []int
	now := time.Duration(0)
	for i := 0; i < 10 && !e.Idle(); i++ {
		d, _ := e.StartStep(now)
		now += d
		for _, ft := range e.FinishStep(now).FirstTokens {
			firsts = append(firsts, ft.Req.ID)
		}
	}
	// A takes 8+8+4 tokens over three steps; B is admitted in step 3 with
	// the 4 left: both get their first token in step 3, A first.
	if !slices.Equal(firsts, []int{1, 2}) || e.Stats().Steps != 3 {
		t.Fatalf("first tokens %v after %d steps", firsts, e.Stats().Steps)
	}
}

func TestTableAgainstMap(t *testing.T) {
	tb := newTable(500)
	ref := map[uint64]int32{}
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, 800)
	for i := range keys {
		// Low-entropy keys force long probe runs and wraparound.
		keys[i] = uint64(rng.IntN(4096)) << 3
	}
	for i := range 200000 {
		k := keys[rng.IntN(len(keys))]
		switch {
		case rng.IntN(3) == 0:
			tb.del(k)
			delete(ref, k)
		case len(ref) < 500:
			tb.set(k, int32(i))
			ref[k] = int32(i)
		}
		if i%97 == 0 {
			for _, k := range keys {
				want, ok := ref[k]
				if !ok {
					want = none
				}
				if got := tb.get(k); got != want {
					t.Fatalf("op %d: get(%#x) = %d, want %d", i, k, got, want)
				}
			}
			if tb.len() != len(ref) {
				t.Fatalf("len %d, want %d", tb.len(), len(ref))
			}
		}
	}
}

func TestHashesAreChainedAndSeeded(t *testing.T) {
	a, _ := New(0, Config{HashSeed: 1})
	b, _ := New(1, Config{HashSeed: 2})
	c1 := []uint64{10, 20, 30}
	c2 := []uint64{11, 20, 30}
	ha, hb := a.BlockHashes(nil, c1), b.BlockHashes(nil, c1)
	h2 := a.BlockHashes(nil, c2)
	for i := range ha {
		if ha[i] == hb[i] {
			t.Fatalf("block %d: engines with different seeds agree", i)
		}
		if ha[i] == h2[i] {
			t.Fatalf("block %d: a different first block did not change the chain", i)
		}
	}
	if fmt.Sprint(ha) != fmt.Sprint(a.BlockHashes(nil, c1)) {
		t.Fatal("not deterministic")
	}
}

func TestAttentionTerm(t *testing.T) {
	if got := AttentionPairs(4, 10); got != 4*10+10 {
		t.Fatalf("pairs of 4 tokens after 10 = %d, want 50", got)
	}
	tm := DefaultTimeModel()
	// 10,000 uncached tokens alone (one chunk, no overhead): 0.5714 s of
	// linear prefill plus 5.0005e7 pairs at 9.4e8/s = 0.6246 s, 16,000
	// tokens/s.
	d := tm.StepTime(10000, AttentionPairs(10000, 0), 0, 0) - tm.StepOverhead
	if rate := 10000 / d.Seconds(); rate < 15900 || rate > 16100 {
		t.Errorf("10,000 tokens prefill at %.0f tokens/s, want 16,000", rate)
	}
	if (TimeModel{PrefillTokensPerSec: 1}).StepTime(0, 1e9, 0, 0) != 0 {
		t.Error("a model without attention charges attention")
	}
	// A step's duration includes its chunks' attention.
	e := tiny(t, 1024, 16)
	cfg := e.Config()
	cfg.Time = TimeModel{PrefillTokensPerSec: 1e6, AttentionPairsPerSec: 1e6}
	e2, err := New(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := req(1, 1, workload.Segment{ID: 1, Len: 16})
	submit(t, e2, r)
	d, ok := e2.StartStep(0)
	// 16 tokens: 16 us linear + 136 pairs = 136 us.
	if want := cfg.Time.StepOverhead + 16*time.Microsecond + 136*time.Microsecond; !ok || d != want {
		t.Errorf("step %v, want %v", d, want)
	}
}
