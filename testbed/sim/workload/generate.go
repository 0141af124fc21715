package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"strconv"
	"time"
)

// Tags that keep the generators' content ids apart.
const (
	prefixTag  = 0x7072656669780000 // "prefix"
	suffixTag  = 0x7375666669780000 // "suffix"
	contextTag = 0x636f6e7465787400 // "context"
	queryTag   = 0x7175657279000000 // "query"
)

// PrefixesConfig describes the shared-prefix generator: each request is
// one of Prefixes shared prefixes (prefix k of weight 1/(k+1)^ZipfS) then
// a unique suffix; arrivals are Poisson at QPS. Zero fields take their
// `default` tags.
type PrefixesConfig struct {
	Requests     int     `default:"2000"`
	Prefixes     int     `default:"40"`
	PrefixTokens int     `default:"2048"`
	SuffixTokens int     `default:"256"`
	OutputTokens int     `default:"128"`
	ZipfS        float64 // DefaultZipfS when 0, unless Uniform
	Uniform      bool    // equal popularity: ZipfS must be 0
	QPS          float64 `default:"20"`
	Engines      int     `default:"4"`
	Seed         uint64
}

// DefaultZipfS is the generators' default popularity exponent (the
// other generators' ZipfS tags repeat it).
const DefaultZipfS = 1.1

