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

// TestDigests: with WithDigests each worker's digest is exported (its top
// 53 bits, exact as a float), equal for two workers holding the same
// blocks and different once one changes; without it, none.
func TestDigests(t *testing.T) {
	ix := indexer.New(indexer.Config{WorkerCapacity: -1})
	if _, err := ix.AddModel("m", 1); err != nil {
		t.Fatal(err)
	}
	var ws []*indexer.Worker
	for _, pod := range []string{"a", "b"} {
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: pod}, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.ApplyBatch(&events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{7, 8}, BlockSize: 1}}}); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	digests := func(c *Collector) map[string]float64 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() == "kvindex_worker_digest" {
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "pod" {
							got[l.GetValue()] = m.GetGauge().GetValue()
						}
					}
				}
			}
		}
		return got
	}
	if got := digests(NewCollector(ix, nil)); len(got) != 0 {
		t.Fatalf("digests without WithDigests: %v", got)
	}
	got := digests(NewCollector(ix, nil).WithDigests())
	if want := float64(ws[0].Digest() >> 11); got["a"] != want || got["b"] != want || want == 0 {
		t.Fatalf("digests %v, want both %v", got, want)
	}
	if err := ws[1].ApplyBatch(&events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: []uint64{2}}}}); err != nil {
		t.Fatal(err)
	}
	if got := digests(NewCollector(ix, nil).WithDigests()); got["a"] == got["b"] {
		t.Fatalf("digests equal after b changed: %v", got)
	}
}

// statsOnly is a fixed events.StatsSource.
type statsOnly []events.WorkerStats

func (s statsOnly) WorkerStats() []events.WorkerStats { return s }

// Events of unknown types and media no table knows are exported per worker
// from the subscriber's counts.
func TestUnknownEventsAndMediaExported(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel("m", 1); err != nil {
		t.Fatal(err)
	}
	ref := events.WorkerRef{Pod: "a", DPRank: 1}
	if _, err := ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(ix, statsOnly{{Worker: ref, UnknownEvents: 3, UnknownMediumEvents: 7, UnknownMedia: []string{"X"}}}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pod"] == "a" && labels["dp_rank"] == "1" && labels["model"] == "m" {
				got[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["kvindex_unknown_events_total"] != 3 || got["kvindex_unknown_medium_events_total"] != 7 {
		t.Errorf("unknown events %v, media %v; want 3, 7", got["kvindex_unknown_events_total"], got["kvindex_unknown_medium_events_total"])
	}
}
