package indexer

// The cost of tracking a hybrid model's other KV-cache groups (groups.go,
// cap.go) against the prefix-only index, each measured beside a
// prefix-only worker fed the same workload in the same run:
//
//	go test -run '^$' -bench 'Hybrid' -count 3 ./indexer
//
// The layouts are vLLM's for three model families, group indices as vLLM
// numbers them (testbed/sim/engine's presets), all at 16-token blocks so
// that the workload is BenchmarkApply's and BenchmarkScore128x8's:
// gpt-oss (a 128-token sliding window, then full attention), Gemma 3 (five
// 1,024-token windows, then full attention) and Qwen3-Next (three mamba
// groups, then full attention; vLLM runs it at 544-token blocks).

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
)

// benchLayout is a model's KV-cache groups in group_idx order; the last
// is its full-attention group, the worker's anchor.
type benchLayout struct {
	name   string
	groups []benchGroup
}

type benchGroup struct {
	kind   string
	window int // tokens (sliding_window)
}

// keep is how many of a request's last blocks the group keeps as the
// request advances (0: all): a window's cdiv(window-1, block size), as
// vLLM frees the blocks wholly before the next token's window; mamba one,
// the last state.
func (g benchGroup) keep() int {
	switch g.kind {
	case "sliding_window":
		return (g.window - 1 + benchBS - 1) / benchBS
	case "mamba":
		return 1
	}
	return 0
}

func (l *benchLayout) sideGroups() int { return len(l.groups) - 1 }

func (l *benchLayout) event(g int, ev events.Event) events.Event {
	ev.GroupIdx, ev.HasGroupIdx, ev.SpecKind = g, true, l.groups[g].kind
	ev.SlidingWindow, ev.HasSlidingWindow = l.groups[g].window, l.groups[g].window > 0
	return ev
}

func benchLayouts() []benchLayout {
	window := func(w int) benchGroup { return benchGroup{"sliding_window", w} }
	full := benchGroup{"full_attention", 0}
	return []benchLayout{
		{"gpt-oss", []benchGroup{window(128), full}},
		{"gemma3", append(slices.Repeat([]benchGroup{window(1024)}, 5), full)},
		{"qwen3-next", append(slices.Repeat([]benchGroup{{"mamba", 0}}, 3), full)},
	}
}

// hybridStream is applyStream as a hybrid engine sends it: every group
// stores each store's blocks, in group order, and a side group removes a
// request's blocks as the request advances past what the group keeps (in
// the batch of the store that advances it), or with the anchor's removal
// of the block, whichever comes first. (vLLM's mamba "align" mode stores
// one block per scheduled chunk, with the chunk's tokens; here every group
// stores every block, an upper bound on a mamba group's stores.)
type hybridStream struct {
	*applyStream
	layout  *benchLayout
	removed [][][]uint64 // [batch][group]: blocks removed, one event each
	held    []int        // [group]: blocks held at the end of a lap
}

func newHybridStream(l *benchLayout, ring, window int) *hybridStream {
	s := &hybridStream{applyStream: newApplyStream(1, ring, window, 0, false), layout: l}
	s.removed = make([][][]uint64, ring)
	for i := range s.removed {
		s.removed[i] = make([][]uint64, len(l.groups))
	}
	anchor := len(l.groups) - 1
	s.held = make([]int, len(l.groups))
	for g, gr := range l.groups {
		// gone[b] is the first batch (unwrapped) at which group g removes
		// block b: the anchor's removal, or the request advancing.
		gone := map[uint64]int{}
		var chains [8][]uint64 // each request slot's blocks, in chain order
		for i, cb := range s.batches {
			for slot, st := range cb.stores {
				if !st.hasParent {
					chains[slot] = chains[slot][:0]
				}
				for _, h := range st.hashes {
					chains[slot] = append(chains[slot], h)
					gone[h] = i + window
				}
				if k := gr.keep(); g != anchor && k > 0 {
					c := chains[slot]
					for _, h := range c[:max(len(c)-k, 0)] {
						gone[h] = min(gone[h], i)
					}
				}
			}
		}
		// Each store's blocks are removed last block first, in the order
		// of their stores (applyStream's order).
		for _, cb := range s.batches {
			for _, st := range cb.stores {
				for j := range st.hashes {
					h := st.hashes[len(st.hashes)-1-j]
					if r := gone[h]; r >= ring {
						s.held[g]++
						s.removed[r%ring][g] = append(s.removed[r%ring][g], h)
					} else {
						s.removed[r][g] = append(s.removed[r][g], h)
					}
				}
			}
		}
	}
	return s
}

