package router

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	RoundRobin  = "round-robin"
	LeastLoaded = "least-loaded"
	PrefixHash  = "prefix-hash"
	Approximate = "approximate"
	Precise     = "precise"
	PreciseLoad = "precise+load"
	// TTFTGreedy is the perfect-knowledge TTFT-greedy router (formerly
	// "oracle", a name Parse still accepts): a reference, not a bound.
	TTFTGreedy   = "ttft-greedy"
	defaultAffin = 1024
)

// precise+load modes (Config.PreciseLoadMode).
const (
	ModeRoute  = "route"
	ModeClient = "client"
)

// Names lists every router, in report order.
var Names = []string{RoundRobin, LeastLoaded, PrefixHash, Approximate, Precise, PreciseLoad, TTFTGreedy}

// aliases are former router names Parse still accepts.
var aliases = map[string]string{"oracle": TTFTGreedy}

// ErrUnknown is wrapped by New for an unknown router name.
var ErrUnknown = errors.New("router: unknown router")

// Request is a request as a router sees it.
type Request struct {
	*workload.Request
	// Content holds the request's block content ids at the fleet's block
	// size (prompt, then output; see workload.Request.AppendBlockContent).
	// Content[:PromptBlocks] are the prompt's full blocks. Valid only
	// during Route.
	Content      []uint64
	PromptBlocks int
	// Now is the time of the decision.
	Now time.Duration
}

// Fleet is what routers may see of the engines, each by index 0..Engines()-1.
type Fleet interface {
	// Engines is the number of engines.
	Engines() int
	// Load is engine i's current load.
	Load(i int) engine.Load
	// CachedTokens is how many prompt tokens of req engine i would hit if
	// it scheduled req now: its exact cache at this instant, including
	// blocks of steps still running whose events are not yet published.
	// Only the perfect-knowledge router (TTFTGreedy) may call it.
	CachedTokens(i int, req *Request) int
}

// KV is kvindex as the precise routers ask it: in process (the
// scoring.Scorer the gRPC server also answers with) or over gRPC
// (api.Client). Workers are named by pod, as a router knows them.
type KV interface {
	// Score calls visit with the matched prompt tokens of every worker in
	// kvindex's answer for q.
	Score(ctx context.Context, q *Query, visit func(pod string, matchedTokens int)) error
	// Route asks kvindex to choose a worker for request id and to record
	// the choice; it returns the chosen pod, or an error wrapping
	// ErrRouteUnimplemented when kvindex does not offer Route.
	Route(ctx context.Context, id string, q *Query) (string, error)
	// Release ends request id's in-flight accounting.
	Release(ctx context.Context, id string) error
}

// Query is one prompt as a precise router sends it to kvindex.
type Query struct {
	// Model is the model name.
	Model string
	// Tokens are the prompt's token ids (valid during the call).
	Tokens []uint32
	// Loads are the engines' loads as the router scrapes them (Route only).
	Loads []PodLoad
	// Policy overrides kvindex's default ranking policy (Route only); nil
	// keeps it.
	Policy *scoring.Override
}

// PodLoad is one engine's load as a router sees it.
type PodLoad struct {
	Pod              string
	Running, Waiting uint32
	KVUsage          float64
}

// ErrRouteUnimplemented is wrapped by KV.Route when kvindex answers that
// it has no Route.
var ErrRouteUnimplemented = errors.New("router: kvindex does not implement Route")

// Router picks an engine for each request.
type Router interface {
	// Name is the router's name (one of Names).
	Name() string
	// Route picks the engine for req.
	Route(ctx context.Context, req *Request) (int, error)
	// PrefillDone tells the router that req's prefill finished on engine i
	// (the moment a router releases its in-flight accounting).
	PrefillDone(ctx context.Context, req *workload.Request, i int) error
	// Note says anything the report must mention (a fallback taken), or "".
	Note() string
}

