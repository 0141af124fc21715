package indexer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// A universe of documents (token sequences) that share prefixes, for
// randomised event sequences whose keys meet across workers.
type universe struct {
	bs   int
	run  int // most blocks one store event carries
	docs [][]uint32
	lora []bool // the document is keyed under the "lora1" adapter
	keys [][]Key
}

const propModel = "m"

func newUniverse(r *rand.Rand, n, maxBlocks, bs int) *universe {
	u := &universe{bs: bs, run: max(4, maxBlocks/3)}
	for d := range n {
		nb := 1 + r.IntN(maxBlocks)
		var toks []uint32
		if d > 0 && r.IntN(3) > 0 {
			p := u.docs[r.IntN(d)]
			share := r.IntN(len(p)/bs + 1)
			toks = append(toks, p[:min(share, nb)*bs]...)
		}
		for len(toks) < nb*bs {
			toks = append(toks, uint32(r.IntN(8))) // a small vocabulary, so contents repeat
		}
		u.docs = append(u.docs, toks)
		lora := r.IntN(6) == 0
		u.lora = append(u.lora, lora)
		u.keys = append(u.keys, PromptKeys(propModel, bs, toks, u.extras(d), nil))
	}
	return u
}

func (u *universe) extras(d int) *PromptExtras {
	if u.lora[d] {
		return &PromptExtras{LoRAName: "lora1"}
	}
	return nil
}

// engineHash is a worker's engine hash of block b of document d: content
// based, as vLLM's are, so shared prefixes share hashes.
func (u *universe) engineHash(d, b int) uint64 {
	return uint64(u.keys[d][b])*0x9e3779b97f4a7c15 | 1
}

// gen makes random batches for one worker of a reference model, looking at
// the worker's reference state to pick removals of blocks it holds.
type gen struct {
	r *rand.Rand
	u *universe
}

func (g *gen) heldHashes(w *refWorker, n int) []uint64 {
	var out []uint64
	for h := range w.engine {
		out = append(out, h)
	}
	slices.Sort(out)
	g.r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:min(n, len(out))]
}

