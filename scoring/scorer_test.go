package scoring

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

const testBS = 16

// testFleet is an index with one model and n workers "w0".."w<n-1>".
type testFleet struct {
	ix    *indexer.Index
	model *indexer.Model
	ws    []*indexer.Worker
	next  uint64 // engine hashes
}

func newTestFleet(t testing.TB, n int) *testFleet {
	t.Helper()
	ix := indexer.New(indexer.Config{})
	m, err := ix.AddModel("m", testBS)
	if err != nil {
		t.Fatal(err)
	}
	f := &testFleet{ix: ix, model: m, next: 1}
	for i := range n {
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "w" + string(rune('0'+i%10)) + string(rune('a'+i/10))}, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		f.ws = append(f.ws, w)
	}
	return f
}

// store makes w hold tokens' full blocks, as one BlockStored chain.
func (f *testFleet) store(t testing.TB, w *indexer.Worker, tokens []uint32) {
	t.Helper()
	n := len(tokens) / testBS
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = f.next
		f.next++
	}
	b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hs, TokenIDs: tokens[:n*testBS], BlockSize: testBS}}}
	if err := w.ApplyBatch(b); err != nil {
		t.Fatal(err)
	}
}

func tokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = r.Uint32N(150_000)
	}
	return t
}

func TestScorerRanksAndNamesWorkers(t *testing.T) {
	f := newTestFleet(t, 3)
	r := rand.New(rand.NewPCG(1, 1))
	prompt := tokens(r, 8*testBS)
	f.store(t, f.ws[0], prompt[:4*testBS])
	f.store(t, f.ws[1], prompt)
	s := New(f.ix, Options{})
	var res Result
	if err := s.Score(&Request{Model: f.model, Tokens: prompt}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) != 2 {
		t.Fatalf("ranked %d workers, want the 2 that hold the prompt", len(res.Ranked))
	}
	if got := res.Ranked[0]; got.Ref != f.ws[1].Info().Ref || got.Match.Blocks != 8 {
		t.Fatalf("best = %s with %d blocks, want %s with 8", got.Ref, got.Match.Blocks, f.ws[1].Info().Ref)
	}
	if got := res.Ranked[1]; got.Ref != f.ws[0].Info().Ref || got.Match.Blocks != 4 {
		t.Fatalf("second = %s with %d blocks, want %s with 4", got.Ref, got.Match.Blocks, f.ws[0].Info().Ref)
	}
	if res.Prompt.Blocks != 8 || len(res.Keys) != 8 {
		t.Fatalf("prompt %+v with %d keys, want 8 blocks", res.Prompt, len(res.Keys))
	}
	// All lists the cold worker too; keys give the same answer as tokens.
	keys := f.model.PromptKeys(prompt, nil, nil)
	if err := s.Score(&Request{Model: f.model, Keys: keys, All: true}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) != 3 || res.Ranked[0].Match.Blocks != 8 || res.Ranked[2].Ref != f.ws[2].Info().Ref || res.Ranked[2].Match.Blocks != 0 {
		t.Fatalf("with All: %+v", res.Ranked)
	}
}

func TestScorerRequestErrors(t *testing.T) {
	f := newTestFleet(t, 2)
	other, _ := f.ix.AddModel("other", testBS)
	if _, err := f.ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "x"}, Model: "other"}); err != nil {
		t.Fatal(err)
	}
	s := New(f.ix, Options{})
	toks := make([]uint32, 32)
	for _, tc := range []struct {
		req   Request
		field string
	}{
		{Request{Tokens: toks}, "model"},
		{Request{Model: f.model}, "token_ids"},
		{Request{Model: f.model, Tokens: toks, Keys: []indexer.Key{1}}, "token_ids"},
		{Request{Model: f.model, Tokens: toks, Candidates: []events.WorkerRef{{Pod: "nope"}}}, "workers[0]"},
		{Request{Model: f.model, Tokens: toks, Candidates: []events.WorkerRef{f.ws[0].Info().Ref, {Pod: "x"}}}, "workers[1]"},
		{Request{Model: f.model, Tokens: toks, Candidates: []events.WorkerRef{{}}}, "workers[0].pod"},
		{Request{Model: f.model, Tokens: toks, Loads: []RequestLoad{{Worker: events.WorkerRef{Pod: "x"}}}}, "loads[0].worker"},
		{Request{Model: f.model, Tokens: toks, Loads: []RequestLoad{{Worker: f.ws[1].Info().Ref, KVUsage: 1.5}}}, "loads[0].kv_cache_usage"},
	} {
		var res Result
		err := s.Score(&tc.req, &res)
		var re *RequestError
		if !errors.As(err, &re) || re.Field != tc.field {
			t.Errorf("%+v: error %v, want a RequestError on %s", tc.req, err, tc.field)
		}
	}
	var res Result
	if err := s.Score(&Request{Model: other, Tokens: toks}, &res); err != nil {
		t.Fatalf("other model: %v", err)
	}
}

