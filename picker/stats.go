package picker

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/metrics"
)

// decision is what the picker did with a request.
type decision int

const (
	decisionRouted         decision = iota // routed on its prompt
	decisionLoadOnly                       // no usable prompt, or its scoring failed: routed by load
	decisionNoEndpoint                     // answered 503
	decisionBusy                           // answered 429
	decisionTooLarge                       // answered 413
	decisionStaleOnly                      // only untrusted endpoints were eligible (also counted as routed)
	decisionServedFallback                 // the gateway reports a fallback served it
	numDecisions
)

var decisionNames = [numDecisions]string{"routed", "load_only", "no_endpoint", "busy", "too_large", "stale_only", "served_fallback"}

// releaseReason is why a request's in-flight accounting ended.
type releaseReason int

const (
	releaseFirstChunk releaseReason = iota // the first response body chunk
	releaseError                           // an error status (>= 400)
	releaseEnd                             // the response ended without a body chunk
	releaseCancel                          // the stream closed first: client cancel, upstream reset
	numReleases
)

var releaseNames = [numReleases]string{"first_chunk", "error_status", "end_of_stream", "stream_closed"}

// counters are a Picker's counts, read by Stats.
type counters struct {
	decisions       [numDecisions]atomic.Int64
	releases        [numReleases]atomic.Int64
	releaseFailures atomic.Int64
	endpointSets    atomic.Int64 // SetEndpoints calls that took effect
	pickNanos       atomic.Int64
	picks           atomic.Int64
	pickSeconds     prometheus.Histogram // set by New
}

// Stats are a Picker's counters since it was made.
type Stats struct {
	// Decisions and Releases count requests by decision and releases by
	// reason, named as in kvindex_gateway_requests_total and
	// kvindex_gateway_releases_total.
	Decisions, Releases map[string]int64
	// ReleaseFailures counts Release calls that failed.
	ReleaseFailures int64
	// Picks and PickTime are the decisions made and the time they took.
	Picks    int64
	PickTime time.Duration
	// Active is the requests followed now.
	Active int64
	// Endpoints is the pool's endpoints now; EndpointUpdates counts the
	// sets SetEndpoints installed.
	Endpoints, EndpointUpdates int64
}

// Stats returns the counters.
func (p *Picker) Stats() Stats {
	s := Stats{Decisions: map[string]int64{}, Releases: map[string]int64{}, ReleaseFailures: p.counter.releaseFailures.Load(),
		Picks: p.counter.picks.Load(), PickTime: time.Duration(p.counter.pickNanos.Load()), Active: p.active.Load(),
		Endpoints: int64(len(p.pool.Load().list)), EndpointUpdates: p.counter.endpointSets.Load()}
	for i := range p.counter.decisions {
		s.Decisions[decisionNames[i]] = p.counter.decisions[i].Load()
	}
	for i := range p.counter.releases {
		s.Releases[releaseNames[i]] = p.counter.releases[i].Load()
	}
	return s
}

// Collector returns the picker's Prometheus metrics.
func (p *Picker) Collector() prometheus.Collector {
	pc := &p.counter
	return metrics.NewFunc(func(ch chan<- prometheus.Metric) {
		for i := range pc.decisions {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(pc.decisions[i].Load()), decisionNames[i])
		}
		for i := range pc.releases {
			ch <- prometheus.MustNewConstMetric(descReleases, prometheus.CounterValue, float64(pc.releases[i].Load()), releaseNames[i])
		}
		ch <- prometheus.MustNewConstMetric(descRelFail, prometheus.CounterValue, float64(pc.releaseFailures.Load()))
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(p.active.Load()))
		ch <- prometheus.MustNewConstMetric(descEPs, prometheus.GaugeValue, float64(len(p.pool.Load().list)))
		ch <- prometheus.MustNewConstMetric(descEPSets, prometheus.CounterValue, float64(pc.endpointSets.Load()))
		pc.pickSeconds.Collect(ch)
	}, descRequests, descReleases, descRelFail, descActive, descEPs, descEPSets, pc.pickSeconds.Desc())
}

var (
	descRequests = prometheus.NewDesc("kvindex_gateway_requests_total", "Requests the endpoint picker answered, by decision: routed (on its prompt), load_only (no usable prompt, or it could not be scored: routed by load), no_endpoint (503), busy (429: gateway.max_requests or kvindex overloaded), too_large (413: gateway.max_body_bytes), stale_only (only stale endpoints were eligible), served_fallback (the gateway reports a fallback endpoint served it).", []string{"decision"}, nil)
	descReleases = prometheus.NewDesc("kvindex_gateway_releases_total", "Routed requests released by the endpoint picker, by reason: first_chunk (the first response body chunk), error_status (a response status >= 400), end_of_stream (a response without a body), stream_closed (the ext_proc stream ended first: client cancel, upstream reset).", []string{"reason"}, nil)
	descRelFail  = prometheus.NewDesc("kvindex_gateway_release_failures_total", "Release calls of the endpoint picker that failed (the request expires from the in-flight table instead).", nil, nil)
	descActive   = prometheus.NewDesc("kvindex_gateway_active_requests", "Requests the endpoint picker follows now.", nil, nil)
	descEPs      = prometheus.NewDesc("kvindex_gateway_endpoints", "Endpoints (one per worker) in the endpoint picker's pool now.", nil, nil)
	descEPSets   = prometheus.NewDesc("kvindex_gateway_endpoint_updates_total", "Changes of the endpoint picker's pool installed while it serves (an InferencePool or discovery changed).", nil, nil)
)
