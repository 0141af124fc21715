package indexer

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
)

// fleetIndexes are a source index and two replica indexes of it, each with
// nw workers added in the same order: worker 0 is the replicated one
// (fed engine events in the source, keyed in the replicas), and the
// others are ordinary workers fed the same events in all three, so that
// their chains overlap the replicated worker's in every index.
type fleetIndexes struct {
	src, fed, rst       *Index
	srcWs, fedWs, rstWs []*Worker
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
	f.rst, f.rstWs = mk(true)
	return f
}

// takeSnapshot takes w's snapshot through the segments' encoding, checking
// that each segment survives it.
func takeSnapshot(w *Worker) ([]*SnapshotSegment, error) {
	var segs []*SnapshotSegment
	err := w.Snapshot(func(s *SnapshotSegment) error {
		b, err := s.AppendBinary(nil)
		if err != nil {
			return err
		}
		var got SnapshotSegment
		if err := got.UnmarshalBinary(b); err != nil {
			return err
		}
		if !reflect.DeepEqual(&got, s) && !(len(got.Keys) == 0 && len(s.Keys) == 0) {
			return fmt.Errorf("segment %d does not survive its encoding:\n got %+v\nwant %+v", s.Part, got, *s)
		}
		segs = append(segs, &got)
		return nil
	})
	return segs, err
}

// snapshotOf is takeSnapshot, failing t on an error.
func snapshotOf(t *testing.T, w *Worker) []*SnapshotSegment {
	t.Helper()
	segs, err := takeSnapshot(w)
	if err != nil {
		t.Fatalf("snapshot of %s: %v", w.Info().Ref, err)
	}
	return segs
}

// segmentsOf returns a next function for Restore that returns segs, then
// io.EOF.
func segmentsOf(segs []*SnapshotSegment) func() (*SnapshotSegment, error) {
	i := 0
	return func() (*SnapshotSegment, error) {
		if i == len(segs) {
			return nil, io.EOF
		}
		i++
		return segs[i-1], nil
	}
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
// (ApplyDelta), and one restored from a snapshot (of the source, or of the
// fed replica) at random points and fed the deltas after it, have the
// source's digest and resident counts, no mismatches, and that their
// indexes answer every prompt as the source index does; and the trees'
// invariants.
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
			restored := false
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
					for _, ws := range [][]*Worker{f.srcWs, f.fedWs, f.rstWs} {
						_ = ws[i].ApplyBatch(b)
					}
					steer[i].apply(b)
				}
				if i == 0 {
					if err := f.fedWs[0].ApplyDelta(&d); err != nil {
						t.Fatalf("step %d: fed replica: %v", step, err)
					}
					if restored {
						if err := f.rstWs[0].ApplyDelta(&d); err != nil {
							t.Fatalf("step %d: restored replica: %v", step, err)
						}
					}
				}
				if r.IntN(20) == 0 {
					from := f.srcWs[0]
					if r.IntN(3) == 0 {
						from = f.fedWs[0]
					}
					if err := f.rstWs[0].Restore(segmentsOf(snapshotOf(t, from))); err != nil {
						t.Fatalf("step %d: restore: %v", step, err)
					}
					if got, want := f.rstWs[0].DeltaSeq(), f.srcWs[0].DeltaSeq(); got != want {
						t.Fatalf("step %d: restored at seq %d, source at %d", step, got, want)
					}
					restored = true
				}
				ps := append(prompts, u.randomPrompts(r, 8)...)
				checkReplica(t, f.src, f.fed, f.srcWs[0], f.fedWs[0], ps, fmt.Sprintf("step %d fed", step))
				if restored {
					checkReplica(t, f.src, f.rst, f.srcWs[0], f.rstWs[0], ps, fmt.Sprintf("step %d restored", step))
				}
				if step%10 == 9 {
					checkInvariants(t, f.src)
					checkInvariants(t, f.fed)
					checkInvariants(t, f.rst)
				}
			}
			if f.src.collisions.Load() != 0 || f.fed.collisions.Load() != 0 || f.rst.collisions.Load() != 0 {
				t.Fatalf("key collisions: source %d, fed %d, restored %d", f.src.collisions.Load(), f.fed.collisions.Load(), f.rst.collisions.Load())
			}
		})
	}
}

