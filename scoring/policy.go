package scoring

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/quote"
)

// Name selects a ranking policy.
type Name uint8

const (
	CacheAware    Name = iota // ranks by least cost as the guard says.
	LongestPrefix             // ranks by tier-weighted cached blocks, ties by load.
)

var policyNames = [...]string{CacheAware: "cache_aware", LongestPrefix: "longest_prefix"}

// String returns the policy's wire name.
func (n Name) String() string {
	if int(n) < len(policyNames) {
		return policyNames[n]
	}
	return "cache_aware"
}

// Guard is the hotspot guard of CacheAware.
type Guard uint8

const (
	GuardCost Guard = iota // counts queued prefill tokens in the cost.
	// GuardStatic ranks by cached work alone but diverts from workers with
	// over StaticK times the median in-flight requests.
	GuardStatic
	GuardOff // ranks by cached work alone, ties by load.
	// GuardTTFT, the default, ranks by estimated time to first token plus
	// the delay it adds to later requests (CostModel).
	GuardTTFT
)

var guardNames = [...]string{GuardCost: "cost", GuardStatic: "static", GuardOff: "off", GuardTTFT: "ttft"}

// String returns the guard's wire name.
func (g Guard) String() string {
	if int(g) < len(guardNames) {
		return guardNames[g]
	}
	return "cost"
}

// Policy is a ranking policy with its parameters.
type Policy struct {
	Name       Name
	Weights    [events.NumMedia]float64 // weigh a cached block by medium.
	LoadWeight float64                  // scales queued prefill tokens against the request's own uncached tokens (GuardCost).
	Guard      Guard
	StaticK    float64   // GuardStatic's multiple of the median in-flight count.
	Cost       CostModel // GuardTTFT's cost model; zero means DefaultCostModel().
}

// DefaultLoadWeight is how much a queued prefill token counts against an
// uncached one (the best of 1, 1/2 and 1/3 in guard_test.go).
const DefaultLoadWeight = 1.0 / 3

// DefaultPolicy is CacheAware with GuardTTFT and the default parameters.
func DefaultPolicy() Policy {
	p := Policy{Name: CacheAware, LoadWeight: DefaultLoadWeight, Guard: GuardTTFT, StaticK: DefaultStaticK, Cost: DefaultCostModel()}
	p.Weights[events.MediumGPU] = DefaultGPUWeight
	p.Weights[events.MediumCPU] = DefaultCPUWeight
	p.Weights[events.MediumStorage] = DefaultStorageWeight
	p.Weights[events.MediumDisk] = DefaultStorageWeight
	p.Weights[events.MediumExternal] = DefaultStorageWeight
	return p
}

// Tier weights and the static guard's multiple of DefaultPolicy. OTHER, a
// medium name no table knows, weighs 0 (not credited) until configured:
// the tier may be remote.
const (
	DefaultGPUWeight = 1.0 // a block in GPU memory
	// DefaultCPUWeight weighs a block offloaded to host memory: loading it
	// back costs a little, recomputing it more.
	DefaultCPUWeight     = 0.8
	DefaultStorageWeight = 0.5 // a block in a storage, disk or external tier (a REMOTE block is external)
	DefaultStaticK       = 2.0 // the published rule
)

// Override is a request's changes to a policy; zero fields keep the base.
type Override struct {
	Name string
	// GPUWeight, CPUWeight and StorageWeight are aliases of TierWeights'
	// gpu, cpu, and storage, disk and external (the older settings).
	GPUWeight, CPUWeight, StorageWeight float64
	// TierWeights weighs a cached block by tier class name ("gpu", "cpu",
	// "storage", "disk", "external", "other"; any case), over the aliases.
	// A present 0 is a weight: the tier is not credited.
	TierWeights         map[string]float64
	LoadWeight, StaticK float64
	Guard               string
}

