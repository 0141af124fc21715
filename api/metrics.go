package api

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// numCodes is the number of canonical gRPC codes (OK through Unauthenticated).
const numCodes = int(codes.Unauthenticated) + 1

// metrics are the Server's Score metrics. A nil *metrics records nothing.
type metrics struct {
	duration prometheus.Histogram
	requests *prometheus.CounterVec
	// byCode holds requests' children for the canonical codes, resolved
	// once so that the hot path does no label lookup.
	byCode [numCodes]prometheus.Counter
	// watchDrops counts events Watch streams dropped for a slow reader.
	watchDrops prometheus.Counter
}

// newMetrics registers the Score metrics with reg, sharing collectors that
// are registered already. It panics on any other registration error, as
// prometheus.MustRegister does: that is a programming error.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvindex_score_duration_seconds",
			Help: "Time to answer a Score request inside the server (validation, hashing, matching), excluding transport.",
			// 10 us to 1 s: a 128-block Score takes tens of microseconds.
			Buckets: prometheus.ExponentialBucketsRange(10e-6, 1, 16),
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_score_requests_total",
			Help: "Score requests answered, by gRPC status code.",
		}, []string{"code"}),
	}
	m.watchDrops = register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindex_watch_dropped_events_total",
		Help: "Applied events a Watch stream dropped because its reader was slower than the events (its buffer was full).",
	}))
	m.duration = register(reg, m.duration)
	m.requests = register(reg, m.requests)
	for c := range m.byCode {
		m.byCode[c] = m.requests.WithLabelValues(codes.Code(c).String())
	}
	return m
}

// register registers c with reg and returns it, or the equal collector that
// reg already holds.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic("api: register Score metrics: " + err.Error())
}

// observe records one Score that started at start and ended with err.
func (m *metrics) observe(start time.Time, err error) {
	if m == nil {
		return
	}
	m.duration.Observe(time.Since(start).Seconds())
	code := status.Code(err)
	if int(code) < numCodes {
		m.byCode[code].Inc()
		return
	}
	m.requests.WithLabelValues(code.String()).Inc()
}

// watchDropped counts one event a Watch stream dropped.
func (m *metrics) watchDropped() {
	if m != nil {
		m.watchDrops.Inc()
	}
}