// TestLostDeltaIsDetected drops one random delta on its way to a replica:
// every later ApplyDelta that returns an error wraps ErrDeltaMismatch and
// raises Stats.DeltaMismatches, one that returns none leaves it, the
// divergence shows (an error or unequal digests), and a restore from a
// snapshot of the source brings the replica back to the source's state.
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
		if err := rep.Restore(segmentsOf(snapshotOf(t, src))); err != nil {
			t.Fatalf("seed %d: restore: %v", seed, err)
		}
		if a, b := src.Digest(), rep.Digest(); a != b {
			t.Fatalf("seed %d: after restore digest %#x, source %#x", seed, b, a)
		}
		sb, sm := residentOf(src)
		rb, rm := residentOf(rep)
		if sb != rb || sm != rm {
			t.Fatalf("seed %d: after restore resident %d %v, source %d %v", seed, rb, rm, sb, sm)
		}
		checkInvariants(t, f.fed)
	}
}

// TestReplicationConcurrent runs replication as a fleet does, everything
// at once: the source applies batches with ApplyBatchDelta (numbered by
// Seq) while its snapshots are taken and other workers of both indexes
// ingest the same overlapping chains; the replica applies the deltas in
// order, now and then restores the latest snapshot and replays the
// deltas after its Seq, while Match runs on its index. Then every answer,
// digest and count must equal the source's.
func TestReplicationConcurrent(t *testing.T) {
	steps := 3000
	if testing.Short() {
		steps = 600
	}
	r0 := rand.New(rand.NewPCG(9, 9))
	u := newUniverse(r0, 24, 24, 4)
	f := newFleetIndexes(t, u.bs, 3, Config{Shards: 8, WorkerCapacity: 80})
	prompts := u.prompts()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex // guards latest
		latest   []*SnapshotSegment
		failed   = make(chan error, 8)
		deltas   = make(chan Delta, steps)
		done     = make(chan struct{})
		stopOnce sync.Once
	)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	stop := func() { stopOnce.Do(func() { close(done) }) }
	ingest := func(seed uint64, i int, body func(g *gen, steer *refWorker)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := newRefIndex()
			ref.addModel(propModel, u.bs)
			steer := ref.addWorker(propModel)
			steer.id = f.srcWs[i].ID()
			body(&gen{r: rand.New(rand.NewPCG(seed, 1)), u: u}, steer)
		}()
	}
	// The source.
	ingest(1, 0, func(g *gen, steer *refWorker) {
		defer close(deltas)
		for step := range steps {
			d := Delta{Seq: uint64(step + 1)}
			b := g.batch(steer)
			_ = f.srcWs[0].ApplyBatchDelta(b, &d)
			steer.apply(b)
			deltas <- d
		}
	})
	// The other workers, the same events in both indexes.
	for i := 1; i < 3; i++ {
		ingest(uint64(10+i), i, func(g *gen, steer *refWorker) {
			for step := 0; step < steps; step++ {
				b := g.batch(steer)
				_ = f.srcWs[i].ApplyBatch(b)
				_ = f.fedWs[i].ApplyBatch(b)
				steer.apply(b)
			}
		})
	}
	// Snapshots of the source.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			segs, err := takeSnapshot(f.srcWs[0])
			if err != nil {
				fail(err)
				return
			}
			mu.Lock()
			latest = segs
			mu.Unlock()
		}
	}()
	// Scores on the replica's index.
	wg.Add(1)
	go func() {
		defer wg.Done()
		var dst []Match
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			dst = f.fed.Match(prompts[i%len(prompts)], nil, dst[:0])
		}
	}()
	// The replica.
	rep := f.fedWs[0]
	var history []Delta // by Seq-1
	restores := 0
	r := rand.New(rand.NewPCG(5, 5))
	for d := range deltas {
		history = append(history, Delta{Seq: d.Seq, Entries: slices.Clone(d.Entries), Layout: slices.Clone(d.Layout)})
		if d.Seq <= rep.DeltaSeq() {
			continue // the snapshot restored already has it
		}
		if err := rep.ApplyDelta(&d); err != nil {
			t.Fatalf("delta %d: %v", d.Seq, err)
		}
		if r.IntN(30) != 0 {
			continue
		}
		mu.Lock()
		segs := latest
		mu.Unlock()
		if segs == nil {
			continue
		}
		if err := rep.Restore(segmentsOf(segs)); err != nil {
			t.Fatalf("restore: %v", err)
		}
		restores++
		// The deltas after the snapshot that the replica has received.
		for s := rep.DeltaSeq(); s < d.Seq; s++ {
			if err := rep.ApplyDelta(&history[s]); err != nil {
				t.Fatalf("replayed delta %d after a snapshot at %d: %v", s+1, rep.DeltaSeq(), err)
			}
		}
	}
	stop()
	wg.Wait()
	select {
	case err := <-failed:
		t.Fatal(err)
	default:
	}
	if restores == 0 {
		t.Fatal("no restore ran")
	}
	checkReplica(t, f.src, f.fed, f.srcWs[0], rep, append(prompts, u.randomPrompts(r, 50)...), "at the end")
	checkInvariants(t, f.src)
	checkInvariants(t, f.fed)
}
