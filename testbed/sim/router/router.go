package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// Router names, as accepted by New and printed in reports.
const (
	RoundRobin   = "round-robin"
	LeastLoaded  = "least-loaded"
	PrefixHash   = "prefix-hash"
	Approximate  = "approximate"
	Precise      = "precise"
	PreciseLoad  = "precise+load"
	TTFTGreedy   = "ttft-greedy"
	defaultAffin = 1024
)

// precise+load's modes (Config.PreciseLoadMode).
const (
	ModeRoute  = "route"
	ModeClient = "client"
)

// Names lists every router, in report order.
var Names = []string{RoundRobin, LeastLoaded, PrefixHash, Approximate, LLMD, LLMDPrecise, Dynamo, SGLang, AIBrix, Precise, PreciseLoad, TTFTGreedy}

// ErrUnknown is wrapped by New for an unknown router name.
var ErrUnknown = errors.New("router: unknown router")

// Request is a request as a router sees it.
type Request struct {
	*workload.Request
	// Content holds the block content ids at the fleet's block size
	// (prompt, then output); Content[:PromptBlocks] are the prompt's full
	// blocks. Valid only during Route.
	Content      []uint64
	PromptBlocks int
}

// Fleet is what routers may see of the engines, each by index 0..Engines()-1.
type Fleet interface {
	Engines() int
	Load(i int) engine.Load
	// CachedTokens is how many prompt tokens of req engine i would hit if
	// it scheduled req now (its exact cache, unpublished steps included);
	// only TTFTGreedy may call it.
	CachedTokens(i int, req *Request) int
}

// KV is kvindex as the precise routers ask it, in process or over gRPC;
// workers are named by pod.
type KV interface {
	// Score calls visit with the matched prompt tokens of every worker in
	// kvindex's answer for q.
	Score(ctx context.Context, q *Query, visit func(pod string, matchedTokens int)) error
	// Route returns the pod kvindex chose for request id.
	Route(ctx context.Context, id string, q *Query) (string, error)
	// Release ends request id's in-flight accounting.
	Release(ctx context.Context, id string) error
}

// RouteMatcher is a KV whose Route also learns the chosen worker's match
// from kvindex's ranking (both of kvsim's do).
type RouteMatcher interface {
	// RouteMatched returns the matched prompt tokens of the worker the
	// last Route chose.
	RouteMatched() int
}

// RouteEstimator is a KV whose Route also learns kvindex's estimated
// time to first token on the chosen worker (the "ttft" guard's estimate).
type RouteEstimator interface {
	// RouteEstimate returns the estimate of the last Route's choice, or
	// false when its policy made none.
	RouteEstimate() (time.Duration, bool)
}

// Estimator is a router whose last Route learned kvindex's estimated time
// to first token on the chosen engine: precise+load in virtual time.
type Estimator interface {
	// Estimated returns that estimate, or false when there was none.
	Estimated() (time.Duration, bool)
}

// Predictor is a router whose last Route learned from kvindex how many
// prompt tokens the chosen engine holds: the precise routers.
type Predictor interface {
	// Predicted returns the matched prompt tokens kvindex reported for the
	// engine the last Route chose, or false when it reported none.
	Predicted() (tokens int, ok bool)
}

// Query is one prompt as a precise router sends it to kvindex; Loads and
// Policy (nil: the server's) are sent with Route only.
type Query struct {
	Model  string
	Tokens []uint32 // valid during the call
	Loads  []PodLoad
	Policy *scoring.Override
}

// PodLoad is one engine's load as a router sees it.
type PodLoad struct {
	Pod              string
	Running, Waiting uint32
	KVUsage          float64
}

// Router picks an engine for each request.
type Router interface {
	Name() string
	Route(ctx context.Context, req *Request) (int, error)
	// PrefillDone tells the router that req's prefill finished on engine i.
	PrefillDone(ctx context.Context, req *workload.Request, i int) error
	// Note says anything the report must mention (a fallback taken), or "".
	Note() string
}

// Config sets up routers.
type Config struct {
	// Fleet and BlockSize are required.
	Fleet     Fleet
	BlockSize int
	// Names (engine i is pod Names[i]), Model and KV are kvindex as the
	// precise routers ask it; required for them.
	Names          []string
	Model          string
	KV             KV
	AffinityTokens int // how much of the prompt prefix-hash hashes (default 1,024)
	// LRUBlocks is approximate's LRU per engine in blocks (GIE's
	// lruCapacityPerServer, which its autoTune sets to the engines' cache;
	// default 31,250, GIE's).
	LRUBlocks       int
	PreciseLoadMode string            // ModeRoute (default) or ModeClient
	RoutePolicy     *scoring.Override // sent with every Route request when not nil
	Seed            uint64            // of the random tie-breaks
}

// New returns the router called name.
func New(name string, cfg Config) (Router, error) {
	if cfg.Fleet == nil || cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("router %s: a fleet and a block size are required", name)
	}
	n := cfg.Fleet.Engines()
	switch name {
	case RoundRobin:
		return &roundRobin{n: n}, nil
	case LeastLoaded:
		return &leastLoaded{f: cfg.Fleet}, nil
	case PrefixHash:
		toks := cfg.AffinityTokens
		if toks <= 0 {
			toks = defaultAffin
		}
		return newPrefixHash(n, max(1, toks/cfg.BlockSize)), nil
	case Approximate:
		return newApproximate(cfg), nil
	case LLMD:
		return newLLMD(name, cfg), nil
	case SGLang:
		return newSGLang(cfg)
	case AIBrix:
		return newAIBrix(cfg)
	case TTFTGreedy:
		return &ttftGreedy{f: cfg.Fleet}, nil
	}
	if !NeedsIndex(name) {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(Names, ", "))
	}
	if cfg.KV == nil || len(cfg.Names) != n || cfg.Model == "" {
		return nil, fmt.Errorf("router %s: kvindex, the model and one pod name per engine are required", name)
	}
	switch name {
	case LLMDPrecise:
		return newLLMD(name, cfg), nil
	case Dynamo:
		return newDynamo(cfg), nil
	case Precise, PreciseLoad:
		if m := cfg.PreciseLoadMode; m != "" && m != ModeRoute && m != ModeClient {
			return nil, fmt.Errorf("router %s: mode %q (want %s or %s)", name, m, ModeRoute, ModeClient)
		}
		return newPrecise(name, cfg), nil
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(Names, ", "))
}

