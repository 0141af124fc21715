package sim

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// TestIndexCheckComparesEachGroup: a gpt-oss engine (a sliding-window and
// a full-attention group) evicting from a small cache agrees with the
// kvindex fed all its batches, group by group; fed the same batches less
// one of the window group's removals, kvindex holds one block too many in
// that group alone, which the check counts and names, beside a refused
// event.
func TestIndexCheckComparesEachGroup(t *testing.T) {
	l, err := engine.Preset("gpt-oss")
	if err != nil {
		t.Fatal(err)
	}
	o, err := Options{Engines: 1, Engine: engine.Config{CacheBlocks: 96, Layout: l}, Seed: 1}.withDefaults(1)
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFleet(&o, true)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := newPipeline(&o, nil)
	if err != nil {
		t.Fatal(err)
	}
	lossy, err := newPipeline(&o, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := f.engines[0]
	var batches []events.Batch
	now := time.Duration(0)
	for i := range 8 {
		r := &workload.Request{ID: i, Prompt: []workload.Segment{{ID: uint64(i % 3), Len: 300}, {ID: uint64(10 + i), Len: 60}}, PromptLen: 360, OutputLen: 4}
		if !e.Submit(r, r.AppendBlockContent(nil, 16, r.OutputSegment(0))) {
			t.Fatal("rejected")
		}
		for !e.Idle() {
			d, _ := e.StartStep(now)
			now += d
			if res := e.FinishStep(now); res.Batch != nil {
				b := *res.Batch
				b.Events = slices.Clone(b.Events)
				for k := range b.Events {
					b.Events[k].BlockHashes = slices.Clone(b.Events[k].BlockHashes)
					b.Events[k].TokenIDs = slices.Clone(b.Events[k].TokenIDs)
				}
				batches = append(batches, b)
			}
		}
	}
	// The lossy index misses the last removal from the window group (a
	// block not stored again since).
	drop := -1
	for i, b := range batches {
		if slices.ContainsFunc(b.Events, func(ev events.Event) bool { return ev.Kind == events.KindBlockRemoved && ev.GroupIdx == 0 }) {
			drop = i
		}
	}
	if drop < 0 {
		t.Fatal("the cache evicted no window block: nothing to drop")
	}
	for i := range batches {
		b := &batches[i]
		payload, err := whole.encode(b, true)
		if err != nil {
			t.Fatal(err)
		}
		whole.apply(0, payload)
		if i == drop {
			k := slices.IndexFunc(b.Events, func(ev events.Event) bool { return ev.Kind == events.KindBlockRemoved && ev.GroupIdx == 0 })
			b.Events = slices.Delete(b.Events, k, k+1)
		}
		if payload, err = lossy.encode(b, true); err != nil {
			t.Fatal(err)
		}
		lossy.apply(0, payload)
	}
	if c := whole.check(f); c.total() != 0 {
		t.Fatalf("every batch applied: %d problems: %s", c.total(), c)
	}
	bad := events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: make([]uint32, 8), BlockSize: 16,
		GroupIdx: 1, HasGroupIdx: true, SpecKind: engine.KindFullAttention}}}
	payload, err := lossy.encode(&bad, true)
	if err != nil {
		t.Fatal(err)
	}
	lossy.apply(0, payload)
	c := lossy.check(f)
	if c.total() != 2 || c.n[probGroups] != 1 || c.n[probRefused] != 1 {
		t.Fatalf("a removal lost and an event refused: %d problems: %s", c.total(), c)
	}
	want := "1 events refused; 1 KV-cache groups unlike their engine's cache (first: "
	if s := c.String(); !strings.HasPrefix(s, want) || !strings.Contains(s, "token count") {
		t.Errorf("detail %q, want it to start %q and quote the refusal", s, want)
	}
	c.first = ""
	lossy.firstErr = nil
	c = lossy.check(f)
	if s := c.String(); !strings.Contains(s, "engine 0 group 0 (sliding_window) caches") {
		t.Errorf("detail %q does not name the group", s)
	}
}

// TestReportNamesIndexProblems: the table's note says what kvindex
// disagreed on, and the agreement line speaks of KV-cache groups.
func TestReportNamesIndexProblems(t *testing.T) {
	results := []metrics.Result{
		{Router: "precise", IndexProblems: 3, IndexDetail: "2 events refused; 1 KV-cache groups unlike their engine's cache (first: x)"},
		{Router: "precise+load"},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, results, nil, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"[1] precise: kvindex disagreed with the engines: 2 events refused; 1 KV-cache groups unlike their engine's cache (first: x)\n",
		"kvindex agreed with the engines (precise+load): every event applied, each KV-cache group's resident blocks equal its engine's cache\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
