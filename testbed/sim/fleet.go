package sim

import (
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/router"
)

// fleet is one router's engines; it is the router.Fleet the routers see.
type fleet struct {
	engines []*engine.Engine
	scratch []uint64
}

func newFleet(o *Options, events bool) (*fleet, error) {
	f := &fleet{}
	for i := range o.Engines {
		cfg := o.Engine
		cfg.HashSeed = o.Seed ^ uint64(i+1)*0x9e3779b97f4a7c15
		cfg.OutputSeed = o.Seed
		cfg.Events = events
		e, err := engine.New(i, cfg)
		if err != nil {
			return nil, err
		}
		f.engines = append(f.engines, e)
	}
	return f, nil
}

// Engines implements router.Fleet.
func (f *fleet) Engines() int { return len(f.engines) }

// Load implements router.Fleet.
func (f *fleet) Load(i int) engine.Load { return f.engines[i].Load() }

// CachedTokens implements router.Fleet: engine i's exact cached prefix
// of req now. Cost: one hash per prompt block, one probe per cached block.
func (f *fleet) CachedTokens(i int, req *router.Request) int {
	e := f.engines[i]
	f.scratch = e.BlockHashes(f.scratch[:0], req.Content[:req.PromptBlocks])
	return e.CachedTokens(f.scratch, req.PromptLen)
}