// Apply returns base with o's non-zero fields applied, or an error naming
// the bad field.
func (o Override) Apply(base Policy) (Policy, error) {
	p := base
	if o.Name != "" {
		i := slices.Index(policyNames[:], o.Name)
		if i < 0 {
			return p, fmt.Errorf("name: unknown policy %s (want cache_aware or longest_prefix)", quote.Q(o.Name))
		}
		p.Name = Name(i)
	}
	if o.Guard != "" {
		i := slices.Index(guardNames[:], o.Guard)
		if i < 0 {
			return p, fmt.Errorf("guard: unknown guard %s (want ttft, cost, static or off)", quote.Q(o.Guard))
		}
		p.Guard = Guard(i)
	}
	for _, f := range []struct {
		name string
		v    float64
		dst  []*float64
	}{
		{"gpu_weight", o.GPUWeight, []*float64{&p.Weights[events.MediumGPU]}},
		{"cpu_weight", o.CPUWeight, []*float64{&p.Weights[events.MediumCPU]}},
		{"storage_weight", o.StorageWeight, []*float64{&p.Weights[events.MediumStorage], &p.Weights[events.MediumDisk], &p.Weights[events.MediumExternal]}},
		{"load_weight", o.LoadWeight, []*float64{&p.LoadWeight}},
		{"static_k", o.StaticK, []*float64{&p.StaticK}},
	} {
		if f.v == 0 {
			continue
		}
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v > 1e6 {
			return p, fmt.Errorf("%s: %v must be a positive finite number", f.name, f.v)
		}
		for _, d := range f.dst {
			*d = f.v
		}
	}
	return p, o.applyTierWeights(&p)
}

// applyTierWeights sets p's weights from o.TierWeights, or returns an error
// naming the bad entry.
func (o Override) applyTierWeights(p *Policy) error {
	var seen uint8
	for name, v := range o.TierWeights {
		m, ok := events.ParseMediumClass(name)
		if !ok {
			return fmt.Errorf("tier_weights: unknown tier %s (want gpu, cpu, storage, disk, external or other)", quote.Q(name))
		}
		field := "tier_weights." + strings.ToLower(m.String())
		if seen&(1<<m) != 0 {
			return fmt.Errorf("%s: given twice (names ignore case)", field)
		}
		seen |= 1 << m
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 1e6 {
			return fmt.Errorf("%s: %v must be a finite number from 0 to 1e6", field, v)
		}
		p.Weights[m] = v
	}
	return nil
}

// Load is one worker's load as a ranking sees it.
type Load struct {
	Running, Waiting    uint32  // requests running and queued on the engine.
	KVUsage             float64 // the fraction of the KV cache in use.
	QueuedPrefillTokens uint64  // the caller's prompt tokens admitted but not prefilled (0: estimated).
	// InflightRequests and InflightPrefillTokens are what kvindex routed
	// to the worker and has not seen released or expired.
	InflightRequests      uint32
	InflightPrefillTokens uint64
	Source                string // says where Running/Waiting came from: "request", "scrape" or "".
	ResidentBlocks        uint64 // the pool's blocks the index holds for the worker, every group's (GuardTTFT's Evict).
}

// Candidate is one worker to rank; Rank fills the result fields.
type Candidate struct {
	Match indexer.Match
	// Ref and Gen (of Match.Worker's id) name the worker; Health is its
	// health when listed. Set by Scorer, not read by Rank.
	Ref         events.WorkerRef
	Gen         uint32
	Health      events.Health
	Speculative int // how many of Match.Blocks are only expected (Route).
	Load        Load

	// Results, set by Rank.
	Overlap  float64  // the tier-weighted cached fraction of the prompt.
	Queue    float64  // the queued prefill tokens the ranking assumed.
	Own      float64  // the request's own prefill tokens on this worker (uncached).
	Penalty  float64  // the static guard's diversion, in tokens (0 if none).
	Est      Estimate // GuardTTFT's estimate, in seconds.
	Score    float64  // the ranking value, higher is better.
	Diverted bool     // set when the static guard moved the worker back.
}

