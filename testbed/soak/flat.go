package soak

import "fmt"

// FlatRule says when a series of samples of a long-running process (its
// RSS, its goroutines) is flat: split the samples into thirds by count,
// then the largest sample of the last third may exceed the largest of the
// first third by at most Ratio times it plus Slack. Comparing maxima
// leaves room for a start-up peak (the first third holds the join replay)
// and for a garbage collector's sawtooth, while a steady leak shows as a
// last third above the first.
type FlatRule struct {
	// Ratio is the allowed growth factor (1.25: a quarter).
	Ratio float64
	// Slack is the allowed absolute growth on top (bytes, goroutines).
	Slack float64
	// MinSamples is the fewest samples the rule judges; fewer is an error.
	MinSamples int
}

// RSSRule is the soak's rule for the daemon's VmRSS: a quarter plus 8 MiB.
func RSSRule() FlatRule { return FlatRule{Ratio: 1.25, Slack: 8 << 20, MinSamples: 6} }

// GoroutineRule is the soak's rule for go_goroutines: a quarter plus 16.
func GoroutineRule() FlatRule { return FlatRule{Ratio: 1.25, Slack: 16, MinSamples: 6} }

// FlatVerdict is the outcome of FlatRule.Judge.
type FlatVerdict struct {
	// FirstMax and LastMax are the largest samples of the first and last
	// thirds; Limit is FirstMax*Ratio+Slack.
	FirstMax, LastMax, Limit float64
	// Samples is how many samples were judged.
	Samples int
	// Flat is LastMax <= Limit.
	Flat bool
}

// Judge applies the rule to samples in time order.
func (r FlatRule) Judge(samples []float64) (FlatVerdict, error) {
	n := len(samples)
	if n < max(r.MinSamples, 3) {
		return FlatVerdict{Samples: n}, fmt.Errorf("soak: %d samples, the flatness rule needs at least %d", n, max(r.MinSamples, 3))
	}
	third := n / 3
	v := FlatVerdict{Samples: n, FirstMax: maxOf(samples[:third]), LastMax: maxOf(samples[n-third:])}
	v.Limit = v.FirstMax*r.Ratio + r.Slack
	v.Flat = v.LastMax <= v.Limit
	return v, nil
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}
