package api_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/scoring"
)

// newRouteFixture serves n idle workers of model "m" holding nothing.
func newRouteFixture(t *testing.T, n int) (*fixture, []*indexer.Worker) {
	t.Helper()
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	var ws []*indexer.Worker
	for i := 0; i < n; i++ {
		ws = append(ws, mustWorker(t, ix, "m", fmt.Sprintf("pod-%d", i), 0))
	}
	return serve(t, ix, nil, api.Options{}), ws
}

func route(t *testing.T, f *fixture, id string, req *kvindexv1.ScoreRequest, pick *kvindexv1.WorkerRef) *kvindexv1.RouteResponse {
	t.Helper()
	if req.Model == "" {
		req.Model = "m"
	}
	resp, err := f.client.Route(context.Background(), &kvindexv1.RouteRequest{Score: req, RequestId: id, Pick: pick})
	if err != nil {
		t.Fatalf("Route %s: %v", id, err)
	}
	return resp
}

// TestRouteKeepsABurstTogether: 50 concurrent requests share a new
// 2,000-token prefix that no event has announced yet. Route's speculative
// blocks and in-flight load keep them together: a worker is given the
// prefix only when waiting for the ones that hold it would take longer
// than computing it (how many do depends on the burst's arrival rate, on
// the wall clock), so the prefix is computed at most once per worker, and
// every worker that computes it serves a share of the burst.
func TestRouteKeepsABurstTogether(t *testing.T) {
	f, _ := newRouteFixture(t, 4)
	shared := prompt(7, 125) // 2,000 tokens
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks := append(append([]uint32(nil), shared...), prompt(uint32(1000+i), 2)...) // a 32-token question
			resp, err := f.client.Route(context.Background(), &kvindexv1.RouteRequest{
				Score:     &kvindexv1.ScoreRequest{Model: "m", TokenIds: toks},
				RequestId: fmt.Sprintf("req-%d", i),
			})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			counts[resp.GetChosen().GetPod()]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("burst of 50: %v", counts)
	// The burst's rate is the wall clock's: on a loaded machine its tail
	// arrives slowly enough that one more worker computing the prefix
	// beats waiting, so one small share (the tail) is allowed; two are a
	// scattered burst.
	small := 0
	for _, n := range counts {
		if n < 10 {
			small++
		}
	}
	if small > 1 {
		t.Errorf("burst scattered over %d workers, %d of them with fewer than 10 requests: %v", len(counts), small, counts)
	}
	// Every request is still in flight: what they will prefill is the
	// prefix once per worker used and each question (Routes of a model
	// rank and record one at a time, so each sees the speculative prefix
	// of the ones before it). Without speculative blocks all 50 would
	// count it: 101,600 tokens.
	resp := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: shared, Policy: &kvindexv1.ScorePolicy{}})
	var inflight uint64
	for _, w := range resp.GetWorkers() {
		inflight += w.GetLoad().GetInflightPrefillTokens()
	}
	if want := uint64(len(counts)*2000 + 50*32); inflight != want {
		t.Errorf("the burst will prefill %d tokens on %d workers, want %d (the prefix once a worker, and 50 questions)", inflight, len(counts), want)
	}
}

// TestRouteRecordsAndReleases: the chosen worker carries the request's
// uncached tokens as in-flight load until Release, and its blocks as
// speculative until events confirm them.
func TestRouteRecordsAndReleases(t *testing.T) {
	f, ws := newRouteFixture(t, 2)
	p := prompt(3, 8)
	r := route(t, f, "r1", &kvindexv1.ScoreRequest{TokenIds: p}, nil)
	if r.GetChosen().GetPod() != "pod-0" || r.GetRanking().GetPolicy() != "cache_aware" {
		t.Fatalf("chosen %v policy %q", r.GetChosen(), r.GetRanking().GetPolicy())
	}
	resp := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Explain: true})
	if len(resp.GetWorkers()) != 1 {
		t.Fatalf("workers %v", resp.GetWorkers())
	}
	w := resp.GetWorkers()[0]
	if w.GetWorker().GetPod() != "pod-0" || w.GetMatchedBlocks() != 8 || w.GetSpeculativeBlocks() != 8 ||
		w.GetLoad().GetInflightRequests() != 1 || w.GetLoad().GetInflightPrefillTokens() != 128 || w.GetLoad().GetSource() != "none" {
		t.Fatalf("after Route: %v", w)
	}
	if !strings.Contains(w.GetReason(), "8 expected from recent routes") {
		t.Fatalf("reason %q", w.GetReason())
	}
	// The engine confirms 5 blocks: 3 stay speculative.
	apply(t, ws[0], stored(100, p, 0, 5))
	w = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}).GetWorkers()[0]
	if w.GetMatchedBlocks() != 8 || w.GetSpeculativeBlocks() != 3 {
		t.Fatalf("after 5 confirmed: %v", w)
	}
	if ok, err := f.client.Release(context.Background(), "r1"); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if ok, _ := f.client.Release(context.Background(), "r1"); ok {
		t.Fatal("second release reported released")
	}
	w = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}).GetWorkers()[0]
	if w.GetLoad().GetInflightRequests() != 0 || w.GetLoad().GetInflightPrefillTokens() != 0 {
		t.Fatalf("after release: %v", w.GetLoad())
	}
	// Duplicate ids are refused while in flight.
	route(t, f, "r2", &kvindexv1.ScoreRequest{TokenIds: p}, nil)
	_, err := f.client.Route(context.Background(), &kvindexv1.RouteRequest{Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}, RequestId: "r2"})
	if st, _ := api.ServerStatus(err); st.Code() != codes.AlreadyExists {
		t.Fatalf("duplicate id: %v", err)
	}
}

