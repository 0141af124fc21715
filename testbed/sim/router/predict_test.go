package router

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
)

// matchingKV is fakeKV whose Route also reports the chosen worker's match.
type matchingKV struct {
	fakeKV
	routed int
}

func (k *matchingKV) RouteMatched() int { return k.routed }

// estimatingKV also reports an estimated TTFT for its last Route.
type estimatingKV struct {
	matchingKV
	est time.Duration
	ok  bool
}

func (k *estimatingKV) RouteEstimate() (time.Duration, bool) { return k.est, k.ok }

// TestPreciseLoadEstimates: precise+load passes on the estimated TTFT its
// KV's Route reported; precise, which asks Score, and a failed Route
// estimate nothing, nor does a Route whose policy made no estimate.
func TestPreciseLoadEstimates(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 3)}
	kv := &estimatingKV{matchingKV: matchingKV{fakeKV: fakeKV{route: "p1", matched: map[string]uint32{"p1": 16}}, routed: 16}, est: 1500 * time.Millisecond, ok: true}
	cfg := Config{Fleet: f, KV: kv, Names: []string{"p0", "p1", "p2"}, Model: "m"}
	estimated := func(r Router) (time.Duration, bool) {
		t.Helper()
		e, ok := r.(Estimator)
		if !ok {
			t.Fatalf("%s is no Estimator", r.Name())
		}
		return e.Estimated()
	}
	r := mustNew(t, PreciseLoad, cfg)
	if got := routeAll(t, r, request(0, 1)); !eq(got, []int{1}) {
		t.Fatalf("routed %v", got)
	}
	if d, ok := estimated(r); !ok || d != 1500*time.Millisecond {
		t.Errorf("precise+load estimated %v (%v), want 1.5s", d, ok)
	}
	kv.ok = false
	routeAll(t, r, request(1, 1))
	if _, ok := estimated(r); ok {
		t.Error("a Route without an estimate estimated")
	}
	kv.ok, kv.route = true, ""
	if _, err := r.Route(context.Background(), request(2, 1)); err == nil {
		t.Fatal("Route without a choice succeeded")
	}
	if _, ok := estimated(r); ok {
		t.Error("a failed Route estimated")
	}
	kv.route = "p1"
	p := mustNew(t, Precise, cfg)
	routeAll(t, p, request(3, 1))
	if _, ok := estimated(p); ok {
		t.Error("precise (Score) estimated")
	}
}

func predicted(t *testing.T, r Router) (int, bool) {
	t.Helper()
	p, ok := r.(Predictor)
	if !ok {
		t.Fatalf("%s is no Predictor", r.Name())
	}
	return p.Predicted()
}

func TestPreciseRoutersPredict(t *testing.T) {
	f := &fakeFleet{loads: make([]engine.Load, 3)}
	// precise and client-mode precise+load predict the chosen engine's
	// Score match.
	for _, mode := range []string{"", ModeClient} {
		kv := &fakeKV{matched: map[string]uint32{"p0": 16, "p1": 64}}
		cfg := preciseCfg(f, kv)
		cfg.PreciseLoadMode = mode
		name := Precise
		if mode != "" {
			name = PreciseLoad
		}
		r := mustNew(t, name, cfg)
		if got := routeAll(t, r, request(0, 1, 2)); !eq(got, []int{1}) {
			t.Fatalf("%s: got %v", name, got)
		}
		if tok, ok := predicted(t, r); !ok || tok != 64 {
			t.Errorf("%s %s: predicted %d (%v), want 64", name, mode, tok, ok)
		}
	}
	// precise+load's Route predicts what its KV reports, if it does.
	kv := &matchingKV{fakeKV: fakeKV{route: "p2"}, routed: 48}
	r := mustNew(t, PreciseLoad, preciseCfg(f, &kv.fakeKV))
	routeAll(t, r, request(1, 1))
	if _, ok := predicted(t, r); ok {
		t.Error("a KV that reports no match predicted one")
	}
	r = mustNew(t, PreciseLoad, Config{Fleet: f, KV: kv, Names: []string{"p0", "p1", "p2"}, Model: "m"})
	routeAll(t, r, request(2, 1))
	if tok, ok := predicted(t, r); !ok || tok != 48 {
		t.Errorf("precise+load predicted %d (%v), want 48", tok, ok)
	}
	// A failed Route predicts nothing.
	kv.route = ""
	if _, err := r.Route(context.Background(), request(3, 1)); err == nil {
		t.Fatal("Route without a choice succeeded")
	}
	if _, ok := predicted(t, r); ok {
		t.Error("a failed Route predicted")
	}
}
