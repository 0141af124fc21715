package workload

import (
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestReadMooncakeExcerpt(t *testing.T) {
	w, err := LoadMooncake("testdata/mooncake-excerpt.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 40 || w.Name != "mooncake-excerpt" {
		t.Fatalf("%d requests named %q", len(w.Requests), w.Name)
	}
	r0 := w.Requests[0]
	// {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0..13]}
	if r0.PromptLen != 6758 || r0.OutputLen != 500 || len(r0.Prompt) != 14 || r0.Prompt[13].Len != 6758-13*512 {
		t.Fatalf("request 0 = %+v", r0)
	}
	// Requests 0 and 1 share hash id 0 and nothing else: equal tokens for
	// exactly the first 512, at every block size dividing 512.
	r1 := w.Requests[1]
	t0, t1 := r0.AppendTokens(nil, 0, 1024), r1.AppendTokens(nil, 0, 1024)
	if !slices.Equal(t0[:512], t1[:512]) || slices.Equal(t0[512:], t1[512:]) {
		t.Fatal("hash id 0 does not give both requests the same first 512 tokens (and only those)")
	}
	for _, bs := range []int{16, 32, 64, 128, 512} {
		c0, c1 := r0.AppendBlockContent(nil, bs, Segment{}), r1.AppendBlockContent(nil, bs, Segment{})
		shared := 512 / bs
		for i := range shared {
			if c0[i] != c1[i] {
				t.Fatalf("block size %d: block %d differs though its tokens are equal", bs, i)
			}
		}
		if c0[shared] == c1[shared] {
			t.Fatalf("block size %d: block %d equal though its tokens differ", bs, shared)
		}
		if len(c0) != r0.PromptLen/bs {
			t.Fatalf("block size %d: %d content ids for %d tokens", bs, len(c0), r0.PromptLen)
		}
	}
}

func TestReadMooncakeErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"json", `{"timestamp": 0, "input_length": 3`, "line 1"},
		{"too long", `{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`, "does not fit 2 hash_ids"},
		{"too short", `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`, "does not fit 2 hash_ids"},
		{"no ids", `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}`, "no hash_ids"},
		{"empty", ``, "holds no requests"},
	} {
		_, err := ReadMooncake(strings.NewReader(tc.in), "t")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

func TestReadMooncakeSortsAndClamps(t *testing.T) {
	in := `{"timestamp": 20, "input_length": 10, "output_length": 0, "hash_ids": [1]}
{"timestamp": 10.5, "input_length": 600, "output_length": 7, "hash_ids": [1, 2]}`
	w, err := ReadMooncake(strings.NewReader(in), "t")
	if err != nil {
		t.Fatal(err)
	}
	if w.Requests[0].Arrival != 10500*time.Microsecond || w.Requests[0].ID != 0 || w.Requests[1].OutputLen != 1 {
		t.Fatalf("requests %+v", w.Requests)
	}
}

func TestTokensFollowContent(t *testing.T) {
	// A block straddling segments: equal pieces give equal content ids.
	a := Request{Prompt: []Segment{{ID: 1, Len: 10}, {ID: 2, Len: 10}}, PromptLen: 20}
	b := Request{Prompt: []Segment{{ID: 1, Len: 10}, {ID: 2, Len: 6}, {ID: 3, Len: 4}}, PromptLen: 20}
	ca, cb := a.AppendBlockContent(nil, 8, Segment{}), b.AppendBlockContent(nil, 8, Segment{})
	ta, tb := a.AppendTokens(nil, 0, 20), b.AppendTokens(nil, 0, 20)
	for i := range ca {
		if (ca[i] == cb[i]) != slices.Equal(ta[i*8:(i+1)*8], tb[i*8:(i+1)*8]) {
			t.Fatalf("block %d: content equality disagrees with token equality", i)
		}
	}
	if ca[1] != cb[1] || ca[0] != cb[0] {
		t.Fatal("blocks 0 and 1 (tokens 0-15) should be equal")
	}
	out := Segment{ID: 99, Len: 5}
	seq := a.AppendSequenceTokens(nil, out, 18, 23)
	want := append(slices.Clone(ta[18:20]), Token(99, 0), Token(99, 1), Token(99, 2))
	if !slices.Equal(seq, want) {
		t.Fatalf("sequence tokens %v, want %v", seq, want)
	}
}

func TestGeneratorsAreDeterministic(t *testing.T) {
	p1, _ := Prefixes(PrefixesConfig{Seed: 3, Requests: 200})
	p2, _ := Prefixes(PrefixesConfig{Seed: 3, Requests: 200})
	p3, _ := Prefixes(PrefixesConfig{Seed: 4, Requests: 200})
	if !reflect.DeepEqual(p1, p2) || reflect.DeepEqual(p1, p3) {
		t.Fatal("prefixes: same seed differs or different seeds agree")
	}
	t1, _ := Tenants(TenantsConfig{Seed: 3, Requests: 200})
	t2, _ := Tenants(TenantsConfig{Seed: 3, Requests: 200})
	if !reflect.DeepEqual(t1, t2) {
		t.Fatal("tenants: same seed differs")
	}
	for _, w := range []*Workload{p1, t1} {
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrefixesDistribution(t *testing.T) {
	c := PrefixesConfig{Requests: 20000, Prefixes: 10, ZipfS: 1, QPS: 50, Seed: 1}
	w, err := Prefixes(c)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range w.Requests {
		counts[r.Group]++
		if r.PromptLen != 2048+256 || r.Prompt[0].Len != 2048 {
			t.Fatalf("request %+v", r)
		}
	}
	// Zipf s=1 over 10: P(rank 1) = 1/H(10) = 0.3414, P(rank 10) = 0.0341.
	for k, want := range map[string]float64{"prefix-0": 0.3414, "prefix-9": 0.0341} {
		got := float64(counts[k]) / 20000
		if math.Abs(got-want) > 0.02 {
			t.Errorf("%s drawn %.4f of the time, want %.4f", k, got, want)
		}
	}
	// Poisson arrivals at 50 QPS: 20,000 requests over ~400 s.
	if d := w.Requests[len(w.Requests)-1].Arrival.Seconds(); math.Abs(d-400) > 15 {
		t.Errorf("20k arrivals at 50 QPS span %.0f s, want ~400", d)
	}
	// Suffixes are unique, prefixes shared.
	if w.Requests[0].Prompt[1].ID == w.Requests[1].Prompt[1].ID {
		t.Error("two requests share a suffix")
	}
}

func TestPrefixesUniform(t *testing.T) {
	w, err := Prefixes(PrefixesConfig{Requests: 20000, Prefixes: 10, Uniform: true, QPS: 50, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range w.Requests {
		counts[r.Group]++
	}
	for k := range 10 {
		g := "prefix-" + strconv.Itoa(k)
		if got := float64(counts[g]) / 20000; math.Abs(got-0.1) > 0.01 {
			t.Errorf("uniform popularity: %s drawn %.4f of the time, want 0.1000", g, got)
		}
	}
	if _, err := Prefixes(PrefixesConfig{Uniform: true, ZipfS: 1.1}); err == nil {
		t.Error("Uniform with a Zipf exponent: no error")
	}
	// The zero value keeps the documented default exponent.
	d, _ := Prefixes(PrefixesConfig{Requests: 20000, Prefixes: 10, QPS: 50, Seed: 1})
	n := 0
	for _, r := range d.Requests {
		if r.Group == "prefix-0" {
			n++
		}
	}
	// Zipf 1.1 over 10: P(rank 1) = 1/sum(k^-1.1) = 0.3731.
	if got := float64(n) / 20000; math.Abs(got-0.3731) > 0.02 {
		t.Errorf("default exponent: prefix-0 drawn %.4f of the time, want 0.3731", got)
	}
}

func TestTenantsRamp(t *testing.T) {
	c := TenantsConfig{Requests: 30000, Seed: 2}
	w, err := Tenants(c)
	if err != nil {
		t.Fatal(err)
	}
	// Ramp 3 -> 60 QPS over 2*30000/63 = 952 s. Count arrivals in the first
	// and last 100 s of the ramp; expected from the linear rate.
	T := 2 * 30000 / 63.0
	count := func(lo, hi float64) int {
		n := 0
		for _, r := range w.Requests {
			if s := r.Arrival.Seconds(); s >= lo && s < hi {
				n++
			}
		}
		return n
	}
	for _, iv := range [][2]float64{{0, 100}, {T - 100, T}} {
		want := 100 * (qpsAt(c, iv[0]) + qpsAt(c, iv[1])) / 2
		if got := float64(count(iv[0], iv[1])); math.Abs(got-want) > 4*math.Sqrt(want) {
			t.Errorf("arrivals in [%.0f, %.0f) s: %v, want %.0f", iv[0], iv[1], got, want)
		}
	}
	// 150 tenants x 5 users: 750 distinct prompts, 6,000 + 1,200 tokens.
	distinct := map[[2]uint64]bool{}
	for _, r := range w.Requests {
		if r.PromptLen != 7200 {
			t.Fatalf("prompt of %d tokens", r.PromptLen)
		}
		distinct[[2]uint64{r.Prompt[0].ID, r.Prompt[1].ID}] = true
	}
	if len(distinct) != 750 {
		t.Errorf("%d distinct prompts, want 750", len(distinct))
	}
}

func TestScaleAndHead(t *testing.T) {
	w, _ := Prefixes(PrefixesConfig{Requests: 10, Seed: 1})
	s := w.Scale(2)
	if s.Requests[9].Arrival != w.Requests[9].Arrival/2 || w.Head(3).Requests[2].ID != 2 || len(w.Head(3).Requests) != 3 {
		t.Fatal("Scale or Head")
	}
	st := w.Stats()
	if st.Requests != 10 || st.PromptTokens != 10*(2048+256) || st.OutputTokens != 1280 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPause(t *testing.T) {
	w, _ := Prefixes(PrefixesConfig{Requests: 5, Seed: 1})
	p := w.Pause(1, 10*time.Second)
	if p.Requests[0].Arrival != w.Requests[0].Arrival {
		t.Errorf("request 0 moved: %v, was %v", p.Requests[0].Arrival, w.Requests[0].Arrival)
	}
	for i := 1; i < 5; i++ {
		if p.Requests[i].Arrival != w.Requests[i].Arrival+10*time.Second {
			t.Errorf("request %d at %v, want %v", i, p.Requests[i].Arrival, w.Requests[i].Arrival+10*time.Second)
		}
	}
	if err := p.Validate(); err != nil {
		t.Error(err)
	}
	if w.Requests[1].Arrival == p.Requests[1].Arrival {
		t.Error("Pause changed the original")
	}
}

// qpsAt returns the tenants ramp's arrival rate at t seconds.
func qpsAt(c TenantsConfig, t float64) float64 {
	setDefaults(&c)
	r := newRamp(c.StartQPS, c.EndQPS, float64(c.Requests))
	if t >= r.T {
		return r.r1
	}
	return r.r0 + 2*r.a*t
}