// sideHashes returns up to n hashes side group gi of w holds, shuffled.
func (g *gen) sideHashes(w *refWorker, gi, n int) []uint64 {
	var out []uint64
	if sg := w.groups[gi]; sg != nil {
		for h := range sg.blocks {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	g.r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:min(n, len(out))]
}

var media = []events.Medium{events.MediumGPU, events.MediumGPU, events.MediumGPU, events.MediumCPU, events.MediumDisk, events.MediumOther}

func (g *gen) event(w *refWorker) events.Event {
	r, u := g.r, g.u
	switch x := r.IntN(100); {
	case x < 45: // store a run of a document, usually chained to its parent
		d := r.IntN(len(u.docs))
		nb := len(u.keys[d])
		a := r.IntN(nb)
		if r.IntN(3) > 0 {
			a = 0
		}
		b := a + 1 + r.IntN(min(u.run, nb-a))
		ev := events.Event{Kind: events.KindBlockStored, BlockSize: u.bs, Medium: media[r.IntN(len(media))]}
		if ev.Medium == events.MediumOther {
			ev.MediumName = "weird"
		}
		if a > 0 {
			ev.HasParent, ev.ParentHash = true, u.engineHash(d, a-1)
			if r.IntN(20) == 0 {
				ev.ParentHash ^= 0xdead // an unknown parent: an orphan
			}
		}
		for i := a; i < b; i++ {
			ev.BlockHashes = append(ev.BlockHashes, u.engineHash(d, i))
		}
		if r.IntN(25) == 0 && len(w.engine) > 0 {
			// The engine reuses a hash it holds for this content.
			ev.BlockHashes[0] = g.heldHashes(w, 1)[0]
		}
		ev.TokenIDs = u.docs[d][a*u.bs : b*u.bs]
		if u.lora[d] {
			ev.LoRAName = "lora1"
			if r.IntN(2) == 0 {
				ev.ExtraKeys = make([]events.ExtraKeys, b-a)
				for i := range ev.ExtraKeys {
					ev.ExtraKeys[i] = events.AppendString(events.AppendTuple(nil, 1), "lora1")
				}
			}
		}
		switch r.IntN(40) {
		case 3:
			ev.CacheSalt = "salt" // SGLang's event-level cache_salt
		case 0:
			ev.BlockSize = u.bs * 2
		case 1:
			ev.TokenIDs = ev.TokenIDs[:len(ev.TokenIDs)-1]
		case 2:
			ev.SpecKind, ev.GroupIdx, ev.HasGroupIdx = "sliding_window", 1, true // no window: not modelled
		case 4, 5, 6, 7:
			ev.SpecKind, ev.GroupIdx, ev.HasGroupIdx = "sliding_window", 2, true
			ev.SlidingWindow, ev.HasSlidingWindow = 2*u.bs+1, true
		case 8, 9:
			ev.SpecKind, ev.GroupIdx, ev.HasGroupIdx = "mamba", 3, true
		case 10:
			ev.SpecKind, ev.GroupIdx, ev.HasGroupIdx = "full_attention", 0, true
		}
		return ev
	case x < 55: // offload held blocks to another medium
		ev := events.Event{Kind: events.KindBlockStored, Medium: media[3+r.IntN(2)]}
		ev.BlockHashes = g.heldHashes(w, 1+r.IntN(3))
		if r.IntN(8) == 0 {
			ev.BlockHashes = append(ev.BlockHashes, 12345)
		}
		return ev
	case x < 65: // evict a document's tail, last block first, as vLLM does
		d := r.IntN(len(u.docs))
		nb := len(u.keys[d])
		ev := events.Event{Kind: events.KindBlockRemoved, Medium: media[r.IntN(3)]}
		for b := nb - 1; b >= r.IntN(nb); b-- {
			if w.engine[u.engineHash(d, b)] != nil {
				ev.BlockHashes = append(ev.BlockHashes, u.engineHash(d, b))
			}
		}
		return ev
	case x < 95: // remove held blocks from a medium, sometimes one they are not in
		ev := events.Event{Kind: events.KindBlockRemoved, Medium: media[r.IntN(len(media))]}
		ev.BlockHashes = g.heldHashes(w, 1+r.IntN(3))
		if u.run > 4 && r.IntN(3) == 0 {
			ev.BlockHashes = g.heldHashes(w, 1+r.IntN(u.run))
		}
		if r.IntN(4) > 0 && len(ev.BlockHashes) > 0 {
			// Mostly remove from a medium the first block is in.
			ref := w.engine[ev.BlockHashes[0]].refs
			for m, n := range ref {
				if n > 0 {
					ev.Medium = events.Medium(m)
					break
				}
			}
		}
		switch r.IntN(30) {
		case 0:
			ev.GroupIdx, ev.HasGroupIdx = 1, true
		case 1:
			ev.GroupIdx, ev.HasGroupIdx = 5, true // never stored
		case 2, 3, 4, 5:
			// A side group's blocks, as vLLM frees a window's first.
			gi := 2 + r.IntN(2)
			ev.GroupIdx, ev.HasGroupIdx = gi, true
			ev.BlockHashes = g.sideHashes(w, gi, 1+r.IntN(4))
		}
		return ev
	case x < 97:
		return events.Event{Kind: events.KindAllBlocksCleared}
	default:
		return events.Event{Kind: events.Kind(9)}
	}
}

func (g *gen) batch(w *refWorker) *events.Batch {
	b := &events.Batch{}
	for range 1 + g.r.IntN(6) {
		b.Events = append(b.Events, g.event(w))
	}
	return b
}

// prompts returns key sequences to match: every document, its prefixes and
// extensions.
func (u *universe) prompts() [][]Key {
	var out [][]Key
	for d, k := range u.keys {
		out = append(out, k)
		if len(k) > 1 {
			out = append(out, k[:len(k)/2])
		}
		ext := PromptKeys(propModel, u.bs, append(append([]uint32(nil), u.docs[d]...), 1, 2, 3, 4), u.extras(d), nil)
		out = append(out, ext)
	}
	return out
}

// comparableStats drops the fields the reference does not model.
func comparableStats(s Stats) Stats {
	s.LastApply, s.LastReset, s.Capacity = time.Time{}, "", 0
	s.LastResetAt, s.LastClearAt, s.LastBadBlockSize = time.Time{}, time.Time{}, 0
	s.Evictions, s.BudgetEvictions = 0, 0
	s.BlockSize = 0
	return s
}

func checkAgainstRef(t *testing.T, ix *Index, ref *refIndex, u *universe, r *rand.Rand, step int) {
	t.Helper()
	if step%10 == 9 {
		checkInvariants(t, ix)
	}
	for i, w := range ix.Workers() {
		rw := ref.workers[i]
		if w.engine.Len() != len(rw.engine) {
			t.Fatalf("step %d worker %d: %d engine entries, reference %d", step, i, w.engine.Len(), len(rw.engine))
		}
		for h, re := range rw.engine {
			slot, ok := w.engine.Get(h)
			if !ok {
				t.Fatalf("step %d worker %d: no engine entry %x", step, i, h)
			}
			if l := w.locOf(w.entry(slot)); l.n.keys[l.off] != re.key {
				k := l.n.keys[l.off]
				t.Fatalf("step %d worker %d: engine entry %x at key %x, reference %x", step, i, h, k, re.key)
			}
			refs := w.refsOf(slot)
			for m, r := range re.refs {
				if uint32(refs[m]) != r {
					t.Fatalf("step %d worker %d: engine entry %x refs %v, reference %v", step, i, h, refs, re.refs)
				}
			}
		}
	}
	for i, w := range ix.Workers() {
		for gi, rg := range ref.workers[i].groups {
			if rg.blocks == nil {
				continue
			}
			g := w.groupOfLocked(gi)
			if g == nil || g.side == nil || len(g.side.blocks) != len(rg.blocks) {
				t.Fatalf("step %d worker %d: side group %d is %+v, reference holds %d blocks", step, i, gi, g, len(rg.blocks))
			}
			for h, rb := range rg.blocks {
				if b, ok := g.side.blocks[h]; !ok || b.key != rb.key || int(b.refs) != rb.refs {
					t.Fatalf("step %d worker %d: side group %d block %x is %+v, reference %+v", step, i, gi, h, b, *rb)
				}
			}
		}
	}
	allow := func(id WorkerID) bool { return id%3 != 1 }
	for pi, keys := range u.prompts() {
		var f func(WorkerID) bool
		if pi%4 == 3 {
			f = allow
		}
		got := sortMatches(ix.Match(keys, f, nil))
		want := ref.match(keys, f)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d prompt %d (%d keys): Match = %+v, reference %+v", step, pi, len(keys), got, want)
		}
		for i, w := range ix.Workers() {
			rw := ref.workers[i]
			mt, _ := rw.matchLocked(keys)
			limit := r.IntN(len(keys) + 1)
			at := func(bs int) []Key {
				if bs != u.bs {
					return nil
				}
				return keys
			}
			gotT, by := w.Cap(mt.Blocks*u.bs, limit*u.bs, at)
			if wantT := rw.capLocked(keys, min(mt.Blocks, limit)) * u.bs; gotT != wantT {
				t.Fatalf("step %d prompt %d worker %d: Cap(%d blocks, at most %d) = %d tokens (capped by group %d), reference %d", step, pi, i, mt.Blocks, limit, gotT, by, wantT)
			}
		}
	}
	for i, w := range ix.Workers() {
		got, want := comparableStats(w.Stats()), comparableStats(ref.workers[i].stats)
		if got != want {
			t.Fatalf("step %d worker %d: stats\n got %+v\nwant %+v", step, i, got, want)
		}
	}
}

