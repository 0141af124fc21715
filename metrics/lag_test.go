package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestLag: each source's batches land in their own series, in the
// bucket of their age; an unknown timestamp is not counted and a future
// one counts as 0.
func TestLag(t *testing.T) {
	l := NewLag()
	now := time.Unix(1000, 0)
	l.Observe(LagZMQ, 999.9985, now) // 1.5 ms
	l.Observe(LagZMQ, 997, now)      // 3 s
	l.Observe(LagZMQ, 0, now)        // unknown: not counted
	l.Observe(LagNATS, 1000.25, now) // the engine's clock ahead: 0
	reg := prometheus.NewRegistry()
	reg.MustRegister(l.Collector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %d families, %v", len(mfs), err)
	}
	hist := map[string]*dto.Histogram{}
	for _, m := range mfs[0].GetMetric() {
		hist[m.GetLabel()[0].GetValue()] = m.GetHistogram()
	}
	cum := func(h *dto.Histogram, le float64) uint64 {
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == le {
				return b.GetCumulativeCount()
			}
		}
		t.Fatalf("no bucket %v", le)
		return 0
	}
	z, n := hist[LagZMQ], hist[LagNATS]
	if z.GetSampleCount() != 2 || cum(z, 0.001) != 0 || cum(z, 0.002) != 1 || cum(z, 2.5) != 1 || cum(z, 5) != 2 {
		t.Fatalf("zmq: count %d, buckets %v", z.GetSampleCount(), z.GetBucket())
	}
	if n.GetSampleCount() != 1 || n.GetSampleSum() != 0 || cum(n, 0.0005) != 1 {
		t.Fatalf("nats: count %d sum %v", n.GetSampleCount(), n.GetSampleSum())
	}
}
