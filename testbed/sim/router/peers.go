package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// The peers: the routers a platform team would deploy instead of kvindex,
// each with its published defaults and only the signals it has (see each
// router's file for the repository, path and version its behaviour was read
// from). Where a peer learns the engines' caches from KV events it asks
// kvindex's exact index, so that what is compared is the policy, not the
// index.
const (
	LLMD        = "llm-d"
	LLMDPrecise = "llm-d-precise"
	Dynamo      = "dynamo"
	SGLang      = "sglang"
	AIBrix      = "aibrix"
)

// Peers lists the peers, in report order.
var Peers = []string{LLMD, LLMDPrecise, Dynamo, SGLang, AIBrix}

// IsPeer reports whether name is one of Peers.
func IsPeer(name string) bool { return slices.Contains(Peers, name) }

// Finisher is a router that keeps its own count of requests in flight, as a
// gateway proxying the response does: Finished tells it that req's last
// token left engine i (or that the engine rejected req).
type Finisher interface {
	Finished(req *workload.Request, i int)
}

// Poller is a router that reads vLLM's metrics as its scraper last saw
// them: the simulation calls Poll every PollInterval of simulated time
// while requests remain to arrive, and the router sees the engines' loads
// as of its last Poll.
type Poller interface {
	PollInterval() time.Duration
	Poll()
}

// scrape is the engines' loads as the last poll read them.
type scrape struct {
	f     Fleet
	loads []engine.Load
}

func newScrape(f Fleet) scrape { return scrape{f: f, loads: make([]engine.Load, f.Engines())} }

// Poll implements Poller: every engine's running and waiting requests and
// KV usage, as vLLM's /metrics reports them now.
func (s *scrape) Poll() {
	for i := range s.loads {
		s.loads[i] = s.f.Load(i)
	}
}

// ties collects the indices of the best value seen, for a uniform random
// pick among them (a shuffle then a stable sort, or reservoir sampling,
// as the peers break ties).
type ties struct {
	rng *rand.Rand
	set []int
}

func newTies(seed, stream uint64) ties { return ties{rng: rand.New(rand.NewPCG(seed, stream))} }

func (t *ties) reset()      { t.set = t.set[:0] }
func (t *ties) add(i int)   { t.set = append(t.set, i) }
func (t *ties) first(i int) { t.set = append(t.set[:0], i) }

// pick returns one of the collected indices, uniformly.
func (t *ties) pick() int {
	if len(t.set) == 1 {
		return t.set[0]
	}
	return t.set[t.rng.IntN(len(t.set))]
}

// chain appends to dst the chained hash of every prefix of blocks (block
// content ids, workload.Request.AppendBlockContent), seeded by seed: equal
// values mean equal prefixes, as the peers' chained block hashes do.
func chain(dst []uint64, seed uint64, blocks []uint64) []uint64 {
	h := seed
	for _, c := range blocks {
		h = workload.Mix64(h ^ c)
		dst = append(dst, h)
	}
	return dst
}

// inflight is a gateway's own count of the requests it routed to each
// engine and has not seen finish.
type inflight struct {
	n      []int
	routed map[int]int // request id -> engine
}

func newInflight(n int) inflight { return inflight{n: make([]int, n), routed: make(map[int]int)} }

func (f *inflight) add(id, i int) {
	f.n[i]++
	f.routed[id] = i
}

func (f *inflight) done(id int) {
	if i, ok := f.routed[id]; ok {
		f.n[i]--
		delete(f.routed, id)
	}
}

// preciseKV asks kvindex's Score for every engine's cached prefix, as a
// peer that reads KV events would know it.
type preciseKV struct {
	name   string
	kv     KV
	model  string
	byPod  map[string]int
	q      Query
	tokens []int
	visit  func(pod string, tokens int)
	bad    string
}

func newPreciseKV(name string, cfg Config) preciseKV {
	p := preciseKV{name: name, kv: cfg.KV, model: cfg.Model, byPod: make(map[string]int, len(cfg.Names)), tokens: make([]int, len(cfg.Names))}
	for i, pod := range cfg.Names {
		p.byPod[pod] = i
	}
	return p
}

// score returns each engine's matched prompt tokens (valid until the next
// call).
func (p *preciseKV) score(ctx context.Context, req *Request) ([]int, error) {
	if p.visit == nil {
		p.visit = func(pod string, tokens int) {
			i, ok := p.byPod[pod]
			if !ok {
				p.bad = pod
				return
			}
			p.tokens[i] = tokens
		}
	}
	p.q = Query{Model: p.model, Tokens: req.AppendTokens(p.q.Tokens[:0], 0, req.PromptLen)}
	clear(p.tokens)
	p.bad = ""
	if err := p.kv.Score(ctx, &p.q, p.visit); err != nil {
		return nil, fmt.Errorf("router %s: request %d: %w", p.name, req.ID, err)
	}
	if p.bad != "" {
		return nil, fmt.Errorf("router %s: kvindex scored unknown worker %q", p.name, p.bad)
	}
	return p.tokens, nil
}