// TestMatchesReferenceModel applies random event sequences (stores with
// parents, duplicate stores, removals across media, offloads with empty
// token_ids, orphans, hash reuse, LoRA, sliding-window groups, invalid
// events, clears and resets) to several workers and checks every Match
// and every worker's counters against the reference model after each
// batch, and the tree's invariants.
func TestMatchesReferenceModel(t *testing.T) {
	seeds, steps := 16, 250
	if testing.Short() {
		seeds = 6
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(seed), 7))
			u := newUniverse(r, 12, 10, 4)
			if seed%2 == 1 {
				// Long documents: long runs, compaction of dead tails.
				u = newUniverse(r, 8, 100, 2)
			}
			ix := New(Config{Shards: 4})
			ix.AddModel(propModel, u.bs)
			ref := newRefIndex()
			ref.addModel(propModel, u.bs)
			var ws []*Worker
			for i := range 4 {
				w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: fmt.Sprint("p", i)}, Model: propModel})
				if err != nil {
					t.Fatal(err)
				}
				ws = append(ws, w)
				ref.addWorker(propModel)
			}
			g := &gen{r: r, u: u}
			for step := range steps {
				i := r.IntN(len(ws))
				if r.IntN(100) == 0 {
					ws[i].Reset("test")
					ref.workers[i].reset()
				} else {
					b := g.batch(ref.workers[i])
					_ = ws[i].ApplyBatch(b)
					ref.workers[i].apply(b)
				}
				checkAgainstRef(t, ix, ref, u, r, step)
			}
		})
	}
}

