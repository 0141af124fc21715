package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/router"
)

// The criterion precise+load is held to on every cell of the grid: its
// p99 TTFT within P99Slack of the lowest of the other routers (ttft-greedy
// included; the peers are held to their own terms, EvaluatePeers), its
// mean TTFT within MeanSlack of the lowest mean, its token hit rate at
// least HitShare of the best of them, and none better on both p99 and hit
// rate. Variants of kvindex's own routers (PrefixOnly) are shown beside
// them, not held against them.
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

// Term is one term of the criterion on one cell: precise+load's Value,
// the Best of any router's (its own included) and who had it, and
// whether the term holds.
type Term[T time.Duration | float64] struct {
	Value, Best T
	BestRouter  string
	OK          bool
}

// Ratio is Value / Best (1 when Best is not positive).
func (t Term[T]) Ratio() float64 {
	if t.Best <= 0 {
		return 1
	}
	return float64(t.Value) / float64(t.Best)
}

// Criterion is the criterion evaluated on one cell; Dominated lists the
// routers with both a lower p99 and a higher hit rate than precise+load.
type Criterion struct {
	P99, Mean Term[time.Duration]
	Hit       Term[float64]
	Dominated []string
}

// Met reports whether every term of the criterion holds.
func (c *Criterion) Met() bool { return c.P99.OK && c.Mean.OK && c.Hit.OK && len(c.Dominated) == 0 }

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
	c.P99 = Term[time.Duration]{Value: pl.P99, Best: pl.P99, BestRouter: pl.Router}
	c.Mean = Term[time.Duration]{Value: pl.Mean, Best: pl.Mean, BestRouter: pl.Router}
	c.Hit = Term[float64]{Value: pl.HitRate, Best: pl.HitRate, BestRouter: pl.Router}
	for i := range rows {
		r := &rows[i]
		if r.Scheduled == 0 || r == pl || router.IsPeer(r.Router) || strings.HasSuffix(r.Router, PrefixOnly) {
			continue
		}
		if r.P99 < c.P99.Best {
			c.P99.Best, c.P99.BestRouter = r.P99, r.Router
		}
		if r.Mean < c.Mean.Best {
			c.Mean.Best, c.Mean.BestRouter = r.Mean, r.Router
		}
		if r.HitRate > c.Hit.Best {
			c.Hit.Best, c.Hit.BestRouter = r.HitRate, r.Router
		}
		if r.P99 < pl.P99 && r.HitRate > pl.HitRate {
			c.Dominated = append(c.Dominated, r.Router)
		}
	}
	c.P99.OK = float64(c.P99.Value) <= (1+P99Slack)*float64(c.P99.Best)
	c.Mean.OK = float64(c.Mean.Value) <= (1+MeanSlack)*float64(c.Mean.Best)
	c.Hit.OK = c.Hit.Value >= HitShare*c.Hit.Best
	return c, nil
}
