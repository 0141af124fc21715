package sim

import (
	"cmp"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
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
	Engines int           // fleet size (default: the workload's, else 8)
	Engine  engine.Config // every engine's (zero fields: engine defaults)
	// Routers to compare (default: all); a kvindex router named with
	// PrefixOnly after it ("precise/prefix-only", virtual time) asks a
	// kvindex that matches by the prefix group alone.
	Routers []string
	// EventLag delays applying each engine batch to the index, in virtual
	// time (virtual mode only; live mode has the real lag).
	EventLag time.Duration
	// Serial holds each arrival until every engine is idle and every batch
	// applied (virtual mode only): no request is in flight when one is
	// routed, so kvindex's predictions are checked alone. Arrivals move
	// later; TTFTs then measure no queueing.
	Serial bool
	// NoGroupCaps makes kvindex match hybrid workers by their prefix group
	// alone (scoring.Options.NoGroupCaps; live: scoring.group_caps false).
	NoGroupCaps     bool
	Wire            events.EncodeOptions // vLLM release the events imitate (default: map encoding, uint64 hashes, v0.26+)
	Model           string               // in kvindex (default DefaultModel)
	PreciseLoadMode string               // router.ModeRoute (default) or router.ModeClient
	RoutePolicy     *scoring.Override    // sent with precise+load's Route (nil: the server's)
	Seed            uint64               // of engines' hashes, output ids and routers' tie-breaks
	Parallel        int                  // simulations at once (default GOMAXPROCS)
	Logger          *slog.Logger         // progress (default: discard)
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
		base, prefixOnly := strings.CutSuffix(r, PrefixOnly)
		if _, err := router.Parse(base); err != nil {
			return o, fmt.Errorf("sim: %w", err)
		}
		if prefixOnly && !router.NeedsIndex(base) {
			return o, fmt.Errorf("sim: router %q: %s names a kvindex router's variant (%s, %s)", r, PrefixOnly, router.Precise, router.PreciseLoad)
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

// PrefixOnly after a kvindex router's name asks for its variant whose
// kvindex matches by the prefix group alone (Options.NoGroupCaps).
const PrefixOnly = "/prefix-only"

// WithPrefixOnly returns routers followed by the PrefixOnly variant of
// each kvindex router among them, for a run that compares the hybrid rule
// with the prefix group alone.
func WithPrefixOnly(routers []string) []string {
	out := slices.Clone(routers)
	for _, r := range routers {
		if router.NeedsIndex(r) {
			out = append(out, r+PrefixOnly)
		}
	}
	return out
}

// podName names engine i of a router's fleet in kvindex.
func podName(i int) string { return fmt.Sprintf("vllm-%d", i) }