// checkInvariants walks the whole tree and every engine map: the node and
// segment invariants of node, published views equal to the writer state
// (no batch is running), every engine entry in a live node whose holder
// set has the worker in exactly the media its counts say, and no holder
// the engine maps do not explain.
func checkInvariants(t *testing.T, ix *Index) {
	t.Helper()
	type wk struct {
		n   *node
		off int32
		w   uint32
	}
	holds := map[wk]uint8{}
	seen := map[*node]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		if seen[n] {
			t.Fatalf("node %p reached twice", n)
		}
		seen[n] = true
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.dead.Load() {
			t.Fatalf("dead node %p still in the tree", n)
		}
		if n.deadLocked() {
			t.Fatalf("node %p holds nothing and has no children but is not retired", n)
		}
		v := n.view.Load()
		if vis := n.visibleLocked(); v == nil || !slices.Equal(v.keys[:v.n.Load()], n.keys[:vis]) || !segsAgree(v.segs, n.segs, vis) {
			t.Fatalf("node %p: published view differs from its state", n)
		}
		if n.keys[0] != n.first || len(n.segs) == 0 || n.segs[0].start != 0 {
			t.Fatalf("node %p: bad first key or segments %+v", n, n.segs)
		}
		for i, s := range n.segs {
			end := int32(len(n.keys))
			if i+1 < len(n.segs) {
				end = n.segs[i+1].start
				if holders.Equal(s.set, n.segs[i+1].set) {
					t.Fatalf("node %p: adjacent equal segments %d,%d", n, i, i+1)
				}
			}
			if end <= s.start {
				t.Fatalf("node %p: empty segment %d", n, i)
			}
			for off := s.start; off < end; off++ {
				for _, e := range s.set.Entries() {
					holds[wk{n, off, e.Worker()}] = e.Media()
				}
			}
		}
		for i, c := range n.children {
			if c.parent != n || int(c.cidx) != i || c.attach > n.maxAttach || int(c.attach) >= len(n.keys) {
				t.Fatalf("node %p: bad child %d (attach %d, maxAttach %d, len %d)", n, i, c.attach, n.maxAttach, len(n.keys))
			}
			if h := ix.head(c.first); h != c {
				t.Fatalf("child %p of %p is not in heads", c, n)
			}
			walk(c)
		}
	}
	for i := range ix.heads {
		sh := &ix.heads[i]
		sh.mu.RLock()
		var tops []*node
		for _, n := range sh.m {
			if n.parent == nil {
				tops = append(tops, n)
			}
		}
		sh.mu.RUnlock()
		for _, n := range tops {
			walk(n)
		}
	}
	for _, w := range ix.Workers() {
		w.mu.Lock()
		want := map[wk]uint8{}
		entries := map[loc]int{}
		for slot := range w.engine.All() {
			e := w.entry(slot)
			if e.media() == 0 {
				t.Fatalf("worker %d: engine entry with no references", w.id)
			}
			l := w.locOf(e)
			if !seen[l.n] || l.n.id != e.node() {
				t.Fatalf("worker %d: engine entry in node %p, which is not in the tree", w.id, l.n)
			}
			want[wk{l.n, e.off(), uint32(w.id)}] |= e.media()
			entries[l]++
		}
		for k, m := range want {
			if got, ok := holds[k]; !ok || got != m {
				t.Fatalf("worker %d: tree has media %b at %p+%d, engine counts say %b", w.id, got, k.n, k.off, m)
			}
			delete(holds, k)
		}
		for l, a := range w.aliases {
			if entries[l] != a.entries || a.entries < 2 {
				t.Fatalf("worker %d: alias at %p+%d counts %d entries, engine map has %d", w.id, l.n, l.off, a.entries, entries[l])
			}
		}
		for l, n := range entries {
			if n > 1 && w.aliases[l] == nil {
				t.Fatalf("worker %d: %d entries at %p+%d but no alias", w.id, n, l.n, l.off)
			}
		}
		w.mu.Unlock()
	}
	for k, m := range holds {
		t.Fatalf("tree says worker %d holds %p+%d in %b, its engine map does not", k.w, k.n, k.off, m)
	}
}

// TestBoundedKeepsInvariants applies random event sequences under a tight
// per-worker capacity and memory budget (so that evictions, of aliases
// too, interleave with everything else), changing a capacity now and then,
// and checks the tree's invariants after every batch. (Evictions make the
// index diverge from the reference model on purpose; answers are checked
// against it in TestMatchesReferenceModel.)
func TestBoundedKeepsInvariants(t *testing.T) {
	seeds := 15
	if testing.Short() {
		seeds = 5
	}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 5))
		u := newUniverse(r, 24, 48, 4)
		ix := New(Config{Shards: 8, WorkerCapacity: 60, MemoryBudget: 150 * EstimatedBytesPerBlock})
		ix.AddModel(propModel, u.bs)
		var ws []*Worker
		var refs []*refWorker
		for i := range 5 {
			w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: fmt.Sprint("p", i)}, Model: propModel})
			if err != nil {
				t.Fatal(err)
			}
			ws = append(ws, w)
			ref := newRefIndex()
			ref.addModel(propModel, u.bs)
			refs = append(refs, ref.addWorker(propModel)) // steers the choice of events only
		}
		g := &gen{r: r, u: u}
		for step := range 300 {
			i := r.IntN(len(ws))
			b := g.batch(refs[i])
			_ = ws[i].ApplyBatch(b)
			refs[i].apply(b)
			if r.IntN(50) == 0 {
				ws[i].SetCapacity(r.IntN(100) - 10)
			}
			checkInvariants(t, ix)
			if t.Failed() {
				t.Fatalf("seed %d step %d", seed, step)
			}
		}
	}
}
