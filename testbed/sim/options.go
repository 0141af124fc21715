package sim

import (
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/router"
)

// DefaultModel is the model name the simulated fleet serves.
const DefaultModel = "kvsim/llama-3.1-8b"

// Options configure a simulation (virtual or live).
type Options struct {
	// Engines is the fleet size (default: the workload's, else 8).
	Engines int
	// Engine configures every engine (zero fields: engine defaults).
	Engine engine.Config
	// Routers are the routers to compare (default: all).
	Routers []string
	// EventLag delays applying each engine batch to the index, in virtual
	// time (virtual mode only; live mode has the real lag).
	EventLag time.Duration
	// Wire is the vLLM release the engines' events imitate (default: the
	// map era, vLLM v0.26+, uint64 hashes).
	Wire events.EncodeOptions
	// Model is the model name in kvindex (default DefaultModel).
	Model string
	// AffinityTokens is how much prompt prefix-hash hashes (default 1,024).
	AffinityTokens int
	// Approx tunes the approximate router (LRU default: the cache size).
	Approx router.ApproxConfig
	// PreciseLoadMode is router.ModeRoute (default: kvindex's Route) or
	// router.ModeClient (a client-side cost from Score).
	PreciseLoadMode string
	// LoadWeight tunes precise+load's client-side cost (default 1).
	LoadWeight float64
	// RoutePolicy is sent with precise+load's Route requests (nil: the
	// server's default policy).
	RoutePolicy *scoring.Override
	// Seed seeds engines' hashes, output ids and routers' tie-breaks.
	Seed uint64
	// Parallel bounds simulations run at once (default GOMAXPROCS).
	Parallel int
	// Logger receives progress (default: discard).
	Logger *slog.Logger
}

// withDefaults returns a copy of o with defaults filled in for w.
func (o Options) withDefaults(workloadEngines int) (Options, error) {
	if o.Engines == 0 {
		o.Engines = workloadEngines
	}
	if o.Engines == 0 {
		o.Engines = 8
	}
	if o.Engines < 1 {
		return o, fmt.Errorf("sim: %d engines", o.Engines)
	}
	o.Engine.Defaults()
	if len(o.Routers) == 0 {
		o.Routers = router.Names
	}
	for _, r := range o.Routers {
		if _, err := router.Parse(r); err != nil {
			return o, fmt.Errorf("sim: %w", err)
		}
	}
	if o.Wire == (events.EncodeOptions{}) {
		o.Wire = events.EncodeOptions{Encoding: events.EncodingMap}
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.Approx.LRUBlocks == 0 {
		o.Approx.LRUBlocks = o.Engine.CacheBlocks
	}
	if o.Parallel <= 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.EventLag < 0 {
		return o, fmt.Errorf("sim: negative event lag %v", o.EventLag)
	}
	return o, nil
}

// podName names engine i of a router's fleet in kvindex.
func podName(i int) string { return fmt.Sprintf("vllm-%d", i) }
