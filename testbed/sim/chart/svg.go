package chart

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Palette is the Okabe-Ito colour-blind-safe palette (yellow replaced by
// grey), one colour per series in order.
var Palette = []string{"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#999999"}

// Point is one (x, y) value.
type Point struct{ X, Y float64 }

// Series is one named line.
type Series struct {
	Name   string
	Points []Point
	// Dashed draws the line dashed (e.g. for a bound rather than a policy).
	Dashed bool
	// Markers draws a dot at each point.
	Markers bool
}

// Axis describes one axis.
type Axis struct {
	Label string
	// Log uses a base-10 logarithmic scale (values must be positive).
	Log bool
	// Min and Max fix the range; both zero means fit the data.
	Min, Max float64
	// Format renders tick values (default: compact decimal).
	Format func(float64) string
}

// LineChart is a chart of lines.
type LineChart struct {
	Title, Subtitle string
	X, Y            Axis
	Series          []Series
	// Width and Height in pixels (default 760 x 440).
	Width, Height int
}

// ErrNoData is returned for a chart with nothing to draw.
var ErrNoData = errors.New("chart: no data")

const (
	marginLeft, marginRight, marginTop, marginBottom = 70, 180, 70, 56
)

// WriteSVG writes c as a standalone SVG document.
func (c *LineChart) WriteSVG(w io.Writer) error {
	W, H := c.Width, c.Height
	if W == 0 {
		W = 760
	}
	if H == 0 {
		H = 440
	}
	xs, ys := &scale{axis: c.X}, &scale{axis: c.Y}
	n := 0
	for _, s := range c.Series {
		for _, p := range s.Points {
			if xs.ok(p.X) && ys.ok(p.Y) {
				xs.see(p.X)
				ys.see(p.Y)
				n++
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: %q", ErrNoData, c.Title)
	}
	xs.finish(marginLeft, float64(W-marginRight))
	ys.finish(float64(H-marginBottom), marginTop)

	var b strings.Builder
	header(&b, W, H, c.Title, c.Subtitle)
	grid(&b, xs, ys, W, H)
	// Lines.
	b.WriteString(`<g clip-path="url(#plot)">` + "\n")
	for i, s := range c.Series {
		col := Palette[i%len(Palette)]
		var pts []string
		for _, p := range s.Points {
			if xs.ok(p.X) && ys.ok(p.Y) {
				pts = append(pts, ff(xs.px(p.X))+","+ff(ys.px(p.Y)))
			}
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", col, dash, strings.Join(pts, " "))
		if s.Markers {
			for _, p := range s.Points {
				if xs.ok(p.X) && ys.ok(p.Y) {
					fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", ff(xs.px(p.X)), ff(ys.px(p.Y)), col)
				}
			}
		}
	}
	b.WriteString("</g>\n")
	// Legend.
	lx := float64(W-marginRight) + 16
	for i, s := range c.Series {
		y := float64(marginTop) + 10 + float64(i)*22
		col := Palette[i%len(Palette)]
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="3"%s/>`+"\n", ff(lx), ff(y), ff(lx+26), ff(y), col, dash)
		fmt.Fprintf(&b, `<text x="%s" y="%s" font-size="13" dominant-baseline="middle">%s</text>`+"\n", ff(lx+34), ff(y), esc(s.Name))
	}
	axisLabels(&b, c.X.Label, c.Y.Label, W, H)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// BarChart is a grouped bar chart: one group per category, one bar per
// series within each group.
type BarChart struct {
	Title, Subtitle string
	Categories      []string
	// Series names the bars of each group; Values[s][c] is series s in
	// category c.
	Series []string
	Values [][]float64
	Y      Axis
	// Labels prints each bar's value above it with this format (nil: none).
	Labels        func(float64) string
	Width, Height int
}

// WriteSVG writes c as a standalone SVG document.
func (c *BarChart) WriteSVG(w io.Writer) error {
	W, H := c.Width, c.Height
	if W == 0 {
		W = 760
	}
	if H == 0 {
		H = 440
	}
	if len(c.Categories) == 0 || len(c.Series) == 0 {
		return fmt.Errorf("%w: %q", ErrNoData, c.Title)
	}
	ys := &scale{axis: c.Y}
	ys.see(0)
	for _, vs := range c.Values {
		for _, v := range vs {
			if ys.ok(v) {
				ys.see(v)
			}
		}
	}
	ys.finish(float64(H-marginBottom), marginTop)
	var b strings.Builder
	header(&b, W, H, c.Title, c.Subtitle)
	left, right := float64(marginLeft), float64(W-marginRight)
	// Horizontal grid and y ticks.
	for _, t := range ys.ticks() {
		y := ys.px(t)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e4e4e4"/>`+"\n", ff(left), ff(y), ff(right), ff(y))
		fmt.Fprintf(&b, `<text x="%s" y="%s" font-size="12" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", ff(left-6), ff(y), esc(ys.format(t)))
	}
	groupW := (right - left) / float64(len(c.Categories))
	barW := groupW * 0.8 / float64(len(c.Series))
	base := ys.px(math.Max(ys.lo, 0))
	for ci, cat := range c.Categories {
		gx := left + float64(ci)*groupW + groupW*0.1
		for si := range c.Series {
			v := 0.0
			if si < len(c.Values) && ci < len(c.Values[si]) {
				v = c.Values[si][ci]
			}
			y := ys.px(v)
			x := gx + float64(si)*barW
			fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", ff(x), ff(math.Min(y, base)), ff(barW*0.92), ff(math.Abs(base-y)), Palette[si%len(Palette)])
			if c.Labels != nil {
				fmt.Fprintf(&b, `<text x="%s" y="%s" font-size="10" text-anchor="middle">%s</text>`+"\n", ff(x+barW*0.46), ff(math.Min(y, base)-4), esc(c.Labels(v)))
			}
		}
		fmt.Fprintf(&b, `<text x="%s" y="%s" font-size="12" text-anchor="middle">%s</text>`+"\n", ff(left+float64(ci)*groupW+groupW/2), ff(float64(H-marginBottom)+18), esc(cat))
	}
	fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333"/>`+"\n", ff(left), ff(base), ff(right), ff(base))
	lx := right + 16
	for i, s := range c.Series {
		y := float64(marginTop) + 10 + float64(i)*22
		fmt.Fprintf(&b, `<rect x="%s" y="%s" width="18" height="12" fill="%s"/>`+"\n", ff(lx), ff(y-6), Palette[i%len(Palette)])
		fmt.Fprintf(&b, `<text x="%s" y="%s" font-size="13" dominant-baseline="middle">%s</text>`+"\n", ff(lx+26), ff(y), esc(s))
	}
	axisLabels(&b, "", c.Y.Label, W, H)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func header(b *strings.Builder, W, H int, title, subtitle string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n", W, H, W, H)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(b, `<defs><clipPath id="plot"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath></defs>`+"\n", marginLeft, marginTop-2, W-marginLeft-marginRight, H-marginTop-marginBottom+4)
	fmt.Fprintf(b, `<text x="%d" y="24" font-size="17" font-weight="bold">%s</text>`+"\n", marginLeft, esc(title))
	// Wrap the subtitle to the chart's width (about 7.2 px per character).
	maxChars := max(20, (W-marginLeft-10)*10/72)
	for i, line := range wrap(subtitle, maxChars) {
		if i == 2 {
			break
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" fill="#555">%s</text>`+"\n", marginLeft, 40+14*i, esc(line))
	}
}

// wrap splits s into lines of at most n characters at spaces.
func wrap(s string, n int) []string {
	var lines []string
	for len(s) > n {
		cut := strings.LastIndex(s[:n], " ")
		if cut <= 0 {
			cut = n
		}
		lines = append(lines, s[:cut])
		s = strings.TrimLeft(s[cut:], " ")
	}
	if s != "" {
		lines = append(lines, s)
	}
	return lines
}

func grid(b *strings.Builder, xs, ys *scale, W, H int) {
	left, right := float64(marginLeft), float64(W-marginRight)
	top, bottom := float64(marginTop), float64(H-marginBottom)
	lastLabel := math.Inf(-1)
	for _, t := range xs.ticks() {
		x := xs.px(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e4e4e4"/>`+"\n", ff(x), ff(top), ff(x), ff(bottom))
		// Label a tick when it has room: 1-2-5 ticks of a log axis crowd
		// each other in narrow decades, so decades come first.
		label := xs.format(t)
		if xs.axis.Log && !isDecade(t) && xs.px(t*10)-xs.px(t) < 150 {
			continue
		}
		if x-lastLabel < float64(len(label))*7+6 {
			continue
		}
		lastLabel = x
		fmt.Fprintf(b, `<text x="%s" y="%s" font-size="12" text-anchor="middle">%s</text>`+"\n", ff(x), ff(bottom+18), esc(label))
	}
	for _, t := range ys.ticks() {
		y := ys.px(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e4e4e4"/>`+"\n", ff(left), ff(y), ff(right), ff(y))
		fmt.Fprintf(b, `<text x="%s" y="%s" font-size="12" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", ff(left-6), ff(y), esc(ys.format(t)))
	}
	fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333"/>`+"\n", ff(left), ff(top), ff(right-left), ff(bottom-top))
}

func axisLabels(b *strings.Builder, x, y string, W, H int) {
	if x != "" {
		fmt.Fprintf(b, `<text x="%s" y="%d" font-size="13" text-anchor="middle">%s</text>`+"\n", ff(float64(marginLeft+W-marginRight)/2), H-14, esc(x))
	}
	if y != "" {
		cy := float64(marginTop+H-marginBottom) / 2
		fmt.Fprintf(b, `<text x="18" y="%s" font-size="13" text-anchor="middle" transform="rotate(-90 18 %s)">%s</text>`+"\n", ff(cy), ff(cy), esc(y))
	}
}

// scale maps data values to pixels along one axis.
type scale struct {
	axis     Axis
	lo, hi   float64
	seen     bool
	p0, p1   float64 // pixel positions of lo and hi
	tlo, thi float64 // transformed range
}

func (s *scale) ok(v float64) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!s.axis.Log || v > 0)
}

func (s *scale) see(v float64) {
	if !s.seen {
		s.lo, s.hi, s.seen = v, v, true
		return
	}
	s.lo, s.hi = math.Min(s.lo, v), math.Max(s.hi, v)
}

func (s *scale) tf(v float64) float64 {
	if s.axis.Log {
		return math.Log10(v)
	}
	return v
}

func (s *scale) finish(p0, p1 float64) {
	if s.axis.Min != 0 || s.axis.Max != 0 {
		s.lo, s.hi = s.axis.Min, s.axis.Max
	}
	if s.axis.Log {
		s.lo, s.hi = logStep(s.lo, false), logStep(s.hi, true)
		if s.hi <= s.lo {
			s.hi = s.lo * 10
		}
	} else if s.axis.Min == 0 && s.axis.Max == 0 {
		step := niceStep((s.hi - s.lo) / 5)
		if s.hi == s.lo {
			step = niceStep(math.Max(math.Abs(s.hi), 1) / 5)
		}
		s.lo = math.Floor(s.lo/step) * step
		s.hi = math.Ceil(s.hi/step) * step
		if s.hi == s.lo {
			s.hi = s.lo + step
		}
	}
	s.p0, s.p1 = p0, p1
	s.tlo, s.thi = s.tf(s.lo), s.tf(s.hi)
}

func (s *scale) px(v float64) float64 {
	return s.p0 + (s.tf(v)-s.tlo)/(s.thi-s.tlo)*(s.p1-s.p0)
}

func (s *scale) ticks() []float64 {
	var out []float64
	if s.axis.Log {
		for d := math.Pow(10, math.Floor(math.Log10(s.lo)+1e-9)); d <= s.hi*1.0001; d *= 10 {
			for _, m := range []float64{1, 2, 5} {
				if v := d * m; v >= s.lo*0.9999 && v <= s.hi*1.0001 {
					out = append(out, v)
				}
			}
		}
		return out
	}
	step := niceStep((s.hi - s.lo) / 6)
	for v := math.Ceil(s.lo/step) * step; v <= s.hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

func (s *scale) format(v float64) string {
	if s.axis.Format != nil {
		return s.axis.Format(v)
	}
	return Compact(v)
}

// logStep rounds v down (or up) to the nearest 1, 2 or 5 times a power
// of ten, the ends of a log axis.
func logStep(v float64, up bool) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	steps := []float64{1, 2, 5, 10}
	if up {
		for _, m := range steps {
			if m*p >= v*(1-1e-9) {
				return m * p
			}
		}
	}
	for i := len(steps) - 2; i >= 0; i-- {
		if steps[i]*p <= v*(1+1e-9) {
			return steps[i] * p
		}
	}
	return p
}

// isDecade reports whether v is a power of ten.
func isDecade(v float64) bool {
	l := math.Log10(v)
	return math.Abs(l-math.Round(l)) < 1e-9
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	}
	return 10 * p
}

// Compact renders a number briefly: 1.5k, 20k, 0.25, 3.
func Compact(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return trim(v/1e6) + "M"
	case a >= 1e3:
		return trim(v/1e3) + "k"
	}
	return trim(v)
}

func trim(v float64) string {
	s := strconv.FormatFloat(v, 'f', 3, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func ff(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