// fill writes batch i as the hybrid engine sends it into b.
func (s *hybridStream) fill(i int, b *events.Batch) *events.Batch {
	cb := &s.batches[i]
	b.Events = b.Events[:0]
	for _, st := range cb.stores {
		for g := range s.layout.groups {
			b.Events = append(b.Events, s.layout.event(g, events.Event{Kind: events.KindBlockStored, BlockSize: benchBS,
				HasParent: st.hasParent, ParentHash: st.parent, BlockHashes: st.hashes, TokenIDs: st.tokens}))
		}
	}
	for g, hs := range s.removed[i] {
		for j := range hs {
			b.Events = append(b.Events, events.Event{Kind: events.KindBlockRemoved, BlockHashes: hs[j : j+1], GroupIdx: g, HasGroupIdx: true})
		}
	}
	return b
}

// BenchmarkApplyHybrid is apply with removals (BenchmarkApply's stream, a
// worker of about 80 k blocks, one core) on a hybrid worker fed
// hybridStream, beside a prefix-only worker fed the same stream without
// its other groups, batch by batch in the same loop. apply-blocks/s and
// prefix-blocks/s count the blocks the full-attention group stores (the
// side groups store as many, and remove every one); ratio is the first
// over the second; group-ns/block is what each side group adds per block,
// (1/apply - 1/prefix) over the side groups, and group-ratio that over
// the prefix-only worker's ns per block (prefix-ns/block). They are
// measured in the benchmark thread's CPU time (threadCPU), which time
// spent waiting for a CPU on a shared machine does not advance (wall time
// where it cannot be read); wall-ratio is ratio in wall time.
func BenchmarkApplyHybrid(b *testing.B) {
	for _, l := range benchLayouts() {
		b.Run(l.name, func(b *testing.B) {
			const ring, window = 1280, 1024
			s := newHybridStream(&l, ring, window)
			// Unbounded: vLLM sends no removal before its pool is full, but
			// this stream's first lap has side groups remove from its first
			// batch, which would teach the worker a capacity of a few
			// blocks (Config.WorkerCapacity).
			f := newFleet(b, 2, Config{WorkerCapacity: -1})
			pw, hw := f.ws[0], f.ws[1]
			var pb, hb events.Batch
			for i := range s.batches {
				// The first lap removes blocks not stored yet.
				_ = pw.ApplyBatch(s.applyStream.fill(i, &pb))
				_ = hw.ApplyBatch(s.fill(i, &hb))
			}
			checkHybridHeld(b, hw, pw, s)
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			now := func() time.Duration {
				if t, ok := threadCPU(); ok {
					return t
				}
				return time.Duration(time.Now().UnixNano())
			}
			runtime.GC()
			var hybrid, prefix, hybridWall, prefixWall time.Duration
			blocks, i := 0, 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.applyStream.fill(i, &pb)
				s.fill(i, &hb)
				w0, c0 := time.Now(), now()
				if err := hw.ApplyBatch(&hb); err != nil {
					b.Fatal(err)
				}
				w1, c1 := time.Now(), now()
				if err := pw.ApplyBatch(&pb); err != nil {
					b.Fatal(err)
				}
				w2, c2 := time.Now(), now()
				hybrid += c1 - c0
				prefix += c2 - c1
				hybridWall += w1.Sub(w0)
				prefixWall += w2.Sub(w1)
				blocks += s.stored[i]
				if i++; i == len(s.batches) {
					i = 0
				}
			}
			b.StopTimer()
			for ; i != 0; i = (i + 1) % len(s.batches) { // end the lap
				_ = pw.ApplyBatch(s.applyStream.fill(i, &pb))
				if err := hw.ApplyBatch(s.fill(i, &hb)); err != nil {
					b.Fatal(err)
				}
			}
			checkHybridHeld(b, hw, pw, s)
			hr, pr := float64(blocks)/hybrid.Seconds(), float64(blocks)/prefix.Seconds()
			group := (1e9/hr - 1e9/pr) / float64(l.sideGroups())
			b.ReportMetric(hr, "apply-blocks/s")
			b.ReportMetric(pr, "prefix-blocks/s")
			b.ReportMetric(hr/pr, "ratio")
			b.ReportMetric(1e9/pr, "prefix-ns/block")
			b.ReportMetric(group, "group-ns/block")
			b.ReportMetric(group/(1e9/pr), "group-ratio")
			b.ReportMetric(prefixWall.Seconds()/hybridWall.Seconds(), "wall-ratio")
		})
	}
}

