package router

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// fakeFleet is a scripted fleet.
type fakeFleet struct {
	loads  []engine.Load
	cached []int // tokens each engine would hit
}

func (f *fakeFleet) Engines() int                       { return len(f.loads) }
func (f *fakeFleet) Load(i int) engine.Load             { return f.loads[i] }
func (f *fakeFleet) CachedTokens(i int, _ *Request) int { return f.cached[i] }

// request builds a routed request with a prompt of one segment per id,
// each 64 tokens, at block size 16.
func request(id int, segIDs ...uint64) *Request {
	r := &workload.Request{ID: id, OutputLen: 1}
	for _, s := range segIDs {
		r.Prompt = append(r.Prompt, workload.Segment{ID: s, Len: 64})
		r.PromptLen += 64
	}
	return &Request{Request: r, Content: r.AppendBlockContent(nil, 16, workload.Segment{}), PromptBlocks: r.PromptLen / 16}
}

func mustNew(t *testing.T, name string, cfg Config) Router {
	t.Helper()
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	r, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func routeAll(t *testing.T, r Router, reqs ...*Request) []int {
	t.Helper()
	var out []int
	for _, q := range reqs {
		i, err := r.Route(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, i)
	}
	return out
}

func eq(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRoundRobin(t *testing.T) {
	r := mustNew(t, RoundRobin, Config{Fleet: &fakeFleet{loads: make([]engine.Load, 3)}})
	q := request(0, 1)
	if got := routeAll(t, r, q, q, q, q); !eq(got, []int{0, 1, 2, 0}) {
		t.Fatalf("got %v", got)
	}
}

func TestLeastLoaded(t *testing.T) {
	f := &fakeFleet{loads: []engine.Load{{Running: 2}, {Running: 1, Waiting: 1}, {Running: 1}, {Running: 1, KVUsage: 0.1}}}
	r := mustNew(t, LeastLoaded, Config{Fleet: f})
	q := request(0, 1)
	// Engines 2 and 3 have 1 request; 2 has the lower KV usage.
	if got := routeAll(t, r, q); !eq(got, []int{2}) {
		t.Fatalf("got %v", got)
	}
	// All equal: ties rotate from after the last pick.
	f.loads = make([]engine.Load, 4)
	if got := routeAll(t, r, q, q, q); !eq(got, []int{3, 0, 1}) {
		t.Fatalf("ties: got %v", got)
	}
}

func TestPrefixHash(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 8)}
	r := mustNew(t, PrefixHash, Config{Fleet: f, AffinityTokens: 64})
	// Same first 64 tokens: same engine, whatever follows.
	a, b := routeAll(t, r, request(0, 7, 1)), routeAll(t, r, request(1, 7, 2))
	if a[0] != b[0] {
		t.Fatalf("same first block on engines %d and %d", a[0], b[0])
	}
	// Many first blocks spread over the ring.
	used := map[int]int{}
	for s := range 400 {
		used[routeAll(t, r, request(s, uint64(1000+s)))[0]]++
	}
	for e := range 8 {
		if used[e] < 20 {
			t.Fatalf("engine %d got %d of 400 prefixes: %v", e, used[e], used)
		}
	}
}

func TestApproximate(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 4)}
	r := mustNew(t, Approximate, Config{Fleet: f, Seed: 1, LRUBlocks: 100})
	first := routeAll(t, r, request(0, 1, 2))[0]
	// The same prefix scores 2 (prefix) + 2 + 2 on the engine it went to,
	// 0 + 2 + 2 elsewhere.
	if got := routeAll(t, r, request(1, 1, 3))[0]; got != first {
		t.Fatalf("shared prefix went to %d, not %d", got, first)
	}
	// A long queue there outweighs half a prompt of prefix: prefix 0.5*2 +
	// queue 0 + kv 2 = 3 against 0 + 2 + 2 = 4 on an idle engine.
	f.loads[first].Waiting = 10
	if got := routeAll(t, r, request(2, 1, 4))[0]; got == first {
		t.Fatalf("went to the engine with 10 waiting")
	}
	// The LRU forgets: 100 blocks hold 25 prompts of 8 blocks... route
	// enough new prefixes to the same engine to evict prefix 1.
	f.loads = make([]engine.Load, 1)
	r = mustNew(t, Approximate, Config{Fleet: f, LRUBlocks: 8})
	ap := r.(*approximate)
	routeAll(t, r, request(0, 1, 2))
	if !ap.lrus[0].Contains(ap.hashes[0]) {
		t.Fatal("routed prefix not remembered")
	}
	h := ap.hashes[0]
	routeAll(t, r, request(1, 5, 6))
	if ap.lrus[0].Contains(h) || ap.lrus[0].Len() != 8 {
		t.Fatalf("LRU of 8 kept an old block (size %d)", ap.lrus[0].Len())
	}
}