// Prefixes generates the shared-prefix workload.
func Prefixes(c PrefixesConfig) (*Workload, error) {
	if c.Uniform && c.ZipfS != 0 {
		return nil, fmt.Errorf("workload: prefixes: uniform popularity with Zipf exponent %v", c.ZipfS)
	}
	setDefaults(&c)
	if c.ZipfS == 0 && !c.Uniform {
		c.ZipfS = DefaultZipfS
	}
	if c.Requests < 0 || c.Prefixes <= 0 || c.PrefixTokens <= 0 || c.SuffixTokens < 0 || c.OutputTokens <= 0 || c.QPS <= 0 || c.ZipfS < 0 {
		return nil, fmt.Errorf("workload: prefixes: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, prefixTag))
	cdf := ZipfCDF(c.Prefixes, c.ZipfS)
	w := &Workload{Name: "prefixes", Engines: c.Engines, Requests: make([]Request, c.Requests)}
	var t float64
	for i := range w.Requests {
		t += rng.ExpFloat64() / c.QPS
		k := cdf.Pick(rng)
		segs := []Segment{{ID: Mix64(prefixTag ^ c.Seed ^ uint64(k)), Len: c.PrefixTokens}}
		if c.SuffixTokens > 0 {
			segs = append(segs, Segment{ID: Mix64(suffixTag ^ c.Seed ^ uint64(i)<<8), Len: c.SuffixTokens})
		}
		w.Requests[i] = newRequest(i, t, segs, c.OutputTokens, "prefix-"+strconv.Itoa(k))
	}
	return w, nil
}

// Zipf is the cumulative distribution of n ranks with weights 1/(k+1)^s.
type Zipf []float64

// ZipfCDF returns the distribution of n ranks with exponent s.
func ZipfCDF(n int, s float64) Zipf {
	cdf := make(Zipf, n)
	var sum float64
	for k := range cdf {
		sum += 1 / math.Pow(float64(k+1), s)
		cdf[k] = sum
	}
	for k := range cdf {
		cdf[k] /= sum
	}
	return cdf
}

// TenantsConfig describes the multi-tenant generator (inference-perf's
// shared_prefix shape): a prompt is one of Tenants tenants' contexts then
// one of its UsersPerTenant users' fixed question, both uniform. Arrivals
// are Poisson at a rate ramping linearly from StartQPS to EndQPS over
// 2*Requests/(StartQPS+EndQPS) seconds (Requests arrive over it on
// average). Zero fields take their `default` tags.
type TenantsConfig struct {
	Requests       int     `default:"6000"`
	Tenants        int     `default:"150"`
	ContextTokens  int     `default:"6000"`
	UsersPerTenant int     `default:"5"`
	QueryTokens    int     `default:"1200"`
	OutputTokens   int     `default:"256"`
	StartQPS       float64 `default:"3"`
	EndQPS         float64 `default:"60"`
	Engines        int     `default:"8"`
	Seed           uint64
}

// Tenants generates the multi-tenant workload.
func Tenants(c TenantsConfig) (*Workload, error) {
	setDefaults(&c)
	if c.Requests < 0 || c.Tenants <= 0 || c.ContextTokens <= 0 || c.UsersPerTenant <= 0 || c.QueryTokens < 0 || c.OutputTokens <= 0 || c.StartQPS <= 0 || c.EndQPS <= 0 {
		return nil, fmt.Errorf("workload: tenants: invalid parameters %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, contextTag))
	ramp := newRamp(c.StartQPS, c.EndQPS, float64(c.Requests))
	w := &Workload{Name: "tenants", Engines: c.Engines, Requests: make([]Request, c.Requests)}
	var lambda float64
	for i := range w.Requests {
		lambda += rng.ExpFloat64()
		tenant := rng.IntN(c.Tenants)
		user := rng.IntN(c.UsersPerTenant)
		segs := []Segment{{ID: Mix64(contextTag ^ c.Seed ^ uint64(tenant)), Len: c.ContextTokens}}
		if c.QueryTokens > 0 {
			segs = append(segs, Segment{ID: Mix64(queryTag ^ c.Seed ^ uint64(tenant)<<20 ^ uint64(user)), Len: c.QueryTokens})
		}
		w.Requests[i] = newRequest(i, ramp.at(lambda), segs, c.OutputTokens, "tenant-"+strconv.Itoa(tenant))
	}
	return w, nil
}

// ramp is a Poisson process whose rate grows linearly from r0 to r1 over
// [0, T] and stays at r1 after; at inverts its cumulative intensity.
type ramp struct{ r0, r1, T, a float64 }

func newRamp(r0, r1, n float64) ramp {
	T := 2 * n / (r0 + r1)
	return ramp{r0: r0, r1: r1, T: T, a: (r1 - r0) / (2 * T)}
}

// at returns the time t at which the cumulative intensity
// r0*t + a*t^2 reaches lambda.
func (r ramp) at(lambda float64) float64 {
	end := r.r0*r.T + r.a*r.T*r.T
	if lambda >= end {
		return r.T + (lambda-end)/r.r1
	}
	if math.Abs(r.a) < 1e-12 {
		return lambda / r.r0
	}
	return (-r.r0 + math.Sqrt(r.r0*r.r0+4*r.a*lambda)) / (2 * r.a)
}

// Pick draws a rank.
func (z Zipf) Pick(rng *rand.Rand) int { return z.At(rng.Float64()) }

// At maps u in [0, 1) to its rank.
func (z Zipf) At(u float64) int { return min(sort.SearchFloat64s(z, u), len(z)-1) }

// newRequest is request id arriving at `at` seconds with prompt segs.
func newRequest(id int, at float64, segs []Segment, outputLen int, group string) Request {
	r := Request{ID: id, Arrival: time.Duration(at * float64(time.Second)), Prompt: segs, OutputLen: outputLen, Group: group}
	for _, s := range segs {
		r.PromptLen += s.Len
	}
	return r
}

// setDefaults sets each zero field of the struct c points to to its
// `default` tag: an int, a float or a time.ParseDuration string.
func setDefaults(c any) {
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		f, tag := v.Field(i), v.Type().Field(i).Tag.Get("default")
		if tag == "" || !f.IsZero() {
			continue
		}
		var err error
		if d, ok := f.Addr().Interface().(*time.Duration); ok {
			*d, err = time.ParseDuration(tag)
		} else {
			_, err = fmt.Sscan(tag, f.Addr().Interface())
		}
		if err != nil {
			panic(fmt.Sprintf("workload: %s.%s: default %q: %v", v.Type().Name(), v.Type().Field(i).Name, tag, err))
		}
	}
}
