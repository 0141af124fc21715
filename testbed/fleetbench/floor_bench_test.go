package fleetbench

import (
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/proc"
)

// BenchmarkIngestFloor is the ingest benchmark's in-process floor
// (kvfleetbench ingest prints it beside the replica's rate): the recorded
// deltas of 32 default-shape workers applied with ApplyDelta in one
// goroutine in the order they are published (interleaved: each delta finds
// its worker out of cache) and a worker's lap at a time (lap), new blocks
// per CPU-second. For profiles: -cpuprofile.
func BenchmarkIngestFloor(b *testing.B) {
	recs, err := RecordAll(DefaultShape(), 1, 32, true)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		interleaved bool
	}{{"interleaved", true}, {"lap", false}} {
		b.Run(c.name, func(b *testing.B) {
			var r float64
			for range b.N {
				if r, err = applyBaseline(recs, 1, c.interleaved); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(r, "blocks/cpu-s")
		})
	}
}

// BenchmarkSyncFloor is the sync benchmark's in-process floor on one
// goroutine: 200 recorded default-shape workers' encoded snapshots
// restored into keyed workers of a fresh index, ns of CPU per block.
func BenchmarkSyncFloor(b *testing.B) {
	recs, err := RecordAll(DefaultShape(), 1, 200, false)
	if err != nil {
		b.Fatal(err)
	}
	var blocks int64
	for _, r := range recs {
		blocks += r.Resident
	}
	var cpu int64
	for range b.N {
		fl, err := restoreFloor(recs, 1)
		if err != nil {
			b.Fatal(err)
		}
		cpu += fl.CPUNs
	}
	b.ReportMetric(float64(cpu)/float64(b.N)/float64(blocks), "cpu-ns/block")
}

// BenchmarkEngineApplyInterleaved is the direct mode's (and an agent's)
// apply on cold caches: 32 default-shape workers fed engine events
// (ApplyBatch) in one index, a batch of each in turn, new blocks per
// CPU-second.
func BenchmarkEngineApplyInterleaved(b *testing.B) {
	const n = 32
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, DefaultShape().BlockSize); err != nil {
		b.Fatal(err)
	}
	ws := make([]*Workload, n)
	wk := make([]*indexer.Worker, n)
	fs := make([]Filler, n)
	for i := range n {
		var err error
		if ws[i], err = NewWorkload(DefaultShape(), uint64(i+1)); err != nil {
			b.Fatal(err)
		}
		if wk[i], err = ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(i)}, Model: benchModel}); err != nil {
			b.Fatal(err)
		}
		for j := range ws[i].Len() { // the first lap: the steady state
			if err := wk[i].ApplyBatch(fs[i].Fill(ws[i], j, 0, 0)); err != nil {
				b.Fatal(err)
			}
		}
	}
	var blocks int64
	cpu0 := proc.SelfCPU()
	for lap := 1; lap <= b.N; lap++ {
		for j := range ws[0].Len() {
			for i := range n {
				bt := fs[i].Fill(ws[i], j, lap, 0)
				for _, e := range bt.Events {
					if e.Kind == events.KindBlockStored {
						blocks += int64(len(e.BlockHashes))
					}
				}
				if err := wk[i].ApplyBatch(bt); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(float64(blocks)/(proc.SelfCPU()-cpu0).Seconds(), "blocks/cpu-s")
}
