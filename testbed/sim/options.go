package sim

import (
	"cmp"
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
	// Wire is the vLLM release the engines' events imitate (default: map
	// encoding, uint64 hashes, vLLM v0.26+).
	Wire events.EncodeOptions
	// Model is the model name in kvindex (default DefaultModel).
	Model string
	// PreciseLoadMode is router.ModeRoute (default) or router.ModeClient.
	PreciseLoadMode string
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

// withDefaults returns a copy of o with defaults filled in.
func (o Options) withDefaults(workloadEngines int) (Options, error) {
	o.Engines = cmp.Or(o.Engines, workloadEngines, 8)
	if o.Engines < 1 {
		return o, fmt.Errorf("sim: %d engines", o.Engines)
	}
	if o.EventLag < 0 {
		return o, fmt.Errorf("sim: negative event lag %v", o.EventLag)
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
	o.Wire = cmp.Or(o.Wire, events.EncodeOptions{Encoding: events.EncodingMap})
	o.Model = cmp.Or(o.Model, DefaultModel)
	if o.Parallel <= 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	return o, nil
}

// routerConfig is the router configuration of o's fleet f; the approximate
// router's LRU is the engines' cache size, as GIE's autoTune reads it.
func (o *Options) routerConfig(f *fleet) router.Config {
	return router.Config{Fleet: f, BlockSize: o.Engine.BlockSize, Model: o.Model, LRUBlocks: o.Engine.CacheBlocks,
		PreciseLoadMode: o.PreciseLoadMode, RoutePolicy: o.RoutePolicy, Seed: o.Seed}
}

// podName names engine i of a router's fleet in kvindex.
func podName(i int) string { return fmt.Sprintf("vllm-%d", i) }
