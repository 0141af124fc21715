package scoring

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// tier_weights sets each class, over the older aliases; bad entries are
// refused naming the entry.
func TestOverrideTierWeights(t *testing.T) {
	base := DefaultPolicy()
	if base.Weights[events.MediumOther] != 0 || base.Weights[events.MediumExternal] != DefaultStorageWeight {
		t.Fatalf("default weights %v", base.Weights)
	}
	p, err := Override{StorageWeight: 0.4, CPUWeight: 0.7, TierWeights: map[string]float64{
		"Disk": 0.3, "other": 0.2, "GPU": 0.9, "external": 0,
	}}.Apply(base)
	want := [events.NumMedia]float64{0.9, 0.7, 0.4, 0.3, 0, 0.2}
	if err != nil || p.Weights != want {
		t.Fatalf("weights %v (%v), want %v", p.Weights, err, want)
	}
	for _, tc := range []struct {
		w    map[string]float64
		want string
	}{
		{map[string]float64{"cpu": -1}, "tier_weights.cpu: -1 must be a finite number from 0 to 1e6"},
		{map[string]float64{"storage": math.NaN()}, "tier_weights.storage: NaN must be"},
		{map[string]float64{"gpu": math.Inf(1)}, "tier_weights.gpu: +Inf must be"},
		{map[string]float64{"disk": 2e6}, "tier_weights.disk: 2e+06 must be"},
		{map[string]float64{"CPU_PINNED": 1}, `tier_weights: unknown tier "CPU_PINNED" (want gpu, cpu, storage, disk, external or other)`},
		{map[string]float64{"cpu": 1, "CPU": 0.5}, "tier_weights.cpu: given twice"},
	} {
		_, err := Override{TierWeights: tc.w}.Apply(base)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.w, err, tc.want)
		}
	}
}

// A block the engine announced with locality REMOTE is held as EXTERNAL:
// Score does not credit it as the worker's GPU or host memory, and a worker
// holding the same prompt locally ranks first. Weighting EXTERNAL changes
// what it is worth.
func TestScoreRemoteBlocksNotLocal(t *testing.T) {
	f := newTestFleet(t, 2)
	r := rand.New(rand.NewPCG(5, 5))
	prompt := tokens(r, 4*testBS)
	hashes := []uint64{1, 2, 3, 4}
	for i, loc := range []string{"LOCAL", "REMOTE"} {
		// A map-era BlockStored of the prompt, medium CPU, as the engine sends it.
		ev := events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: prompt, BlockSize: testBS, MediumName: "CPU"}
		ev.Locality, _ = events.ParseLocality(loc)
		p, err := events.AppendPayload(nil, &events.Batch{Events: []events.Event{ev}}, events.EncodeOptions{Encoding: events.EncodingMap})
		if err != nil {
			t.Fatal(err)
		}
		b, err := events.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.ws[i].ApplyBatch(b); err != nil {
			t.Fatal(err)
		}
	}
	score := func(o Override) []Candidate {
		t.Helper()
		pol, err := o.Apply(DefaultPolicy())
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		if err := New(f.ix, Options{}).Score(&Request{Model: f.model, Tokens: prompt, Policy: &pol}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Ranked
	}
	ranked := score(Override{Guard: "off"})
	if len(ranked) != 2 || ranked[0].Ref != f.ws[0].Info().Ref {
		t.Fatalf("ranked %v, want the local worker first", ranked)
	}
	local, remote := ranked[0], ranked[1]
	if local.Match.ByMedium[events.MediumCPU] != 4 || !near(local.Overlap, DefaultCPUWeight) {
		t.Errorf("local: by medium %v, overlap %v; want 4 in CPU, %v", local.Match.ByMedium, local.Overlap, DefaultCPUWeight)
	}
	var onlyExternal [events.NumMedia]int
	onlyExternal[events.MediumExternal] = 4
	if remote.Match.ByMedium != onlyExternal || !near(remote.Overlap, DefaultStorageWeight) {
		t.Errorf("remote: by medium %v, overlap %v; want 4 in EXTERNAL only, %v", remote.Match.ByMedium, remote.Overlap, DefaultStorageWeight)
	}
	ranked = score(Override{Guard: "off", TierWeights: map[string]float64{"external": 0}})
	if got := ranked[1]; got.Ref != f.ws[1].Info().Ref || got.Overlap != 0 {
		t.Errorf("external weighed 0: remote worker overlap %v, want 0", got.Overlap)
	}
}

// A medium no table knows (OTHER) counts nothing by default, and what
// tier_weights.other says once set.
func TestOtherTierWeight(t *testing.T) {
	var m indexer.Match
	m.ByMedium[events.MediumOther], m.Blocks = 10, 10
	p := DefaultPolicy()
	if got := p.weightedBlocks(&m); got != 0 {
		t.Errorf("default: %v, want 0", got)
	}
	p, err := Override{TierWeights: map[string]float64{"other": 0.25}}.Apply(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.weightedBlocks(&m); !near(got, 2.5) {
		t.Errorf("other 0.25: %v, want 2.5", got)
	}
}