func TestTTFTGreedy(t *testing.T) {
	f := &fakeFleet{
		loads:  []engine.Load{{QueuedPrefill: 0}, {QueuedPrefill: 5000}, {QueuedPrefill: 100}},
		cached: []int{0, 128, 64},
	}
	r := mustNew(t, TTFTGreedy, Config{Fleet: f})
	// Prompt 128: costs 0+128, 5000+0, 100+64: engine 0.
	if got := routeAll(t, r, request(0, 1, 2)); !eq(got, []int{0}) {
		t.Fatalf("got %v", got)
	}
	// A full hit on an idle engine beats everything.
	f.loads[1].QueuedPrefill = 0
	if got := routeAll(t, r, request(1, 1, 2)); !eq(got, []int{1}) {
		t.Fatalf("full hit on an idle engine: got %v", got)
	}
	// Equal costs (engine 0: 0 queued + 128 uncached; engine 2: 128 + 0):
	// the longer hit.
	f.loads, f.cached = []engine.Load{{}, {QueuedPrefill: 999}, {QueuedPrefill: 128}}, []int{0, 0, 128}
	if got := routeAll(t, r, request(2, 1, 2)); !eq(got, []int{2}) {
		t.Fatalf("tie: got %v", got)
	}
}

// fakeKV is a scripted kvindex.
type fakeKV struct {
	matched   map[string]uint32 // pod -> matched tokens
	route     string            // Route's choice; "" answers unimplemented
	routeReqs []routeReq
	released  []string
}

// routeReq is one Route call as fakeKV saw it (copied: the router reuses
// its query).
type routeReq struct {
	id     string
	model  string
	tokens int
	loads  []PodLoad
	policy *scoring.Override
}

func (k *fakeKV) Score(_ context.Context, q *Query, visit func(string, int)) error {
	if len(q.Tokens) == 0 {
		return errors.New("token_ids: required")
	}
	for pod, m := range k.matched {
		visit(pod, int(m))
	}
	return nil
}

func (k *fakeKV) Route(_ context.Context, id string, q *Query) (string, error) {
	if k.route == "" {
		return "", errors.New("no route configured")
	}
	k.routeReqs = append(k.routeReqs, routeReq{id: id, model: q.Model, tokens: len(q.Tokens), loads: slices.Clone(q.Loads), policy: q.Policy})
	return k.route, nil
}

func (k *fakeKV) Release(_ context.Context, id string) error {
	k.released = append(k.released, id)
	return nil
}

func preciseCfg(f *fakeFleet, kv *fakeKV) Config {
	names := []string{"p0", "p1", "p2"}
	return Config{Fleet: f, KV: kv, Names: names[:len(f.loads)], Model: "m"}
}

func TestPreciseLongestThenLeastLoaded(t *testing.T) {
	f := &fakeFleet{loads: []engine.Load{{Running: 5}, {Running: 3}, {Running: 1}}}
	kv := &fakeKV{matched: map[string]uint32{"p0": 64, "p1": 64, "p2": 16}}
	r := mustNew(t, Precise, preciseCfg(f, kv))
	// p0 and p1 tie at 64 tokens; p1 is less loaded.
	if got := routeAll(t, r, request(0, 1, 2)); !eq(got, []int{1}) {
		t.Fatalf("got %v", got)
	}
	// Nothing matched anywhere: least loaded overall.
	kv.matched = nil
	if got := routeAll(t, r, request(1, 3)); !eq(got, []int{2}) {
		t.Fatalf("no match: got %v", got)
	}
	kv.matched = map[string]uint32{"nope": 16}
	if _, err := r.Route(context.Background(), request(2, 1)); err == nil || !strings.Contains(err.Error(), "unknown worker") {
		t.Fatalf("unknown pod: %v", err)
	}
}

