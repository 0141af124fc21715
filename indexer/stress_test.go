package indexer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
)

// TestStress runs ingest (stores with parents, duplicate stores, offloads,
// removals across media, hash reuse, orphans), clears and resets on six
// workers at once, each on its own goroutine as the subscriber does, while
// two goroutines Match prompts that run through the same shared prefixes.
//
// Every answer is checked: each worker has its own reference model,
// updated under a harness lock together with the index, and a version
// that is odd while a batch is being applied. For each worker whose
// version is even and unchanged from before the Match to after it, the
// worker was quiescent during the Match, and its answer must be exactly
// the reference's (present or absent, blocks and media). Workers that
// changed meanwhile may be seen before, during or after their batch. When
// everything stops, every answer must match and the tree's invariants
// hold.
func TestStress(t *testing.T) {
	const nworkers, nscorers = 6, 2
	dur := 3 * time.Second
	if testing.Short() {
		dur = 500 * time.Millisecond
	}
	r0 := rand.New(rand.NewPCG(42, 42))
	u := newUniverse(r0, 24, 48, 4)
	ix := New(Config{Shards: 8})
	ix.AddModel(propModel, u.bs)
	type harness struct {
		mu  sync.RWMutex // held while a batch applies to both w and ref
		ver atomic.Uint64
		w   *Worker
		ref *refWorker
	}
	hs := make([]*harness, nworkers)
	for i := range hs {
		w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: fmt.Sprint("p", i)}, Model: propModel})
		if err != nil {
			t.Fatal(err)
		}
		ref := newRefIndex()
		ref.addModel(propModel, u.bs)
		rw := ref.addWorker(propModel)
		rw.id = w.ID() // orphan keys depend on the worker id
		hs[i] = &harness{w: w, ref: rw}
	}
	prompts := u.prompts()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var batches, checked, skipped atomic.Int64
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &gen{r: rand.New(rand.NewPCG(uint64(i), 99)), u: u}
			for {
				select {
				case <-stop:
					return
				default:
				}
				h.mu.Lock()
				h.ver.Add(1)
				if g.r.IntN(200) == 0 {
					h.w.Reset("stress")
					h.ref.reset()
				} else {
					b := g.batch(h.ref)
					_ = h.w.ApplyBatch(b)
					h.ref.apply(b)
				}
				h.ver.Add(1)
				h.mu.Unlock()
				batches.Add(1)
				if g.r.IntN(4) == 0 {
					// Quiet spells, so that Matches meet quiescent workers.
					time.Sleep(time.Duration(g.r.IntN(300)) * time.Microsecond)
				}
			}
		}()
	}
	errc := make(chan error, nscorers)
	for s := range nscorers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s), 7))
			before := make([]uint64, nworkers)
			var dst []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				keys := prompts[r.IntN(len(prompts))]
				var allow func(WorkerID) bool
				if r.IntN(4) == 0 {
					odd := WorkerID(r.IntN(2))
					allow = func(id WorkerID) bool { return id%2 == odd }
				}
				for i, h := range hs {
					before[i] = h.ver.Load()
				}
				dst = ix.Match(keys, allow, dst[:0])
				got := map[WorkerID]Match{}
				for _, m := range dst {
					if _, dup := got[m.Worker]; dup {
						errc <- fmt.Errorf("worker %d twice in %+v", m.Worker, dst)
						return
					}
					got[m.Worker] = m
				}
				for i, h := range hs {
					h.mu.RLock()
					if v := h.ver.Load(); v != before[i] || v%2 == 1 {
						h.mu.RUnlock()
						skipped.Add(1)
						continue
					}
					want, ok := h.ref.matchLocked(keys)
					h.mu.RUnlock()
					if allow != nil && !allow(h.w.ID()) {
						ok = false
					}
					m, found := got[h.w.ID()]
					if ok != found || ok && !reflect.DeepEqual(m, want) {
						errc <- fmt.Errorf("quiescent worker %d: Match %+v (found %v), reference %+v (holds %v)", i, m, found, want, ok)
						return
					}
					checked.Add(1)
				}
			}
		}()
	}
	select {
	case <-time.After(dur):
	case err := <-errc:
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	t.Logf("%d batches, %d quiescent answers checked, %d skipped as concurrent", batches.Load(), checked.Load(), skipped.Load())
	if checked.Load() == 0 {
		t.Fatal("no answer was checked")
	}
	// Quiesced: every answer exact, counters equal, invariants hold.
	checkInvariants(t, ix)
	for _, keys := range prompts {
		got := map[WorkerID]Match{}
		for _, m := range ix.Match(keys, nil, nil) {
			got[m.Worker] = m
		}
		for i, h := range hs {
			want, ok := h.ref.matchLocked(keys)
			if m, found := got[h.w.ID()]; ok != found || ok && m != want {
				t.Fatalf("after the stress, worker %d: Match %+v, reference %+v", i, m, want)
			}
		}
	}
	for i, h := range hs {
		if got, want := comparableStats(h.w.Stats()), comparableStats(h.ref.stats); got != want {
			t.Fatalf("worker %d stats\n got %+v\nwant %+v", i, got, want)
		}
	}
}

// TestStressBounded runs concurrent ingest and Match under a tight
// capacity and memory budget, where evictions of one worker run on
// another's goroutine: no deadlock, no race, and the tree's invariants
// hold afterwards.
func TestStressBounded(t *testing.T) {
	dur := time.Second
	if testing.Short() {
		dur = 200 * time.Millisecond
	}
	r0 := rand.New(rand.NewPCG(5, 5))
	u := newUniverse(r0, 24, 48, 4)
	ix := New(Config{Shards: 8, WorkerCapacity: 60, MemoryBudget: 150 * EstimatedBytesPerBlock})
	ix.AddModel(propModel, u.bs)
	var ws []*Worker
	for i := range 5 {
		w, _ := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: fmt.Sprint("p", i)}, Model: propModel})
		ws = append(ws, w)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := newRefIndex()
			ref.addModel(propModel, u.bs)
			rw := ref.addWorker(propModel)
			g := &gen{r: rand.New(rand.NewPCG(uint64(i), 3)), u: u}
			for {
				select {
				case <-stop:
					return
				default:
				}
				b := g.batch(rw) // the reference only steers the choice of events
				_ = w.ApplyBatch(b)
				rw.apply(b)
				if i == 0 && g.r.IntN(50) == 0 {
					w.SetCapacity(g.r.IntN(100) - 10)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		prompts := u.prompts()
		var dst []Match
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			dst = ix.Match(prompts[i%len(prompts)], nil, dst[:0])
		}
	}()
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	checkInvariants(t, ix)
	var evicted int64
	for _, w := range ws {
		evicted += w.Stats().Evictions
	}
	if evicted == 0 {
		t.Fatal("nothing was evicted")
	}
}