// Prompt describes the request being ranked.
type Prompt struct {
	// Blocks is the number of full blocks; Tokens the prompt's length.
	Blocks, Tokens, BlockSize int
	AvgPromptTokens           float64 // estimates the prompt tokens of one waiting request.
	// AvgUncachedTokens is the average uncached prefill of routed requests
	// (0: unknown, AvgPromptTokens is used), for GuardTTFT's queue.
	AvgUncachedTokens float64
	// ArrivalRate is the model's routed requests per second (0: unknown)
	// and Workers the number of its workers, for GuardTTFT's Delay.
	ArrivalRate float64
	Workers     int
	// SharedRates[i], for i < SharedDepths, is the rate of requests whose
	// prompts share this prompt's first SharedDepth(i) blocks (0: unknown).
	SharedRates  [MaxSharedDepths]float64
	SharedDepths int
}

// holders is, for each sampled depth of the prompt, how many candidates'
// matches reach it, the least TTFT among them, and the arrivals estimate
// of a candidate whose match reaches it and no deeper sampled depth.
type holders struct {
	depths int // sampled depths in use, at most MaxSharedDepths
	n      [MaxSharedDepths]int
	best   [MaxSharedDepths]float64
	arr    [MaxSharedDepths]float64
}

// within is how many of the prompt's sampled depths c's match reaches.
func (h *holders) within(c *Candidate) int { return min(sharedWithin(c.Match.Blocks), h.depths) }

// count fills h.n and h.arr from cs. Cost: O(c + depths).
func (h *holders) count(pr *Prompt, cs []Candidate) {
	h.depths = min(max(pr.SharedDepths, 0), MaxSharedDepths)
	var cnt [MaxSharedDepths + 1]int
	for i := range cs {
		cnt[h.within(&cs[i])]++
	}
	h.n = [MaxSharedDepths]int{}
	run := 0
	for j := h.depths - 1; j >= 0; j-- {
		run += cnt[j+1]
		h.n[j] = run
	}
	a, w := pr.ArrivalRate, float64(pr.Workers)
	if a <= 0 || w <= 0 {
		return
	}
	best := a / w
	for j := 0; j < h.depths; j++ {
		ad := pr.sharedRate(j)
		n := math.Min(math.Max(float64(h.n[j]), 1), w)
		best = math.Max(best, (a-ad)/w+ad/n)
		h.arr[j] = best
	}
}

// fastest fills h.best from cs's estimates. Cost: O(c + depths).
func (h *holders) fastest(cs []Candidate) {
	var at [MaxSharedDepths + 1]float64
	for k := range at {
		at[k] = math.Inf(1)
	}
	for i := range cs {
		k := h.within(&cs[i])
		at[k] = math.Min(at[k], cs[i].Est.TTFT())
	}
	run := math.Inf(1)
	for j := h.depths - 1; j >= 0; j-- {
		run = math.Min(run, at[j+1])
		h.best[j] = run
	}
}

// sharedWithin is the number of sampled depths of at most blocks.
func sharedWithin(blocks int) int {
	if blocks < 1 {
		return 0
	}
	l := bits.Len(uint(blocks))
	if l == 1 {
		return 1
	}
	n := 2*l - 2
	if blocks>>(l-2)&1 == 1 {
		n++
	}
	return n
}

// sharedRate is the rate of requests sharing the first SharedDepth(i)
// blocks, at most the fleet's.
func (pr *Prompt) sharedRate(i int) float64 {
	return math.Min(math.Max(pr.SharedRates[i], 0), pr.ArrivalRate)
}

// arrivals estimates the rate of requests that will reach c after this
// one (a_w in the package documentation); h is filled by count.
func (pr *Prompt) arrivals(c *Candidate, h *holders) float64 {
	a, w := pr.ArrivalRate, float64(pr.Workers)
	if a <= 0 || w <= 0 {
		return 0
	}
	if k := h.within(c); k > 0 {
		return h.arr[k-1]
	}
	return a / w
}