func TestPreciseLoadUsesRouteAndRelease(t *testing.T) {
	f := &fakeFleet{loads: []engine.Load{{Running: 4, Waiting: 2, KVUsage: 0.5}, {}, {}}}
	kv := &fakeKV{route: "p2"}
	r := mustNew(t, PreciseLoad, preciseCfg(f, kv))
	q := request(7, 1, 2)
	if got := routeAll(t, r, q); !eq(got, []int{2}) {
		t.Fatalf("got %v", got)
	}
	rr := kv.routeReqs[0]
	if rr.id != "req-7" || rr.tokens != 128 || rr.model != "m" {
		t.Fatalf("Route request %+v", rr)
	}
	l := rr.loads[0]
	if l.Pod != "p0" || l.Running != 4 || l.Waiting != 2 || l.KVUsage != 0.5 {
		t.Fatalf("loads %+v", rr.loads)
	}
	if err := r.PrefillDone(context.Background(), q.Request, 2); err != nil || len(kv.released) != 1 || kv.released[0] != "req-7" {
		t.Fatalf("release: %v %v", err, kv.released)
	}
	if r.Note() != "" {
		t.Fatalf("note %q", r.Note())
	}
	// A policy given in the config travels with every Route.
	cfg := preciseCfg(f, kv)
	cfg.RoutePolicy = &scoring.Override{Guard: "static"}
	r = mustNew(t, PreciseLoad, cfg)
	routeAll(t, r, request(8, 1))
	if pol := kv.routeReqs[len(kv.routeReqs)-1].policy; pol == nil || pol.Guard != "static" {
		g := ""
		if pol != nil {
			g = pol.Guard
		}
		t.Fatalf("policy guard %q", g)
	}
}

func TestPreciseLoadClientMode(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 3)}
	kv := &fakeKV{matched: map[string]uint32{"p0": 128}}
	cfg := preciseCfg(f, kv)
	cfg.PreciseLoadMode = ModeClient
	r := mustNew(t, PreciseLoad, cfg)
	a := request(1, 1, 2) // 128 tokens, all cached on p0
	if got := routeAll(t, r, a); !eq(got, []int{0}) {
		t.Fatalf("got %v", got)
	}
	if !strings.Contains(r.Note(), "client-side") {
		t.Fatalf("note %q", r.Note())
	}
	// p0 now has 0 in-flight tokens from a (fully cached: 0 uncached).
	// b is uncached everywhere (costs 128 + in-flight): p1 (ties rotate).
	b := request(2, 5, 6)
	kv.matched = nil
	if got := routeAll(t, r, b); !eq(got, []int{1}) {
		t.Fatalf("b: got %v", got)
	}
	// c: 64 tokens cached on p1, whose 128 in-flight tokens cost more than
	// recomputing elsewhere: 64 + 128 > 128.
	kv.matched = map[string]uint32{"p1": 64}
	if got := routeAll(t, r, request(3, 5, 7)); !eq(got, []int{2}) {
		t.Fatalf("c: got %v", got)
	}
	// Releasing b's prefill frees p1.
	if err := r.PrefillDone(context.Background(), b.Request, 1); err != nil {
		t.Fatal(err)
	}
	if got := routeAll(t, r, request(4, 5, 8)); !eq(got, []int{1}) {
		t.Fatalf("after release: got %v", got)
	}
	if len(kv.released) != 0 {
		t.Fatal("client mode called Release")
	}
}

func TestParseAndNew(t *testing.T) {
	all, err := Parse("all")
	if err != nil || len(all) != 12 {
		t.Fatalf("all: %v %v", all, err)
	}
	got, err := Parse("precise, round-robin,precise")
	if err != nil || len(got) != 2 || got[0] != Precise {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := Parse("oracle,precise"); err != nil || !slices.Equal(got, []string{TTFTGreedy, Precise}) {
		t.Fatalf("the former name oracle: %v %v", got, err)
	}
	if _, err := Parse("magic"); err == nil {
		t.Fatal("unknown name accepted")
	}
	f := &fakeFleet{loads: make([]engine.Load, 2)}
	if _, err := New(Precise, Config{Fleet: f, BlockSize: 16}); err == nil {
		t.Fatal("precise without kvindex accepted")
	}
	if _, err := New(PreciseLoad, Config{Fleet: f, BlockSize: 16, KV: &fakeKV{}, Names: []string{"a", "b"}, Model: "m", PreciseLoadMode: "x"}); err == nil {
		t.Fatal("bad mode accepted")
	}
}
