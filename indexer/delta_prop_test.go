package indexer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// fleetIndexes are a source index and a replica index of it, each with
// nw workers added in the same order: worker 0 is the replicated one
// (fed engine events in the source, keyed in the replica), and the
// others are ordinary workers fed the same events in both, so that their
// chains overlap the replicated worker's in every index.
type fleetIndexes struct {
	src, fed     *Index
	srcWs, fedWs []*Worker
}

func newFleetIndexes(t *testing.T, bs, nw int, cfg Config) *fleetIndexes {
	t.Helper()
	mk := func(keyed bool) (*Index, []*Worker) {
		ix := New(cfg)
		if _, err := ix.AddModel(propModel, bs); err != nil {
			t.Fatal(err)
		}
		var ws []*Worker
		for i := range nw {
			w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: fmt.Sprint("p", i)}, Model: propModel, Keyed: keyed && i == 0})
			if err != nil {
				t.Fatal(err)
			}
			ws = append(ws, w)
		}
		return ix, ws
	}
	f := &fleetIndexes{}
	f.src, f.srcWs = mk(false)
	f.fed, f.fedWs = mk(true)
	return f
}

// residentOf returns the resident counts of a worker's Stats.
func residentOf(w *Worker) (int64, [events.NumMedia]int64) {
	s := w.Stats()
	return s.ResidentBlocks, s.ResidentByMedium
}

// treeParent is where a key attaches in the tree: under parent, or at
// top level.
type treeParent struct {
	parent Key
	top    bool
}

// heldParents returns where each key w holds attaches in the tree, as the
// tree says.
func heldParents(w *Worker) map[Key]treeParent {
	w.mu.Lock()
	defer w.mu.Unlock()
	keyAt := func(l loc) Key {
		l.n.mu.Lock()
		defer l.n.mu.Unlock()
		return l.n.keys[l.off]
	}
	out := map[Key]treeParent{}
	for slot := range w.engine.All() {
		l := w.locOf(w.entry(slot))
		tp := treeParent{top: true}
		if p, ok := parentLoc(l); ok {
			tp = treeParent{parent: keyAt(p)}
		}
		out[keyAt(l)] = tp
	}
	return out
}

// checkReplica checks that replica rw (in ix) holds what source sw (in
// six) holds: equal digests, resident counts, every key under the same
// parent in the tree, no mismatches, and equal answers from both indexes
// (every worker of them) for every prompt.
func checkReplica(t *testing.T, six, ix *Index, sw, rw *Worker, prompts [][]Key, what string) {
	t.Helper()
	if a, b := sw.Digest(), rw.Digest(); a != b {
		t.Fatalf("%s: digest %#x, source %#x", what, b, a)
	}
	if a, b := heldParents(sw), heldParents(rw); !reflect.DeepEqual(a, b) {
		for k, p := range a {
			if b[k] != p {
				t.Fatalf("%s: key %#x attaches at %+v, in the source at %+v", what, uint64(k), b[k], p)
			}
		}
		t.Fatalf("%s: keys attach at %+v, in the source at %+v", what, b, a)
	}
	sb, sm := residentOf(sw)
	rb, rm := residentOf(rw)
	if sb != rb || sm != rm {
		t.Fatalf("%s: resident %d %v, source %d %v", what, rb, rm, sb, sm)
	}
	if n := rw.Stats().DeltaMismatches; n != 0 {
		t.Fatalf("%s: %d delta mismatches", what, n)
	}
	for pi, keys := range prompts {
		got := sortMatches(ix.Match(keys, nil, nil))
		want := sortMatches(six.Match(keys, nil, nil))
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: prompt %d (%d keys): Match = %+v, source index %+v", what, pi, len(keys), got, want)
		}
	}
	var sum int64
	for _, w := range ix.Workers() {
		sum += w.Stats().ResidentBlocks
	}
	if got := ix.resident.Load(); got != sum {
		t.Fatalf("%s: index counts %d resident blocks, its workers %d", what, got, sum)
	}
}

// randomPrompts returns n prompts: prefixes of random length of random
// documents.
func (u *universe) randomPrompts(r *rand.Rand, n int) [][]Key {
	var out [][]Key
	for range n {
		k := u.keys[r.IntN(len(u.keys))]
		out = append(out, k[:1+r.IntN(len(k))])
	}
	return out
}

