package chart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

// wellFormed checks that b parses as XML.
func wellFormed(t *testing.T, b []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, b)
		}
	}
}

func TestLineChart(t *testing.T) {
	c := LineChart{
		Title: "TTFT <CDF> & more",
		X:     Axis{Label: "seconds", Log: true},
		Y:     Axis{Label: "fraction", Min: 0, Max: 1},
		Series: []Series{
			{Name: "a", Points: []Point{{0.01, 0}, {0.5, 0.5}, {30, 1}}},
			{Name: "oracle", Dashed: true, Markers: true, Points: []Point{{0.02, 0.1}, {0, 0.2}, {3, 1}}},
		},
	}
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	s := b.String()
	for _, want := range []string{"&lt;CDF&gt; &amp; more", ">oracle<", "stroke-dasharray", ">0.01<", ">10<"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if err := (&LineChart{Title: "empty"}).WriteSVG(io.Discard); !errors.Is(err, ErrNoData) {
		t.Errorf("empty chart: %v", err)
	}
}

func TestBarChart(t *testing.T) {
	c := BarChart{Title: "bars", Categories: []string{"x", "y"}, Series: []string{"hit", "p99"},
		Values: [][]float64{{50, 90}, {3, 0.5}}, Labels: func(v float64) string { return Compact(v) }}
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	if n := strings.Count(b.String(), "<rect"); n != 2+4+2 { // background and clip, bars, legend
		t.Errorf("%d rects", n)
	}
}

func TestCompactAndNiceStep(t *testing.T) {
	for v, want := range map[float64]string{1500: "1.5k", 20000: "20k", 0.25: "0.25", 3: "3", 2e6: "2M"} {
		if got := Compact(v); got != want {
			t.Errorf("Compact(%v) = %q, want %q", v, got, want)
		}
	}
	for raw, want := range map[float64]float64{0.7: 1, 1.3: 2, 3: 5, 7: 10, 130: 200} {
		if got := niceStep(raw); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
}
