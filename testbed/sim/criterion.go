package sim

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/router"
)

// The criterion precise+load is held to on every cell of the grid: its
// p99 TTFT within P99Slack of the lowest of all routers (ttft-greedy
// included), its mean TTFT within MeanSlack of the lowest mean, its token
// hit rate at least HitShare of the best of any router, and no router
// better on both p99 and hit rate.
const (
	P99Slack  = 0.05
	MeanSlack = 0.05
	HitShare  = 0.90
)

// CriterionRow is what the criterion reads of one router's result: its
// token hit rate, p99 and mean TTFT, and requests scheduled (0: the row
// takes no part).
type CriterionRow struct {
	Router    string
	HitRate   float64
	P99, Mean time.Duration
	Scheduled int
}

// Criterion is the criterion evaluated on one cell: precise+load's p99,
// mean TTFT and hit rate, each beside the best of any router's (its own
// included) and who had it; whether each term holds; and the routers with
// both a lower p99 and a higher hit rate.
type Criterion struct {
	P99, BestP99         time.Duration
	BestP99Router        string
	Mean, BestMean       time.Duration
	BestMeanRouter       string
	Hit, BestHit         float64
	BestHitRouter        string
	P99OK, MeanOK, HitOK bool
	Dominated            []string
}

// Met reports whether every term of the criterion holds.
func (c *Criterion) Met() bool { return c.P99OK && c.MeanOK && c.HitOK && len(c.Dominated) == 0 }

// P99Excess is precise+load's p99 above the lowest, as a fraction.
func (c *Criterion) P99Excess() float64 { return excess(c.P99, c.BestP99) }

// MeanExcess is precise+load's mean TTFT above the lowest, as a fraction.
func (c *Criterion) MeanExcess() float64 { return excess(c.Mean, c.BestMean) }

func excess(v, best time.Duration) float64 {
	if best <= 0 {
		return 0
	}
	return float64(v-best) / float64(best)
}

// HitShare is precise+load's hit rate as a fraction of the best.
func (c *Criterion) HitShare() float64 {
	if c.BestHit <= 0 {
		return 1
	}
	return c.Hit / c.BestHit
}

// EvaluateCriterion evaluates the criterion on one cell's rows. It fails
// when precise+load is missing or ran no request.
func EvaluateCriterion(rows []CriterionRow) (Criterion, error) {
	var c Criterion
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
	c.P99, c.Mean, c.Hit = pl.P99, pl.Mean, pl.HitRate
	c.BestP99, c.BestP99Router = pl.P99, pl.Router
	c.BestMean, c.BestMeanRouter = pl.Mean, pl.Router
	c.BestHit, c.BestHitRouter = pl.HitRate, pl.Router
	for i := range rows {
		r := &rows[i]
		if r.Scheduled == 0 || r == pl {
			continue
		}
		if r.P99 < c.BestP99 {
			c.BestP99, c.BestP99Router = r.P99, r.Router
		}
		if r.Mean < c.BestMean {
			c.BestMean, c.BestMeanRouter = r.Mean, r.Router
		}
		if r.HitRate > c.BestHit {
			c.BestHit, c.BestHitRouter = r.HitRate, r.Router
		}
		if r.P99 < pl.P99 && r.HitRate > pl.HitRate {
			c.Dominated = append(c.Dominated, r.Router)
		}
	}
	c.P99OK = float64(c.P99) <= (1+P99Slack)*float64(c.BestP99)
	c.MeanOK = float64(c.Mean) <= (1+MeanSlack)*float64(c.BestMean)
	c.HitOK = c.Hit >= HitShare*c.BestHit
	return c, nil
}
