package fleetbench

import "testing"

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
