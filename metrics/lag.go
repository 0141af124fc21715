package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Lag sources: how the batches reached this process.
const (
	LagZMQ  = "zmq"  // from the engine over ZeroMQ (direct mode, or an agent)
	LagNATS = "nats" // from an agent's delta over NATS (a fleet replica)
)

// Lag is the histogram kvindex_event_lag_seconds: how long after the
// engine stamped a batch (its wall clock) this process applied it, by
// source. It includes any offset between the two clocks; a batch stamped
// in this host's future counts as 0. Replayed batches are not observed
// (their age is the gap's, not the path's). Observe is safe for
// concurrent use and does not allocate.
type Lag struct {
	vec       *prometheus.HistogramVec
	zmq, nats prometheus.Observer
}

// lagBuckets span the path's normal lag (sub-millisecond on a quiet
// host) to a backlog of seconds.
var lagBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// NewLag returns the lag histogram (register it with Collector).
func NewLag() *Lag {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvindex_event_lag_seconds",
		Help:    "Time from an engine's batch timestamp to its application in this process, by source (zmq: from the engine; nats: an agent's delta). Includes the offset between the engine's clock and this host's; replayed batches are not counted.",
		Buckets: lagBuckets,
	}, []string{"source"})
	return &Lag{vec: v, zmq: v.WithLabelValues(LagZMQ), nats: v.WithLabelValues(LagNATS)}
}

// Collector returns the histogram, for a registry.
func (l *Lag) Collector() prometheus.Collector { return l.vec }

// Observe counts a batch of source (LagZMQ or LagNATS) stamped at
// engineTime (seconds since the Unix epoch; 0, unknown, is not counted)
// and applied at now.
func (l *Lag) Observe(source string, engineTime float64, now time.Time) {
	if engineTime <= 0 {
		return
	}
	o := l.zmq
	if source == LagNATS {
		o = l.nats
	}
	o.Observe(max(0, float64(now.UnixNano())/1e9-engineTime))
}

// NewFunc returns a prometheus.Collector of descs whose metrics collect
// computes at scrape time.
func NewFunc(collect func(chan<- prometheus.Metric), descs ...*prometheus.Desc) prometheus.Collector {
	return funcCollector{descs, collect}
}

type funcCollector struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c funcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c funcCollector) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
