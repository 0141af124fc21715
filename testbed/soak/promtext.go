package soak

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics are the metric families of one /metrics page, by name.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics reads the Prometheus text format (what the daemon's
// /metrics serves).
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("soak: parse metrics: %w", err)
	}
	return fams, nil
}

// Each calls f with the labels and value of every sample of the counter,
// gauge or untyped metric name.
func (ms Metrics) Each(name string, f func(labels map[string]string, v float64)) {
	for _, m := range ms[name].GetMetric() {
		labels := make(map[string]string, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		f(labels, m.GetCounter().GetValue()+m.GetGauge().GetValue()+m.GetUntyped().GetValue())
	}
}

// Metric returns the sum of the samples named name whose labels include
// every pair of match (nil matches all), and whether any matched.
func Metric(ms Metrics, name string, match map[string]string) (float64, bool) {
	var sum float64
	found := false
	ms.Each(name, func(labels map[string]string, v float64) {
		for k, want := range match {
			if labels[k] != want {
				return
			}
		}
		sum += v
		found = true
	})
	return sum, found
}

// clip returns s cut to at most n bytes, marked when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