// Route records the choice: the next Score sees the prompt as cached on
// the chosen worker (speculatively) and its uncached prefill as load; a
// removed worker's routes do not follow its id to the next worker.
func TestScorerRouteAndRemovedWorker(t *testing.T) {
	f := newTestFleet(t, 2)
	r := rand.New(rand.NewPCG(2, 2))
	prompt := tokens(r, 8*testBS)
	s := New(f.ix, Options{})
	var res Result
	pick := f.ws[1].Info().Ref
	i, err := s.Route("r1", "", &Request{Model: f.model, Tokens: prompt}, &pick, &res)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ranked[i].Ref != pick {
		t.Fatalf("chose %s, want the pick %s", res.Ranked[i].Ref, pick)
	}
	if _, err := s.Route("r1", "", &Request{Model: f.model, Tokens: prompt}, nil, &res); !errors.Is(err, ErrDuplicateRequest) {
		t.Fatalf("second route with the same id: %v, want ErrDuplicateRequest", err)
	}
	if err := s.Score(&Request{Model: f.model, Tokens: prompt}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) != 1 || res.Ranked[0].Ref != pick || res.Ranked[0].Speculative != 8 || res.Ranked[0].Load.InflightRequests != 1 || res.Ranked[0].Load.InflightPrefillTokens != 8*testBS {
		t.Fatalf("after route: %+v", res.Ranked)
	}
	// Remove the chosen worker and add another in its id.
	if err := f.ix.RemoveWorker(pick); err != nil {
		t.Fatal(err)
	}
	w2, err := f.ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "new"}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if w2.ID() != f.ws[1].ID() {
		t.Fatalf("new worker got id %d, want the freed id %d", w2.ID(), f.ws[1].ID())
	}
	if err := s.Score(&Request{Model: f.model, Tokens: prompt, All: true}, &res); err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Ranked {
		if c.Ref == pick {
			t.Fatalf("removed worker still ranked: %+v", c)
		}
		if c.Match.Blocks != 0 || c.Load.InflightRequests != 0 {
			t.Fatalf("worker %s inherits the removed worker's route: %+v", c.Ref, c)
		}
	}
	if ok, err := s.Release("r1", ""); !ok || err != nil {
		t.Fatalf("release of the removed worker's request: %v, %v", ok, err)
	}
	// No worker at all: Route says so.
	for _, w := range f.ix.Workers() {
		if err := f.ix.RemoveWorker(w.Info().Ref); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Route("r2", "", &Request{Model: f.model, Tokens: prompt}, nil, &res); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("route with no workers: %v, want ErrNoWorker", err)
	}
}

// A Result reused across calls allocates nothing once grown.
func TestScorerReuseAllocatesNothing(t *testing.T) {
	f := newTestFleet(t, 8)
	r := rand.New(rand.NewPCG(3, 3))
	prompt := tokens(r, 128*testBS)
	for _, w := range f.ws {
		f.store(t, w, prompt)
	}
	loads := NewLoadBoard(time.Hour)
	for _, w := range f.ws {
		loads.Set(w.Info().Ref, Scraped{Running: 2, Waiting: 1, At: time.Now()})
	}
	s := New(f.ix, Options{Loads: loads})
	var res Result
	req := &Request{Model: f.model, Tokens: prompt}
	if err := s.Score(req, &res); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := s.Score(req, &res); err != nil {
			t.Fatal(err)
		}
	}); n != 0 && !raceEnabled {
		t.Fatalf("Score allocates %.1f times per call, want 0", n)
	}
	if res.Ranked[0].Load.Source != "scrape" || res.Ranked[0].Load.Running != 2 {
		t.Fatalf("scraped load not used: %+v", res.Ranked[0].Load)
	}
}
