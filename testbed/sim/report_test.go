package sim

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/metrics"
)

func TestSweepTableShowsRejected(t *testing.T) {
	points := []SweepPoint{
		{CacheBlocks: 64, Results: []metrics.Result{
			{Router: "round-robin", Requests: 10, Rejected: 10},
			{Router: "precise", Requests: 10, Scheduled: 6, Rejected: 4, PromptTokens: 1000, CachedTokens: 250},
		}},
		{CacheBlocks: 4096, Results: []metrics.Result{
			{Router: "round-robin", Requests: 10, Scheduled: 10, PromptTokens: 1000, CachedTokens: 100},
			{Router: "precise", Requests: 10, Scheduled: 10, PromptTokens: 1000, CachedTokens: 500},
		}},
	}
	var b bytes.Buffer
	if err := WriteSweepTable(&b, points); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(out, "\n")
	if len(lines) < 4 {
		t.Fatalf("table:\n%s", out)
	}
	if got := strings.Fields(lines[1]); strings.Join(got, " ") != "64 all rejected (10) 25.0% (4 rej)" {
		t.Errorf("row at 64 blocks = %q, want the rejections shown, not 0.0%%", lines[1])
	}
	if got := strings.Fields(lines[2]); strings.Join(got, " ") != "4096 10.0% 50.0%" {
		t.Errorf("row at 4096 blocks = %q", lines[2])
	}
	if !strings.Contains(out, "were rejected") || slices.Contains(strings.Fields(out), "0.0%") {
		t.Errorf("table lacks the rejection note or prints 0.0%%:\n%s", out)
	}
	b.Reset()
	if err := WriteSweepTable(&b, points[1:]); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "rej") {
		t.Errorf("a sweep with no rejections mentions them:\n%s", b.String())
	}
}

func TestLoadWorkloadPause(t *testing.T) {
	spec := WorkloadSpec{Kind: KindPrefixes, Requests: 5, Seed: 1}
	w, err := LoadWorkload(spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.Pause = 10 * time.Second
	p, err := LoadWorkload(spec)
	if err != nil {
		t.Fatal(err)
	}
	if p.Requests[0].Arrival != w.Requests[0].Arrival || p.Requests[4].Arrival != w.Requests[4].Arrival+10*time.Second ||
		p.Name != "prefixes (+10s after the first request)" {
		t.Fatalf("paused workload %q: first at %v, last at %v", p.Name, p.Requests[0].Arrival, p.Requests[4].Arrival)
	}
	spec.Pause = -time.Second
	if _, err := LoadWorkload(spec); err == nil {
		t.Fatal("negative pause: no error")
	}
}
