package demoload

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/vllmsim"
)

const model = "sim/model"

// rig is two simulated engines and a kvindex daemon subscribed to both.
type rig struct {
	engines map[string]string
	kvAddr  string
}

func startRig(t *testing.T) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{engines: map[string]string{}}
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off", Models: []config.Model{{Name: model, BlockSize: 16}}}
	// Admission control has its own tests; here a Route it refuses on a
	// loaded machine (queued past 50 ms, or past the concurrency it has
	// lowered to) would count as a fallback.
	cfg.Limits.AdmissionOff = true
	var done []chan error
	for _, pod := range []string{"engine-0", "engine-1"} {
		base, err := netutil.FreePorts(2)
		if err != nil {
			t.Fatal(err)
		}
		pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
		s, err := vllmsim.New(vllmsim.Config{Model: model, Pod: pod, Publish: pub, Replay: rep, HTTPListen: "127.0.0.1:0", Engine: engine.Config{CacheBlocks: 4000}})
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan error, 1)
		go func() { ch <- s.Run(ctx) }()
		done = append(done, ch)
		r.engines[pod] = "http://" + s.Addr()
		cfg.Pods = append(cfg.Pods, config.Pod{Name: pod, Model: model, Endpoint: pub, ReplayEndpoint: rep})
	}
	cfg.SetDefaults()
	d, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() { ch <- d.Run(ctx) }()
	done = append(done, ch)
	r.kvAddr = d.GRPCAddr()
	t.Cleanup(func() {
		cancel()
		for _, ch := range done {
			if err := <-ch; err != nil {
				t.Error(err)
			}
		}
	})
	return r
}

// TestRoutedLoadHitsTheCache: requests sharing two system prompts, routed
// by kvindex, land where their prefix is cached: almost every prompt
// token after each prefix's first request is a hit, and every request was
// routed by kvindex and released.
func TestRoutedLoadHitsTheCache(t *testing.T) {
	r := startRig(t)
	ctx := context.Background()
	kv, err := api.Dial(ctx, r.kvAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	d, err := New(Config{Model: model, Engines: r.engines, Rate: 40, Prefixes: 2, SystemTokens: 512, Duration: 2 * time.Second, Seed: 3, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, kv)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(ctx); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	sent := st.Sent.Load()
	if sent < 20 || st.Failed.Load() != 0 || st.Routed.Load() != sent || st.Fallback.Load() != 0 {
		t.Fatalf("sent %d failed %d routed %d fallback %d", sent, st.Failed.Load(), st.Routed.Load(), st.Fallback.Load())
	}
	// Each prompt is 512 system + 48 question tokens; the system prompt's
	// 32 blocks hit except on the first request of each prefix (and on
	// requests that arrive while the first is still prefilling).
	if hr := st.HitRate(); hr < 0.7 {
		t.Fatalf("hit rate %.3f, want at least 0.7 (%d of %d tokens)", hr, st.CachedTokens.Load(), st.PromptTokens.Load())
	}
}

// TestFallbackWithoutKVIndex: with kvindex unreachable every request goes
// round-robin, counted as fallback, and still succeeds.
func TestFallbackWithoutKVIndex(t *testing.T) {
	r := startRig(t)
	port, err := netutil.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := api.Dial(context.Background(), fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	d, err := New(Config{Model: model, Engines: r.engines, Rate: 20, Duration: time.Second, SystemTokens: 64}, kv)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.Sent.Load() == 0 || st.Fallback.Load() != st.Sent.Load() || st.Routed.Load() != 0 || st.Failed.Load() != 0 {
		t.Fatalf("sent %d fallback %d routed %d failed %d", st.Sent.Load(), st.Fallback.Load(), st.Routed.Load(), st.Failed.Load())
	}
}

func TestPickFollowsZipf(t *testing.T) {
	d, err := New(Config{Model: model, Engines: map[string]string{"a": "http://a"}, Prefixes: 4, Zipf: 1}, &api.Client{})
	if err != nil {
		t.Fatal(err)
	}
	// Weights 1, 1/2, 1/3, 1/4 over 25/12: CDF 0.48, 0.72, 0.88, 1.
	for _, tc := range []struct {
		u    float64
		want int
	}{{0, 0}, {0.47, 0}, {0.5, 1}, {0.8, 2}, {0.95, 3}, {0.9999, 3}} {
		if got := d.zipf.At(tc.u); got != tc.want {
			t.Errorf("pick(%v) = %d, want %d", tc.u, got, tc.want)
		}
	}
	if len(d.system[0]) != 1024*4 || d.system[0] == d.system[1] {
		t.Fatal("system prompts are not distinct prose of the asked length")
	}
}

func TestCollector(t *testing.T) {
	d, err := New(Config{Model: model, Engines: map[string]string{"a": "http://a"}}, &api.Client{})
	if err != nil {
		t.Fatal(err)
	}
	d.stats.Sent.Add(3)
	d.stats.Fallback.Add(2)
	d.stats.CachedTokens.Add(40)
	want := `# HELP kvsim_load_routes_total Demo requests by who chose the engine: kvindex (Route) or round_robin (kvindex could not answer).
# TYPE kvsim_load_routes_total counter
kvsim_load_routes_total{by="kvindex"} 0
kvsim_load_routes_total{by="round_robin"} 2
# HELP kvsim_load_cached_tokens_total Prompt tokens the engines had cached (usage.prompt_tokens_details.cached_tokens).
# TYPE kvsim_load_cached_tokens_total counter
kvsim_load_cached_tokens_total 40
`
	if err := testutil.CollectAndCompare(d.Collector(), strings.NewReader(want), "kvsim_load_routes_total", "kvsim_load_cached_tokens_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(d.Collector(), "kvsim_load_requests_total"); n != 3 {
		t.Fatalf("%d request series", n)
	}
}
