package daemon

import "github.com/kvindex/kvindex/events"

// sources joins the daemon's event sources (the ZeroMQ subscriber, the
// fleet's NATS source) into the one view the API reads: every worker's
// stream statistics, and its health from whichever source feeds it.
type sources []interface {
	events.StatsSource
	events.HealthSource
}

// WorkerStats implements events.StatsSource.
func (s sources) WorkerStats() []events.WorkerStats {
	var out []events.WorkerStats
	for _, src := range s {
		out = append(out, src.WorkerStats()...)
	}
	return out
}

// Health implements events.HealthSource: the first source that knows the
// worker.
func (s sources) Health(ref events.WorkerRef) *events.HealthCell {
	for _, src := range s {
		if c := src.Health(ref); c != nil {
			return c
		}
	}
	return nil
}

// Refusals implements events.RefusalSource over the sources that have
// refusals.
func (s sources) Refusals() []events.Refusal {
	var out []events.Refusal
	for _, src := range s {
		if r, ok := src.(events.RefusalSource); ok {
			out = append(out, r.Refusals()...)
		}
	}
	return out
}