// TestReplicasMatchSource applies random event streams (stores with shared
// prefixes, duplicate stores, offloads, removals across media that often
// take a parent before its child, orphans, hash reuse and so aliases,
// clears, resets, capacity evictions and capacity changes) to a source
// worker with ApplyBatchDelta, beside other workers holding overlapping
// chains, and checks after every step that a keyed replica fed the deltas
// (ApplyDelta) has the source's digest and resident counts, no
// mismatches, and that its index answers every prompt as the source
// index does; and the trees' invariants.
func TestReplicasMatchSource(t *testing.T) {
	seeds, steps := 16, 300
	if testing.Short() {
		seeds = 6
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(seed), 11))
			u := newUniverse(r, 12, 10, 4)
			if seed%2 == 1 {
				u = newUniverse(r, 8, 100, 2) // long runs, compaction
			}
			cfg := Config{Shards: 4}
			if seed%3 == 0 {
				cfg.WorkerCapacity = 40 // capacity evictions in the source
			}
			const nw = 3
			f := newFleetIndexes(t, u.bs, nw, cfg)
			ref := newRefIndex()
			ref.addModel(propModel, u.bs)
			var steer []*refWorker // choose the events only
			for i := range nw {
				rw := ref.addWorker(propModel)
				rw.id = f.srcWs[i].ID()
				steer = append(steer, rw)
			}
			g := &gen{r: r, u: u}
			prompts := u.prompts()
			var d Delta
			for step := range steps {
				i := r.IntN(nw)
				d.Reset()
				d.Seq = uint64(step + 1)
				switch {
				case i == 0 && r.IntN(60) == 0:
					f.srcWs[0].ResetDelta("test", &d)
					steer[0].reset()
				case i == 0 && cfg.WorkerCapacity > 0 && r.IntN(30) == 0:
					f.srcWs[0].SetCapacityDelta(10+r.IntN(50), &d)
				case i == 0:
					b := g.batch(steer[0])
					_ = f.srcWs[0].ApplyBatchDelta(b, &d)
					steer[0].apply(b)
				default:
					b := g.batch(steer[i])
					for _, ws := range [][]*Worker{f.srcWs, f.fedWs} {
						_ = ws[i].ApplyBatch(b)
					}
					steer[i].apply(b)
				}
				if i == 0 {
					if err := f.fedWs[0].ApplyDelta(&d); err != nil {
						t.Fatalf("step %d: fed replica: %v", step, err)
					}
				}
				ps := append(prompts, u.randomPrompts(r, 8)...)
				checkReplica(t, f.src, f.fed, f.srcWs[0], f.fedWs[0], ps, fmt.Sprintf("step %d fed", step))
				if step%10 == 9 {
					checkInvariants(t, f.src)
					checkInvariants(t, f.fed)
				}
			}
			if f.src.collisions.Load() != 0 || f.fed.collisions.Load() != 0 {
				t.Fatalf("key collisions: source %d, fed %d", f.src.collisions.Load(), f.fed.collisions.Load())
			}
		})
	}
}

// TestLostDeltaIsDetected drops one random delta on its way to a replica:
// every later ApplyDelta that returns an error wraps ErrDeltaMismatch and
// raises Stats.DeltaMismatches, one that returns none leaves it, and the
// divergence shows (an error or unequal digests).
func TestLostDeltaIsDetected(t *testing.T) {
	for seed := range 8 {
		r := rand.New(rand.NewPCG(uint64(seed), 3))
		u := newUniverse(r, 12, 10, 4)
		f := newFleetIndexes(t, u.bs, 1, Config{Shards: 4})
		ref := newRefIndex()
		ref.addModel(propModel, u.bs)
		steer := ref.addWorker(propModel)
		g := &gen{r: r, u: u}
		src, rep := f.srcWs[0], f.fedWs[0]
		var d Delta
		lost := 20 + r.IntN(20)
		errs, diverged := 0, false
		for step := range 80 {
			d.Reset()
			d.Seq = uint64(step + 1)
			b := g.batch(steer)
			_ = src.ApplyBatchDelta(b, &d)
			steer.apply(b)
			if step == lost {
				continue
			}
			before := rep.Stats().DeltaMismatches
			err := rep.ApplyDelta(&d)
			after := rep.Stats().DeltaMismatches
			switch {
			case err != nil && !errors.Is(err, ErrDeltaMismatch):
				t.Fatalf("seed %d step %d: error %v does not wrap ErrDeltaMismatch", seed, step, err)
			case err != nil && after <= before:
				t.Fatalf("seed %d step %d: error %v, mismatches %d -> %d", seed, step, err, before, after)
			case err == nil && after != before:
				t.Fatalf("seed %d step %d: no error, mismatches %d -> %d", seed, step, before, after)
			}
			if err != nil {
				errs++
			}
			if src.Digest() != rep.Digest() {
				diverged = true
			}
		}
		if errs == 0 && !diverged {
			// The lost delta may have changed nothing the later ones touch
			// and been undone: then the states are equal, which the
			// digests say.
			if a, b := src.Digest(), rep.Digest(); a != b {
				t.Fatalf("seed %d: digests differ (%#x, %#x) but nothing reported", seed, a, b)
			}
		}
		checkInvariants(t, f.fed)
	}
}