// Parse splits a comma-separated list of router names ("all": every
// router), reading a former name ("oracle") as the current one.
func Parse(list string) ([]string, error) {
	if list == "" || list == "all" {
		return slices.Clone(Names), nil
	}
	var out []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n == "oracle" {
			n = TTFTGreedy
		}
		if !slices.Contains(Names, n) {
			return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, n, strings.Join(Names, ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// NeedsIndex reports whether the router asks kvindex: the precise routers,
// and the peers that read KV events (kvindex's index stands in for theirs).
func NeedsIndex(name string) bool {
	return name == Precise || name == PreciseLoad || name == LLMDPrecise || name == Dynamo
}

// base implements the optional parts of Router.
type base struct{}

func (base) PrefillDone(context.Context, *workload.Request, int) error { return nil }
func (base) Note() string                                              { return "" }

type roundRobin struct {
	base
	n, next int
}

func (r *roundRobin) Name() string { return RoundRobin }

func (r *roundRobin) Route(context.Context, *Request) (int, error) {
	i := r.next
	r.next = (r.next + 1) % r.n
	return i, nil
}

type leastLoaded struct {
	base
	f    Fleet
	next int
}

func (r *leastLoaded) Name() string { return LeastLoaded }

func (r *leastLoaded) Route(context.Context, *Request) (int, error) {
	i := pickLeastLoaded(r.f, r.next, nil)
	r.next = (i + 1) % r.f.Engines()
	return i, nil
}

// pickLeastLoaded returns, among the engines ok accepts (nil: all), the
// one with the fewest running + waiting requests, then the lowest KV
// usage, scanning from start so that ties rotate.
func pickLeastLoaded(f Fleet, start int, ok func(int) bool) int {
	n := f.Engines()
	best, bestReqs, bestKV := -1, 0, 0.0
	for k := range n {
		i := (start + k) % n
		if ok != nil && !ok(i) {
			continue
		}
		l := f.Load(i)
		reqs := l.Running + l.Waiting
		if best < 0 || reqs < bestReqs || (reqs == bestReqs && l.KVUsage < bestKV) {
			best, bestReqs, bestKV = i, reqs, l.KVUsage
		}
	}
	return best
}

// prefixHash maps the hash of the prompt's first blocks onto a consistent
// hash ring of vnodes points per engine.
type prefixHash struct {
	base
	blocks int
	ring   []ringPoint
}

type ringPoint struct {
	pos    uint64
	engine int
}

const vnodes = 128

func newPrefixHash(n, blocks int) *prefixHash {
	r := &prefixHash{blocks: blocks, ring: make([]ringPoint, 0, n*vnodes)}
	for e := range n {
		for v := range vnodes {
			r.ring = append(r.ring, ringPoint{pos: workload.Mix64(uint64(e)<<32 | uint64(v)), engine: e})
		}
	}
	sort.Slice(r.ring, func(i, j int) bool { return r.ring[i].pos < r.ring[j].pos })
	return r
}

func (r *prefixHash) Name() string { return PrefixHash }

func (r *prefixHash) Route(_ context.Context, req *Request) (int, error) {
	k := min(r.blocks, len(req.Content))
	h := uint64(0x70726566)
	for _, c := range req.Content[:k] {
		h = workload.Mix64(h ^ c)
	}
	i := sort.Search(len(r.ring), func(i int) bool { return r.ring[i].pos >= h })
	if i == len(r.ring) {
		i = 0
	}
	return r.ring[i].engine, nil
}

type ttftGreedy struct {
	base
	f    Fleet
	next int
}

func (r *ttftGreedy) Name() string { return TTFTGreedy }

// Route picks the least estimated TTFT, in tokens (every engine prefills
// at one rate): the engine's exact queued prefill (no engine exports it)
// plus this request's uncached tokens there; ties by the longer hit, then
// fewer requests, then in turn. Not a bound: precise, ignoring load, can
// hit more, and greedy ignores what a prefill costs the requests queued
// behind it. (A hit-maximising greedy router would send all of Mooncake
// to the first engine that cached its shared first block.)
func (r *ttftGreedy) Route(_ context.Context, req *Request) (int, error) {
	n := r.f.Engines()
	best, bestCost, bestHit, bestReqs := -1, int64(0), 0, 0
	for k := range n {
		i := (r.next + k) % n
		l := r.f.Load(i)
		hit := r.f.CachedTokens(i, req)
		cost := l.QueuedPrefill + int64(req.PromptLen-hit)
		reqs := l.Running + l.Waiting
		if best < 0 || cost < bestCost || (cost == bestCost && (hit > bestHit || (hit == bestHit && reqs < bestReqs))) {
			best, bestCost, bestHit, bestReqs = i, cost, hit, reqs
		}
	}
	r.next = (best + 1) % n
	return best, nil
}
