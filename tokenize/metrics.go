package tokenize

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	kvmetrics "github.com/kvindex/kvindex/metrics"
)

// metrics are a Client's Prometheus metrics; a nil *metrics records
// nothing.
type metrics struct {
	duration prometheus.Histogram
	failures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, c *Client) *metrics {
	m := &metrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvindex_tokenize_duration_seconds", Help: "Tokenizer round trips (cache misses), every endpoint tried included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_tokenize_failures_total", Help: "Tokenizations that failed, by reason: unavailable (no endpoint answered), rejected (4xx), busy (tokenize.max_concurrent), too_large, no_tokenizer, canceled.",
		}, []string{"reason"}),
	}
	cache := prometheus.NewDesc("kvindex_tokenize_requests_total", "Tokenizations by result: hit (from the cache), miss (a round trip of its own), shared (joined an identical round trip in flight). Hit rate: hit / sum.", []string{"result"}, nil)
	entries := prometheus.NewDesc("kvindex_tokenize_cache_entries", "Answers in the tokenizer cache.", nil, nil)
	answers := prometheus.NewDesc("kvindex_tokenize_answers_total", "Tokenizer answers by API: render (vLLM's /v1/chat/completions/render or /v1/completions/render) or tokenize (/tokenize, for servers without render endpoints).", []string{"api"}, nil)
	missing := prometheus.NewDesc("kvindex_tokenize_render_missing_total", "Times a tokenizer server was found without render endpoints and asked /tokenize instead (again after tokenize's render retry).", nil, nil)
	for _, col := range []prometheus.Collector{m.duration, m.failures, kvmetrics.NewFunc(func(ch chan<- prometheus.Metric) {
		st := c.Stats()
		ch <- prometheus.MustNewConstMetric(answers, prometheus.CounterValue, float64(st.Rendered), "render")
		ch <- prometheus.MustNewConstMetric(answers, prometheus.CounterValue, float64(st.Tokenized), "tokenize")
		ch <- prometheus.MustNewConstMetric(missing, prometheus.CounterValue, float64(st.RenderMissing))
		ch <- prometheus.MustNewConstMetric(cache, prometheus.CounterValue, float64(st.Hits), "hit")
		ch <- prometheus.MustNewConstMetric(cache, prometheus.CounterValue, float64(st.Misses), "miss")
		ch <- prometheus.MustNewConstMetric(cache, prometheus.CounterValue, float64(st.Shared), "shared")
		n := 0
		if c.cache != nil {
			n = c.cache.Len()
		}
		ch <- prometheus.MustNewConstMetric(entries, prometheus.GaugeValue, float64(n))
	}, cache, entries, answers, missing)} {
		if err := reg.Register(col); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
		}
	}
	return m
}

func (m *metrics) failed(err error) {
	if m == nil {
		return
	}
	reason := "canceled"
	switch {
	case errors.Is(err, ErrUnavailable):
		reason = "unavailable"
	case errors.Is(err, ErrRejected):
		reason = "rejected"
	case errors.Is(err, ErrBusy):
		reason = "busy"
	case errors.Is(err, ErrTooLarge):
		reason = "too_large"
	case errors.Is(err, ErrNoTokenizer):
		reason = "no_tokenizer"
	}
	m.failures.WithLabelValues(reason).Inc()
}