// TestRoutePickAndCandidates: the router's own pick is recorded; the
// candidate filter is respected.
func TestRoutePickAndCandidates(t *testing.T) {
	f, ws := newRouteFixture(t, 3)
	p := prompt(5, 4)
	apply(t, ws[0], stored(1, p, 0, 4))
	r := route(t, f, "a", &kvindexv1.ScoreRequest{TokenIds: p}, ref("pod-2", 0))
	if r.GetChosen().GetPod() != "pod-2" || r.GetRanking().GetWorkers()[0].GetWorker().GetPod() != "pod-0" {
		t.Fatalf("pick: chosen %v, ranking %v", r.GetChosen(), r.GetRanking().GetWorkers())
	}
	for i := 0; i < 20; i++ {
		r := route(t, f, fmt.Sprintf("c%d", i), &kvindexv1.ScoreRequest{TokenIds: p, Workers: []*kvindexv1.WorkerRef{ref("pod-1", 0), ref("pod-2", 0)}}, nil)
		if c := r.GetChosen().GetPod(); c != "pod-1" && c != "pod-2" {
			t.Fatalf("chose %s outside the candidates", c)
		}
		if len(r.GetRanking().GetWorkers()) != 2 {
			t.Fatalf("ranking %v", r.GetRanking().GetWorkers())
		}
	}
	for _, tc := range []struct {
		req  *kvindexv1.RouteRequest
		want string
	}{
		{&kvindexv1.RouteRequest{Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}}, "request_id: required"},
		{&kvindexv1.RouteRequest{RequestId: "x"}, "score: required"},
		{&kvindexv1.RouteRequest{RequestId: "x", Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}, Pick: ref("nope", 0)}, "pick: unknown worker"},
		{&kvindexv1.RouteRequest{RequestId: "x", Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Policy: &kvindexv1.ScorePolicy{Name: "fastest"}}}, "policy.name: unknown policy"},
		{&kvindexv1.RouteRequest{RequestId: "x", Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Policy: &kvindexv1.ScorePolicy{TierWeights: map[string]float64{"cpu": -1}}}},
			"policy.tier_weights.cpu: -1 must be a finite number from 0 to 1e6"},
		{&kvindexv1.RouteRequest{RequestId: "x", Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Policy: &kvindexv1.ScorePolicy{TierWeights: map[string]float64{"hbm": 1}}}},
			`policy.tier_weights: unknown tier "hbm"`},
		{&kvindexv1.RouteRequest{RequestId: "x", Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Loads: []*kvindexv1.WorkerLoad{{Worker: ref("pod-0", 0), KvCacheUsage: 2}}}}, "loads[0].kv_cache_usage"},
	} {
		_, err := f.client.Route(context.Background(), tc.req)
		st, _ := api.ServerStatus(err)
		if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tc.want) {
			t.Errorf("%v: %v %q, want InvalidArgument %q", tc.req, st.Code(), st.Message(), tc.want)
		}
	}
}

