package gie

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a Scorer's counters, labelled with its plugin name.
type metrics struct {
	ok, failed, noPrompt prometheus.Counter
	unmapped             prometheus.Counter
}

// newMetrics makes the counters and registers them in reg (none when
// nil). A second plugin of the same name shares the first's counters.
func newMetrics(reg prometheus.Registerer, name string) (*metrics, error) {
	labels := prometheus.Labels{"plugin": name}
	scores := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "kvindex_gie_scores_total",
		Help:        "Scheduling cycles the kvindex scorer scored, by outcome: ok (kvindex answered), failed (kvindex unreachable, past the deadline or refusing: every endpoint scored 0), no_prompt (no prompt kvindex can score: every endpoint scored 0).",
		ConstLabels: labels,
	}, []string{"outcome"})
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "kvindex_gie_unmapped_endpoints_total",
		Help:        "Candidate endpoints the kvindex scorer found no kvindex worker for (no listed address, no pod name): each scored 0.",
		ConstLabels: labels,
	})
	if reg != nil {
		var err error
		if scores, err = register(reg, scores); err != nil {
			return nil, err
		}
		if unmapped, err = register(reg, unmapped); err != nil {
			return nil, err
		}
	}
	return &metrics{
		ok:       scores.WithLabelValues("ok"),
		failed:   scores.WithLabelValues("failed"),
		noPrompt: scores.WithLabelValues("no_prompt"),
		unmapped: unmapped,
	}, nil
}

// register registers c in reg, or returns the collector already there.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return c, nil
	case errors.As(err, &are):
		if old, ok := are.ExistingCollector.(C); ok {
			return old, nil
		}
	}
	return c, fmt.Errorf("metrics: %w", err)
}