// checkHybridHeld checks, at the end of a lap, that every group of hw
// holds what the stream left it and the anchor what pw holds.
func checkHybridHeld(b *testing.B, hw, pw *Worker, s *hybridStream) {
	b.Helper()
	if got, want := hw.Stats().ResidentBlocks, pw.Stats().ResidentBlocks; got != want || want != int64(s.held[len(s.held)-1]) {
		b.Fatalf("hybrid worker holds %d blocks, prefix-only %d, want %d", got, want, s.held[len(s.held)-1])
	}
	for _, g := range hw.Groups() {
		if !g.Anchor && g.Blocks != int64(s.held[g.Index]) {
			b.Fatalf("%s holds %d blocks, want %d", g.describe(), g.Blocks, s.held[g.Index])
		}
	}
}

// storeHybrid stores tokens in w as 16-block events chained from the root,
// each in every group of l whose want says it holds the event's first
// block (the anchor always), group after group as vLLM sends them.
func (f *fleet) storeHybrid(tb testing.TB, w *Worker, l *benchLayout, tokens []uint32, want func(g, block int) bool) {
	evs, _ := storeEvents(0, false, f.root, tokens, 16)
	var batch events.Batch
	block := 0
	for _, ev := range evs {
		batch.Events = batch.Events[:0]
		for g := range l.groups {
			if g == len(l.groups)-1 || want(g, block) {
				batch.Events = append(batch.Events, l.event(g, ev))
			}
		}
		if err := w.ApplyBatch(&batch); err != nil {
			tb.Fatal(err)
		}
		block += len(ev.BlockHashes)
	}
}

// BenchmarkMemoryHybrid measures the heap of the side groups: 100 hybrid
// workers hold 10,000 blocks each (chains of 64 to 1,024 blocks, no block
// shared: BenchmarkMemory10M's unshared fleet at a tenth of its workers),
// every block in every group, as a side group holds the blocks it freed
// until the engine evicts them. side-bytes/block is the heap the side
// groups' maps take (measured by dropping them) over the blocks they hold,
// tree-bytes/block the rest of the index (tree and engine maps: a
// prefix-only worker's cost) over the anchor's residencies, and ratio the
// first over the second.
func BenchmarkMemoryHybrid(b *testing.B) {
	for _, l := range benchLayouts() {
		b.Run(l.name, func(b *testing.B) {
			for range b.N {
				memoryHybrid(b, &l)
			}
		})
	}
}

func memoryHybrid(b *testing.B, l *benchLayout) {
	const workers, perWorker = 100, 10000
	r := rand.New(rand.NewPCG(4, 4))
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	pool := randTokens(r, 1<<20)
	base := heap()
	f := newFleet(b, workers, Config{WorkerCapacity: -1})
	b.ResetTimer()
	all := func(int, int) bool { return true }
	for _, w := range f.ws {
		for held := 0; held < perWorker; {
			n := min(64+r.IntN(961), perWorker-held)
			off := r.IntN(len(pool) - n*benchBS)
			t := slices.Clone(pool[off : off+n*benchBS])
			t[0] = r.Uint32() // a chain of its own
			f.storeHybrid(b, w, l, t, all)
			held += n
		}
	}
	b.StopTimer()
	var resident, side int64
	for _, w := range f.ws {
		st := w.Stats()
		resident += st.ResidentBlocks
		side += st.SideBlocks
	}
	if want := int64(workers * perWorker); resident != want || side != want*int64(l.sideGroups()) {
		b.Fatalf("%d residencies and %d side blocks, want %d and %d", resident, side, want, want*int64(l.sideGroups()))
	}
	total := heap() - base
	for _, w := range f.ws {
		for _, sg := range w.side.order {
			sg.blocks, sg.held = nil, nil
		}
	}
	tree := heap() - base
	sb, tb := float64(total-tree)/float64(side), float64(tree)/float64(resident)
	b.ReportMetric(sb, "side-bytes/block")
	b.ReportMetric(tb, "tree-bytes/block")
	b.ReportMetric(sb/tb, "ratio")
	b.ReportMetric(float64(side), "side-blocks")
	runtime.KeepAlive(f)
}

// scoreHybridFleet is BenchmarkScore128x8's fleet of 8 workers (64
// prompts of 128 blocks each held whole, and 8,192 blocks of their own)
// with l's groups: the own blocks in every group, and of each prompt the
// blocks [0, side) in the side groups.
func scoreHybridFleet(b *testing.B, l *benchLayout, side int) (*fleet, [][]uint32) {
	r := rand.New(rand.NewPCG(2, 2))
	f := newFleet(b, 8, Config{})
	var prompts [][]uint32
	for range 64 {
		prompts = append(prompts, randTokens(r, 128*benchBS))
	}
	for _, w := range f.ws {
		for _, p := range prompts {
			f.storeHybrid(b, w, l, p, func(_, block int) bool { return block < side })
		}
		for range 32 {
			f.storeHybrid(b, w, l, randTokens(r, 256*benchBS), func(int, int) bool { return true })
		}
	}
	return f, prompts
}