// Config sets up routers.
type Config struct {
	// Fleet is the engines' view; required.
	Fleet Fleet
	// BlockSize is the engines' block size; required.
	BlockSize int
	// Names are the engines' pod names in kvindex (engine i is
	// WorkerRef{Pod: Names[i]}); required for the precise routers.
	Names []string
	// Model is the model name the precise routers ask kvindex about.
	Model string
	// KV is kvindex for the precise routers.
	KV KV
	// AffinityTokens is how much of the prompt prefix-hash hashes
	// (default 1,024 tokens).
	AffinityTokens int
	// Approx tunes the approximate router.
	Approx ApproxConfig
	// PreciseLoadMode is how precise+load ranks: ModeRoute (default) asks
	// kvindex's Route; ModeClient computes the cost client-side from Score
	// (the fallback used when Route is unimplemented), for comparison.
	PreciseLoadMode string
	// LoadWeight scales in-flight prefill tokens against a request's own
	// uncached tokens in precise+load's client-side cost (default 1).
	LoadWeight float64
	// RoutePolicy, when not nil, is sent with every Route request:
	// kvindex's policy name, guard and weights; nil keeps the server's
	// default.
	RoutePolicy *scoring.Override
	// Seed seeds the random tie-breaks.
	Seed uint64
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
	case Precise, PreciseLoad:
		if cfg.KV == nil || len(cfg.Names) != n || cfg.Model == "" {
			return nil, fmt.Errorf("router %s: kvindex, the model and one pod name per engine are required", name)
		}
		if m := cfg.PreciseLoadMode; m != "" && m != ModeRoute && m != ModeClient {
			return nil, fmt.Errorf("router %s: mode %q (want %s or %s)", name, m, ModeRoute, ModeClient)
		}
		return newPrecise(name, cfg), nil
	case TTFTGreedy:
		return &ttftGreedy{f: cfg.Fleet, bs: cfg.BlockSize}, nil
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(Names, ", "))
}

// Parse splits a comma-separated list of router names ("all" for every
// router) and checks each; a former name ("oracle") is read as the
// router's current one.
func Parse(list string) ([]string, error) {
	if list == "" || list == "all" {
		return slices.Clone(Names), nil
	}
	var out []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if a, ok := aliases[n]; ok {
			n = a
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

// NeedsIndex reports whether the router asks kvindex.
func NeedsIndex(name string) bool { return name == Precise || name == PreciseLoad }

// base implements the optional parts of Router.
type base struct{}

// PrefillDone implements Router; most routers keep no in-flight state.
func (base) PrefillDone(context.Context, *workload.Request, int) error { return nil }

// Note implements Router.
func (base) Note() string { return "" }

// roundRobin sends requests to engines in turn.
type roundRobin struct {
	base
	n, next int
}

// Name implements Router.
func (r *roundRobin) Name() string { return RoundRobin }

// Route picks the next engine in turn.
func (r *roundRobin) Route(context.Context, *Request) (int, error) {
	i := r.next
	r.next = (r.next + 1) % r.n
	return i, nil
}

// leastLoaded picks the engine with the fewest running + waiting requests.
type leastLoaded struct {
	base
	f    Fleet
	next int
}

// Name implements Router.
func (r *leastLoaded) Name() string { return LeastLoaded }

// Route picks the engine with the fewest running + waiting requests.
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
// hash ring of engines.
type prefixHash struct {
	base
	blocks int
	ring   []ringPoint
}

type ringPoint struct {
	pos    uint64
	engine int
}

// vnodes is the number of ring points per engine.
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

// Name implements Router.
func (r *prefixHash) Name() string { return PrefixHash }

// Route hashes the prompt's first blocks onto the ring.
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

// ttftGreedy knows every engine's cache and queue.
type ttftGreedy struct {
	base
	f    Fleet
	bs   int
	next int
}

// Name implements Router.
func (r *ttftGreedy) Name() string { return TTFTGreedy }

// Route picks the least estimated time to first token with perfect,
// instantaneous knowledge: the engine's exact queued prefill tokens (no
// engine exports them) plus this request's uncached tokens there (its exact
// cache now, with no event delay), in tokens since every engine prefills
// at the same rate; ties by the longer hit, then fewer requests, then in
// turn.
//
// It is the reference for what greedy routing could reach with perfect
// knowledge, not a bound: a router that ignores load can hit more
// (precise), and greedy is not optimal (it ignores what a request's
// prefill costs the requests that queue behind it). The bounds are
// computed offline (sim.ComputeBounds). A hit-maximising greedy router is
// worse than useless here: the
// engine caches a prompt's blocks when it schedules them, so on Mooncake
// (every request starts with the same 512 tokens) the first engine to run
// anything holds the only copy of that block and takes the whole trace.
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

// newRand returns the routers' seeded random source.
func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}