// TestScoreWithLoadsAndPolicy: request-side loads steer cache_aware; a
// policy ranks every worker of the model, idle cold ones included;
// longest_prefix ignores load except for ties.
func TestScoreWithLoadsAndPolicy(t *testing.T) {
	f, ws := newRouteFixture(t, 3)
	p := prompt(9, 64) // 1,024 tokens
	apply(t, ws[0], stored(1, p, 0, 64))
	apply(t, ws[1], stored(2, p, 0, 60))
	loads := []*kvindexv1.WorkerLoad{{Worker: ref("pod-0", 0), Waiting: 4, Running: 2, QueuedPrefillTokens: 6000}}
	resp := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Loads: loads, Policy: &kvindexv1.ScorePolicy{}})
	got := []string{}
	for _, w := range resp.GetWorkers() {
		got = append(got, w.GetWorker().GetPod())
	}
	// Estimated TTFT (DefaultCostModel: 17,500 tokens/s, 9.4e8 attention
	// pairs/s, 6 ms a step): pod-0 waits for 6,000 queued tokens (over
	// 350 ms); pod-1 prefills its 64 uncached tokens after 960 cached in
	// one step (6 ms + 3.66 ms + 63,488 pairs: 9.72 ms); pod-2 all 1,024
	// (65 ms).
	if strings.Join(got, ",") != "pod-1,pod-2,pod-0" {
		t.Fatalf("cache_aware with load: %v", got)
	}
	if l := resp.GetWorkers()[2].GetLoad(); l.GetSource() != "request" || l.GetWaiting() != 4 || l.GetQueuedPrefillTokens() != 6000 {
		t.Fatalf("load detail %v", l)
	}
	if s, want := resp.GetWorkers()[0].GetScore(), -(0.006 + 64.0/17500 + (64*960+64*64/2)/9.4e8); math.Abs(s-want) > 1e-9 {
		t.Fatalf("pod-1 score %v, want %v (seconds)", s, want)
	}
	resp = score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Loads: loads, Policy: &kvindexv1.ScorePolicy{Name: "longest_prefix"}})
	if resp.GetWorkers()[0].GetWorker().GetPod() != "pod-0" || resp.GetPolicy() != "longest_prefix" || len(resp.GetWorkers()) != 3 {
		t.Fatalf("longest_prefix: %v", resp.GetWorkers())
	}
	// Without a policy, Score lists only matching workers, as it always did.
	if resp := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}); len(resp.GetWorkers()) != 2 {
		t.Fatalf("no policy: %v", resp.GetWorkers())
	}
}

// Only the client that routed a request may release it; request ids are
// bounded; a full in-flight table refuses with ResourceExhausted.
func TestReleaseOwnershipAndBounds(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustWorker(t, ix, "m", "pod-0", 0)
	srv := api.NewServer(ix, nil, api.Options{Tracker: scoring.NewTracker(scoring.TrackerOptions{MaxFlights: 1})})
	alice := api.WithIdentity(context.Background(), "alice")
	bob := api.WithIdentity(context.Background(), "bob")
	req := &kvindexv1.RouteRequest{RequestId: "r1", Score: &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 2)}}
	if _, err := srv.Route(alice, req); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Route(alice, &kvindexv1.RouteRequest{RequestId: "r2", Score: req.Score}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("route past max in flight: %v, want ResourceExhausted", err)
	}
	if _, err := srv.Release(bob, &kvindexv1.ReleaseRequest{RequestId: "r1"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("release by another client: %v, want PermissionDenied", err)
	}
	if resp, err := srv.Release(alice, &kvindexv1.ReleaseRequest{RequestId: "r1"}); err != nil || !resp.GetReleased() {
		t.Fatalf("release by its owner: %v, %v", resp, err)
	}
	long := strings.Repeat("x", api.MaxRequestIDBytes+1)
	if _, err := srv.Route(alice, &kvindexv1.RouteRequest{RequestId: long, Score: req.Score}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("long request id: %v, want InvalidArgument", err)
	}
}

// A request's tier_weights weigh each tier's cached blocks: a worker whose
// prompt sits in host memory loses to one holding less of it in GPU memory
// once CPU is weighed low.
func TestScoreTierWeights(t *testing.T) {
	f, ws := newRouteFixture(t, 2)
	p := prompt(7, 64)
	host := stored(1, p, 0, 64)
	host.Medium = events.MediumCPU
	apply(t, ws[0], host)
	apply(t, ws[1], stored(2, p, 0, 32))
	for _, tc := range []struct {
		weights map[string]float64
		first   string
		overlap float64 // of pod-0
	}{
		{nil, "pod-0", 0.8},
		{map[string]float64{"cpu": 0.25}, "pod-1", 0.25},
		{map[string]float64{"CPU": 1, "gpu": 1}, "pod-0", 1},
	} {
		resp := score(t, f, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p,
			Policy: &kvindexv1.ScorePolicy{Name: "longest_prefix", TierWeights: tc.weights}})
		var overlap float64
		for _, w := range resp.GetWorkers() {
			if w.GetWorker().GetPod() == "pod-0" {
				overlap = w.GetOverlap()
			}
		}
		if resp.GetWorkers()[0].GetWorker().GetPod() != tc.first || math.Abs(overlap-tc.overlap) > 1e-9 {
			t.Errorf("%v: first %s, pod-0 overlap %v; want %s, %v", tc.weights, resp.GetWorkers()[0].GetWorker().GetPod(), overlap, tc.first, tc.overlap)
		}
	}
}
