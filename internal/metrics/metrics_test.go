package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// Evictions are exported once per reason: budget evictions are not also
// counted under reason="capacity", so summing the reasons gives the total.
func TestEvictionsByReasonCountedOnce(t *testing.T) {
	// A budget of 64 blocks' worth (EstimatedBytesPerBlock each).
	ix := indexer.New(indexer.Config{WorkerCapacity: -1, MemoryBudget: 64 * indexer.EstimatedBytesPerBlock})
	if _, err := ix.AddModel("m", 1); err != nil {
		t.Fatal(err)
	}
	w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "a"}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{uint64(i + 1)}, TokenIDs: []uint32{uint32(i)}, BlockSize: 1}}}
		if err := w.ApplyBatch(b); err != nil {
			t.Fatal(err)
		}
	}
	st := w.Stats()
	if st.BudgetEvictions == 0 || st.Evictions != st.BudgetEvictions {
		t.Fatalf("stats %+v: want budget evictions only", st)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(ix, nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvindex_evictions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["budget"] != float64(st.BudgetEvictions) || got["capacity"] != 0 {
		t.Fatalf("evictions by reason %v, want budget %d and capacity 0", got, st.BudgetEvictions)
	}
}
