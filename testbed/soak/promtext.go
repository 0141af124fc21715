package soak

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text exposition format.
type Sample struct {
	// Name is the metric name.
	Name string
	// Labels are the sample's labels, nil when it has none.
	Labels map[string]string
	// Value is the sample's value.
	Value float64
}

// ParseMetrics reads the Prometheus text format (what the daemon's /metrics
// serves): comments and blank lines are skipped, every other line must be
// name{labels} value [timestamp].
func ParseMetrics(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == '#' {
			continue
		}
		s, err := parseSample(text)
		if err != nil {
			return nil, fmt.Errorf("soak: metrics line %d %q: %w", line, clip(text, 120), err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("soak: read metrics: %w", err)
	}
	return out, nil
}

func parseSample(text string) (Sample, error) {
	var s Sample
	i := strings.IndexAny(text, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name, text = text[:i], text[i:]
	if text[0] == '{' {
		s.Labels = map[string]string{}
		text = text[1:]
		for {
			text = strings.TrimLeft(text, " ,")
			if strings.HasPrefix(text, "}") {
				text = text[1:]
				break
			}
			eq := strings.IndexByte(text, '=')
			if eq <= 0 || eq+1 >= len(text) || text[eq+1] != '"' {
				return s, fmt.Errorf("malformed label")
			}
			name := text[:eq]
			val, rest, err := unquoteLabel(text[eq+2:])
			if err != nil {
				return s, err
			}
			s.Labels[name] = val
			text = rest
		}
	}
	fields := strings.Fields(text)
	if len(fields) == 0 || len(fields) > 2 {
		return s, fmt.Errorf("want a value and at most a timestamp")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value: %w", err)
	}
	s.Value = v
	return s, nil
}

// unquoteLabel reads a label value up to its closing quote (escapes \\,
// \" and \n) and returns it and the text after the quote.
func unquoteLabel(text string) (string, string, error) {
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		switch c := text[i]; c {
		case '"':
			return b.String(), text[i+1:], nil
		case '\\':
			if i+1 >= len(text) {
				return "", "", fmt.Errorf("unterminated escape")
			}
			i++
			switch text[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(text[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated label value")
}

// Metric returns the sum of the samples named name whose labels include
// every pair of match (nil matches all), and whether any matched.
func Metric(samples []Sample, name string, match map[string]string) (float64, bool) {
	var sum float64
	found := false
next:
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		for k, v := range match {
			if s.Labels[k] != v {
				continue next
			}
		}
		sum += s.Value
		found = true
	}
	return sum, found
}

// clip returns s cut to at most n bytes, marked when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
