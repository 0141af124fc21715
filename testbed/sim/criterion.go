package sim

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/router"
)

// The criterion precise+load is held to on every cell of the grid: its
// p99 TTFT within P99Slack of the lowest of all routers (ttft-greedy
// included), its token hit rate at least HitShare1x of the best of any
// router at the base rate and HitShare2x above it, and no router better
// on both.
const (
	P99Slack   = 0.05
	HitShare1x = 0.95
	HitShare2x = 0.90
)

// CriterionRow is what the criterion reads of one router's result.
type CriterionRow struct {
	// Router is the router's name.
	Router string
	// HitRate is the share of prompt tokens found cached.
	HitRate float64
	// P99 is the p99 TTFT.
	P99 time.Duration
	// Scheduled is how many requests reached first token (0: none ran,
	// the row takes no part).
	Scheduled int
}

// Criterion is the criterion evaluated on one cell.
type Criterion struct {
	// Rate is the cell's rate multiplier; above 1 the hit target is
	// HitShare2x.
	Rate float64
	// P99 is precise+load's p99; BestP99 the lowest of any router's
	// (precise+load's own included), by BestP99Router.
	P99, BestP99  time.Duration
	BestP99Router string
	// Hit is precise+load's hit rate; BestHit the highest of any
	// router's, by BestHitRouter; HitTarget the share of it required.
	Hit, BestHit  float64
	BestHitRouter string
	HitTarget     float64
	// P99OK and HitOK say whether each half holds; Dominated lists the
	// routers with both a lower p99 and a higher hit rate.
	P99OK, HitOK bool
	Dominated    []string
}

// Met reports whether every part of the criterion holds.
func (c *Criterion) Met() bool { return c.P99OK && c.HitOK && len(c.Dominated) == 0 }

// P99Excess is precise+load's p99 above the lowest, as a fraction.
func (c *Criterion) P99Excess() float64 {
	if c.BestP99 <= 0 {
		return 0
	}
	return float64(c.P99-c.BestP99) / float64(c.BestP99)
}

// HitShare is precise+load's hit rate as a fraction of the best.
func (c *Criterion) HitShare() float64 {
	if c.BestHit <= 0 {
		return 1
	}
	return c.Hit / c.BestHit
}

// EvaluateCriterion evaluates the criterion on one cell's rows at rate.
// It fails when precise+load is missing or ran no request.
func EvaluateCriterion(rows []CriterionRow, rate float64) (Criterion, error) {
	c := Criterion{Rate: rate, HitTarget: HitShare1x}
	if rate > 1 {
		c.HitTarget = HitShare2x
	}
	var pl *CriterionRow
	for i := range rows {
		if rows[i].Router == router.PreciseLoad {
			pl = &rows[i]
		}
	}
	if pl == nil {
		return c, fmt.Errorf("sim: criterion: no %s row", router.PreciseLoad)
	}
	if pl.Scheduled == 0 {
		return c, fmt.Errorf("sim: criterion: %s scheduled no request", router.PreciseLoad)
	}
	c.P99, c.Hit = pl.P99, pl.HitRate
	c.BestP99, c.BestP99Router = pl.P99, pl.Router
	c.BestHit, c.BestHitRouter = pl.HitRate, pl.Router
	for i := range rows {
		r := &rows[i]
		if r.Scheduled == 0 || r == pl {
			continue
		}
		if r.P99 < c.BestP99 {
			c.BestP99, c.BestP99Router = r.P99, r.Router
		}
		if r.HitRate > c.BestHit {
			c.BestHit, c.BestHitRouter = r.HitRate, r.Router
		}
		if r.P99 < pl.P99 && r.HitRate > pl.HitRate {
			c.Dominated = append(c.Dominated, r.Router)
		}
	}
	c.P99OK = float64(c.P99) <= (1+P99Slack)*float64(c.BestP99)
	c.HitOK = c.Hit >= c.HitTarget*c.BestHit
	return c, nil
}
