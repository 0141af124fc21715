package fleetbench

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/indexer"
)

// benchModel is the model every benchmark's workers serve.
const benchModel = "bench-model"

// Recorded is one worker's workload as its agent publishes it: the
// deltas its index recorded over one lap of the ring in the steady state
// (when asked for), with the new blocks each stores (what blocks/s
// counts), and its snapshot at a lap boundary, where every lap starts and
// ends in the same state: its segments' binary encoding, keys
// (placeholders included), resident blocks and digest.
type Recorded struct {
	Deltas   []indexer.Delta
	Blocks   []int
	Segments [][]byte
	Keys     int
	Resident int64
	Digest   uint64
}

// restore restores w from the snapshot's encoding, as a replica's sink
// does (UnmarshalBinary into seg, reused, then Worker.Restore).
func (r *Recorded) restore(w *indexer.Worker, seg *indexer.SnapshotSegment) error {
	segs := r.Segments
	return w.Restore(func() (*indexer.SnapshotSegment, error) {
		if len(segs) == 0 {
			return nil, io.EOF
		}
		b := segs[0]
		segs = segs[1:]
		return seg, seg.UnmarshalBinary(b)
	})
}

// Record feeds an engine-fed worker of its own index (as an agent's) with
// one lap of w's ring to reach the steady state, then, when deltas is
// set, a second lap recorded with ApplyBatchDelta, and snapshots it.
// Cost: about 25 us per batch applied and 9 ms for a 30,000-block
// snapshot.
func Record(w *Workload, deltas bool) (*Recorded, error) {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, w.shape.BlockSize); err != nil {
		return nil, fmt.Errorf("fleetbench: record: %w", err)
	}
	wk, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "recorder"}, Model: benchModel})
	if err != nil {
		return nil, fmt.Errorf("fleetbench: record: %w", err)
	}
	var f Filler
	for i := range w.Len() {
		if err := wk.ApplyBatch(f.Fill(w, i, 0, 0)); err != nil {
			return nil, fmt.Errorf("fleetbench: record: batch %d of the first lap: %w", i, err)
		}
	}
	rec := &Recorded{}
	if deltas {
		rec.Deltas = make([]indexer.Delta, w.Len())
		rec.Blocks = make([]int, w.Len())
		for i := range w.Len() {
			d := &rec.Deltas[i]
			d.Seq = uint64(i + 1)
			if err := wk.ApplyBatchDelta(f.Fill(w, i, 1, 0), d); err != nil {
				return nil, fmt.Errorf("fleetbench: record: batch %d of the steady lap: %w", i, err)
			}
			d.Entries = append([]indexer.DeltaEntry(nil), d.Entries...) // trimmed to size
			for _, e := range d.Entries {
				if e.Op == indexer.OpStore && e.BlockEdge {
					rec.Blocks[i]++
				}
			}
		}
	}
	err = wk.Snapshot(func(s *indexer.SnapshotSegment) error {
		b, err := s.AppendBinary(nil)
		rec.Segments = append(rec.Segments, b)
		rec.Keys += len(s.Keys)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleetbench: record: %w", err)
	}
	rec.Resident = wk.Stats().ResidentBlocks
	rec.Digest = wk.Digest()
	return rec, nil
}

// RecordAll records one workload per worker (seeds seed, seed+1, ...),
// on GOMAXPROCS goroutines.
func RecordAll(shape Shape, seed uint64, workers int, deltas bool) ([]*Recorded, error) {
	out := make([]*Recorded, workers)
	return out, parallel(workers, runtime.GOMAXPROCS(0), func(_ *struct{}, i int) error {
		w, err := NewWorkload(shape, seed+uint64(i))
		if err == nil {
			out[i], err = Record(w, deltas)
		}
		return err
	})
}

// parallel calls f for every i in [0, n) on procs goroutines, each with
// its own S, and joins the errors.
func parallel[S any](n, procs int, f func(s *S, i int) error) error {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for range procs {
		wg.Go(func() {
			var s S
			for i := range next {
				errs[i] = f(&s, i)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fixedWorker is a generator's natsbus.LocalWorker: a recorded worker
// whose snapshot is served from its precomputed segments and whose
// deltas are published in ring order (apply). The snapshot is the state
// at a lap boundary only (elsewhere it fails and the replica retries).
// Its methods run under the natsbus.Agent's lock of the worker, which
// guards pos.

type fixedWorker struct {
	rec *Recorded
	pos int // deltas published
}

// Snapshot implements natsbus.LocalWorker.
func (f *fixedWorker) Snapshot(emit func([]byte) error) (uint64, error) {
	if n := len(f.rec.Deltas); n > 0 && f.pos%n != 0 {
		return 0, errors.New("fleetbench: the generator serves snapshots at lap boundaries only")
	}
	for _, s := range f.rec.Segments {
		if err := emit(s); err != nil {
			return 0, err
		}
	}
	return uint64(f.rec.Resident), nil
}

// apply is the natsbus.Agent.Publish callback: the next recorded delta,
// converted as the agent converts what its index records. It returns the
// new blocks the delta stores.
func (f *fixedWorker) apply(d *events.Delta) int {
	i := f.pos % len(f.rec.Deltas)
	fleet.ToWire(&f.rec.Deltas[i], d)
	f.pos++
	return f.rec.Blocks[i]
}

// Resident implements natsbus.LocalWorker.
func (f *fixedWorker) Resident() int64 { return f.rec.Resident }

// Capacity implements natsbus.LocalWorker.
func (f *fixedWorker) Capacity() int64 { return 0 }

// Health implements natsbus.LocalWorker.
func (f *fixedWorker) Health() (events.Health, string) { return events.HealthOK, "" }