// relief fills c.Est.Relief (relief_w in the package documentation),
// counting only hot prefixes: a cold prefix's holder is busy with other
// requests, which a copy does not divert. Cost: O(depths).
func (pr *Prompt) relief(c *Candidate, h *holders, rho float64) {
	c.Est.Relief = 0
	if pr.ArrivalRate <= 0 || pr.Workers <= 0 {
		return
	}
	fair := pr.ArrivalRate / float64(pr.Workers)
	own := c.Est.TTFT()
	for i := h.within(c); i < h.depths; i++ {
		if h.n[i] == 0 {
			continue
		}
		t := h.best[i]
		if t <= own {
			continue
		}
		ad := pr.sharedRate(i)
		if ad/float64(h.n[i]) <= fair {
			continue // cold: the holders' backlog is not this prefix's
		}
		diverted := ad / float64(h.n[i]+1)
		c.Est.Relief = math.Max(c.Est.Relief, diverted*t/(1-rho)*(t-own)/2)
	}
}

// weightedBlocks is the tier-weighted number of cached blocks: media in
// descending weight each add the part of their prefix not already
// counted; blocks in no single medium's prefix count at the lowest weight
// of the media holding any. Exact when media prefixes nest.
func (p *Policy) weightedBlocks(m *indexer.Match) float64 {
	var order [events.NumMedia]int
	for i := range order {
		order[i] = i
	}
	// Insertion sort by weight, descending: NumMedia is 6.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && p.Weights[order[j]] > p.Weights[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	covered, total := 0, 0.0
	lowest := math.Inf(1)
	for _, med := range order {
		n := m.ByMedium[med]
		if n == 0 {
			continue
		}
		lowest = min(lowest, p.Weights[med])
		if n > covered {
			total += float64(n-covered) * p.Weights[med]
			covered = n
		}
	}
	if m.Blocks > covered && !math.IsInf(lowest, 1) {
		total += float64(m.Blocks-covered) * lowest
	}
	return total
}