// BenchmarkScoreHybrid is the index side of a Score on hybrid workers:
// PromptKeys, Match and each match capped by Worker.Cap as scoring does
// it (the longest hit vLLM takes, one token short of the prompt), over
// BenchmarkScore128x8's fleet with l's groups, beside the same Score over
// BenchmarkScore128x8's prefix-only fleet, call by call (alternating which
// goes first). p50-ns/p99-ns are the hybrid Score's, prefix-p50-ns the
// prefix-only one's, ratio the first p50 over the second.
//
//   - hit: the side groups hold every block of the prompts, so the window
//     before the cut holds (a window group reads its window, a mamba
//     group one block).
//   - cut: the side groups lost the prompts' second half: Cap scans back
//     64 blocks, cuts the hit to 64 and checks every group again there.
//   - miss: the side groups hold none of the prompts (their blocks freed
//     as the requests went on, as a shared system prompt's are): Cap scans
//     back to the first block and realizes no hit.
func BenchmarkScoreHybrid(b *testing.B) {
	cases := []struct {
		name      string
		side, hit int // the side groups' blocks of each prompt; the hit Cap realizes (-1: the match stands)
	}{{"hit", 128, -1}, {"cut", 64, 64}, {"miss", 0, 0}}
	pf, prompts := score128x8(b)
	for _, l := range benchLayouts() {
		for _, c := range cases {
			b.Run(l.name+"/"+c.name, func(b *testing.B) {
				hf, hp := scoreHybridFleet(b, &l, c.side)
				if !slices.EqualFunc(prompts, hp, slices.Equal) {
					b.Fatal("the fleets hold different prompts")
				}
				ps, hs := newHybridScorer(pf), newHybridScorer(hf)
				runtime.GC()
				lat := make(latencies, 0, b.N)
				plat := make(latencies, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					p := prompts[i%len(prompts)]
					first, second, fl, sl := hs, ps, &lat, &plat
					if i%2 == 1 {
						first, second, fl, sl = ps, hs, &plat, &lat
					}
					t0 := time.Now()
					first.score(p)
					t1 := time.Now()
					second.score(p)
					t2 := time.Now()
					*fl = append(*fl, int64(t1.Sub(t0)))
					*sl = append(*sl, int64(t2.Sub(t1)))
				}
				b.StopTimer()
				for _, s := range []*hybridScorer{ps, hs} {
					if len(s.dst) != 8 || s.dst[0].Blocks != 128 {
						b.Fatalf("matches %+v", s.dst)
					}
				}
				if ps.least != -1 || hs.least != c.hit {
					b.Fatalf("Cap realized %d blocks on prefix-only workers and %d on hybrid ones, want -1 and %d", ps.least, hs.least, c.hit)
				}
				lat.report(b, "")
				pp := plat.pct(0.5)
				b.ReportMetric(pp, "prefix-p50-ns")
				b.ReportMetric(lat.pct(0.5)/pp, "ratio")
			})
		}
	}
}

// hybridScorer is a Score over an index into reused scratch: PromptKeys,
// Match, and Cap on every match as scoring.Result.capped calls it.
type hybridScorer struct {
	ix    *Index
	allow func(WorkerID) bool
	keys  []Key
	dst   []Match
	least int // the least hit Cap realized over the last Score's matches, in blocks; -1: no group lowered any
}

func newHybridScorer(f *fleet) *hybridScorer {
	m, _ := f.ix.Model(benchModel)
	return &hybridScorer{ix: f.ix, allow: allowModel(f.ix, m), keys: make([]Key, 0, 128), dst: make([]Match, 0, 8)}
}

func (s *hybridScorer) keysAt(int) []Key { return s.keys }

func (s *hybridScorer) score(p []uint32) {
	s.keys = PromptKeys(benchModel, benchBS, p, nil, s.keys[:0])
	s.dst = s.ix.Match(s.keys, s.allow, s.dst[:0])
	s.least = -1
	for _, mt := range s.dst {
		w := s.ix.Worker(mt.Worker)
		if mt.Blocks == 0 || !w.HasSideGroups() {
			continue
		}
		t, by := w.Cap(mt.Blocks*benchBS, len(p)-1, s.keysAt)
		if by >= 0 && (s.least < 0 || t/benchBS < s.least) {
			s.least = t / benchBS
		}
	}
}
