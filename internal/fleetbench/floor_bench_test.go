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