// Rank scores every candidate under p and sorts them best first; names
// resolves worker ids for the final tie-break. Cost: O(c log c), no
// allocation.
func (p *Policy) Rank(pr Prompt, cs []Candidate, names []events.WorkerRef) {
	tokens := float64(max(pr.Tokens, pr.Blocks*pr.BlockSize))
	for i := range cs {
		c := &cs[i]
		wb := p.weightedBlocks(&c.Match)
		if pr.Blocks > 0 {
			c.Overlap = wb / float64(pr.Blocks)
		}
		c.Own = math.Max(0, tokens-wb*float64(pr.BlockSize))
		c.Queue = queueTokens(&c.Load, pr.AvgPromptTokens)
		c.Penalty, c.Diverted, c.Est = 0, false, Estimate{}
	}
	ttft := p.Name == CacheAware && p.Guard == GuardTTFT
	if ttft {
		m := p.Cost.params()
		avg := pr.AvgUncachedTokens
		if avg <= 0 {
			avg = pr.AvgPromptTokens
		}
		var h holders
		h.count(&pr, cs)
		for i := range cs {
			c := &cs[i]
			c.Queue = queueTokens(&c.Load, avg)
			m.estimateAt(&c.Est, &c.Load, c.Queue, c.Own, tokens-c.Own, &pr, pr.arrivals(c, &h))
			m.evict(&c.Est, &c.Load, c.Own, &pr)
		}
		h.fastest(cs)
		rho := m.rho(&pr)
		for i := range cs {
			pr.relief(&cs[i], &h, rho)
		}
	}
	if p.Name == CacheAware && p.Guard == GuardStatic {
		p.divert(cs, tokens)
	}
	for i := range cs {
		c := &cs[i]
		switch {
		case p.Name == LongestPrefix:
			c.Score = c.Overlap
		case ttft:
			c.Score = -c.Est.Cost()
		case p.Guard == GuardCost:
			c.Score = -(c.Own + p.LoadWeight*c.Queue)
		default:
			c.Score = -(c.Own + c.Penalty)
		}
	}
	r := Ranker{Names: names}
	slices.SortFunc(cs, func(a, b Candidate) int {
		if a.Diverted != b.Diverted {
			if a.Diverted {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Queue, b.Queue); c != 0 {
			return c
		}
		// Equal work: the less busy worker, so that prompts cached nowhere
		// spread over the fleet.
		if c := cmp.Compare(busy(&a.Load), busy(&b.Load)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Load.KVUsage, b.Load.KVUsage); c != 0 {
			return c
		}
		return r.Compare(a.Match, b.Match)
	})
}

// secs formats seconds for Explain: milliseconds below 10 s.
func secs(s float64) string {
	if s < 10 {
		return strconv.FormatFloat(s*1000, 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + " s"
}

// queueTokens estimates a worker's queued prefill tokens.
func queueTokens(l *Load, avgPrompt float64) float64 {
	if l.QueuedPrefillTokens > 0 {
		return float64(l.QueuedPrefillTokens)
	}
	return math.Max(float64(l.InflightPrefillTokens), float64(l.Waiting)*avgPrompt)
}

// busy counts a worker's requests: what the engine reports or what kvindex
// routed there, whichever is larger.
func busy(l *Load) uint32 { return max(l.InflightRequests, l.Running+l.Waiting) }

// divert applies the static guard: workers with over StaticK times the
// median in-flight requests are moved back, penalised by the whole prompt.
func (p *Policy) divert(cs []Candidate, tokens float64) {
	if len(cs) < 2 {
		return
	}
	var buf [256]uint32 // up to 256 candidates without allocating
	counts := buf[:0]
	for i := range cs {
		counts = append(counts, busy(&cs[i].Load))
	}
	slices.Sort(counts)
	median := float64(counts[len(counts)/2])
	limit := p.StaticK * math.Max(median, 1)
	for i := range cs {
		if n := float64(busy(&cs[i].Load)); n > limit {
			cs[i].Diverted, cs[i].Penalty = true, tokens
		}
	}
}

// Explain describes why a candidate ranks where it does, in one line.
func (p *Policy) Explain(pr Prompt, c *Candidate) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d/%d blocks cached", c.Match.Blocks, pr.Blocks)
	var media []string
	for m, n := range c.Match.ByMedium {
		if n > 0 {
			media = append(media, events.Medium(m).String()+" "+strconv.Itoa(n))
		}
	}
	if len(media) > 0 {
		sb.WriteString(" (" + strings.Join(media, ", "))
		if c.Speculative > 0 {
			fmt.Fprintf(&sb, "; %d expected from recent routes", c.Speculative)
		}
		sb.WriteString(")")
	}
	switch {
	case p.Name == LongestPrefix:
		fmt.Fprintf(&sb, "; weighted overlap %.2f; queue %.0f tokens breaks ties", c.Overlap, c.Queue)
	case p.Guard == GuardTTFT:
		e := &c.Est
		fmt.Fprintf(&sb, "; est. TTFT %s = %s wait (%.0f queued tokens, %d decoding) + %s own prefill (%.0f tokens)", secs(e.TTFT()), secs(e.Wait), c.Queue, c.Load.Running, secs(e.Prefill), c.Own)
		if e.Pressure > 0 {
			fmt.Fprintf(&sb, " + %s KV pressure (%.0f%% used)", secs(e.Pressure), 100*c.Load.KVUsage)
		}
		fmt.Fprintf(&sb, "; + %s delay to requests behind", secs(e.Delay))
		if e.Evict > 0 {
			fmt.Fprintf(&sb, " + %s recomputing what it evicts", secs(e.Evict))
		}
		if e.Relief > 0 {
			fmt.Fprintf(&sb, " - %s relief to the prefix's busy holders", secs(e.Relief))
		}
		fmt.Fprintf(&sb, " = cost %s", secs(e.Cost()))
	case p.Guard == GuardCost:
		fmt.Fprintf(&sb, "; cost = %.0f own prefill + %.1f x %.0f queued = %.0f tokens", c.Own, p.LoadWeight, c.Queue, c.Own+p.LoadWeight*c.Queue)
	default:
		fmt.Fprintf(&sb, "; cost = %.0f own prefill tokens", c.Own)
	}
	if c.Diverted {
		fmt.Fprintf(&sb, "; diverted: %d in flight > %.1f x median", busy(&c.Load), p.StaticK)
	}
	return sb.String()
}
