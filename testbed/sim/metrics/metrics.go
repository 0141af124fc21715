package metrics

import (
	"math"
	"slices"
	"time"
)

// Recorder collects one simulation's per-request outcomes.
type Recorder struct {
	firstAt, lastDone time.Duration
	started           bool
	ttft, routeDelay  []time.Duration
	routed            []int // requests per engine
	res               Result
	arrival           map[int]time.Duration
	predicted         map[int]prediction    // by request id, until its first token
	estimated         map[int]time.Duration // the router's estimated TTFT, by request id, until its first token
	outputDone        int64
}

// prediction is a request's predicted hit and the chosen engine's hit
// when it was routed, in tokens.
type prediction struct{ tokens, atRoute int }

// NewRecorder returns a recorder for a fleet of n engines.
func NewRecorder(n int) *Recorder {
	return &Recorder{routed: make([]int, n), arrival: make(map[int]time.Duration), predicted: make(map[int]prediction),
		estimated: make(map[int]time.Duration)}
}

// Estimated records a request's time to first token as its router
// estimated it, for FirstToken to compare with the TTFT.
func (r *Recorder) Estimated(id int, ttft time.Duration) { r.estimated[id] = max(ttft, 0) }

// Predicted records the prompt tokens a request's router predicted the
// chosen engine would hit and the tokens it held when the request was
// routed, for FirstToken to compare with the hit.
func (r *Recorder) Predicted(id, tokens, atRoute int) {
	r.predicted[id] = prediction{tokens, atRoute}
}

// Arrived records a request's arrival.
func (r *Recorder) Arrived(id int, at time.Duration) {
	if !r.started || at < r.firstAt {
		r.firstAt, r.started = at, true
	}
	r.arrival[id] = at
	r.res.Requests++
}

// Routed records that a request went to engine i.
func (r *Recorder) Routed(i int) { r.routed[i]++ }

// RouteDelay records how long the router took to answer one request, in
// virtual time (live mode, where it is charged to TTFT).
func (r *Recorder) RouteDelay(d time.Duration) { r.routeDelay = append(r.routeDelay, d) }

// Rejected records a request the engine refused (it could never fit).
func (r *Recorder) Rejected(id int) {
	r.res.Rejected++
	delete(r.arrival, id)
	delete(r.predicted, id)
	delete(r.estimated, id)
}

// FirstToken records a request's first token at t and the prompt tokens
// it hit when first scheduled.
func (r *Recorder) FirstToken(id int, t time.Duration, promptLen, cached int) {
	ttft := t - r.arrival[id]
	r.ttft = append(r.ttft, ttft)
	if est, ok := r.estimated[id]; ok {
		delete(r.estimated, id)
		r.res.Estimated++
		r.res.EstTTFTSum += est
		r.res.EstRealSum += ttft
		r.res.EstAbsErr += (est - ttft).Abs()
		if 4*(est-ttft).Abs() <= ttft {
			r.res.EstWithin++
		}
		if est >= EstLong {
			r.res.EstLong++
			r.res.EstLongSum += est
			r.res.EstLongRealSum += ttft
		}
	}
	r.res.PromptTokens += int64(promptLen)
	r.res.CachedTokens += int64(cached)
	if cached > 0 {
		r.res.HitRequests++
	}
	r.res.Scheduled++
	if pr, ok := r.predicted[id]; ok {
		delete(r.predicted, id)
		p, at := pr.tokens, pr.atRoute
		r.res.Predicted++
		switch {
		case p == cached:
			r.res.PredictExact++
		case p > cached:
			r.res.PredictOver++
		}
		r.res.PredictAbsErr += int64(abs(p - cached))
		r.res.PredictRouteErr += int64(abs(p - at))
		r.res.PredictQueueErr += int64(abs(at - cached))
		if at > cached {
			r.res.PredictLost++
		}
	}
}

// Finished records a request's completion at t.
func (r *Recorder) Finished(id int, t time.Duration, outputLen int) {
	r.res.Completed++
	r.outputDone += int64(outputLen)
	r.lastDone = max(r.lastDone, t)
	delete(r.arrival, id)
}

// Result reduces the record; prefill[i] is engine i's prefill tokens and
// preemptions the fleet's.
func (r *Recorder) Result(router string, prefill []int64, preemptions int) Result {
	res := r.res
	res.Router, res.Preemptions = router, preemptions
	slices.Sort(r.ttft)
	res.TTFT = r.ttft
	res.TTFTP50, res.TTFTP90, res.TTFTP99, res.TTFTMean = Summary(r.ttft)
	if r.started && r.lastDone > r.firstAt {
		res.Makespan = r.lastDone - r.firstAt
		res.Throughput = float64(res.Completed) / res.Makespan.Seconds()
		res.OutputTokensPerSec = float64(r.outputDone) / res.Makespan.Seconds()
	}
	pf := make([]float64, len(r.routed))
	rq := make([]float64, len(r.routed))
	for i := range r.routed {
		if i < len(prefill) {
			res.PrefillTokens += prefill[i]
			pf[i] = float64(prefill[i])
		}
		rq[i] = float64(r.routed[i])
	}
	res.LoadSkew, res.RequestSkew = Skew(pf), Skew(rq)
	slices.Sort(r.routeDelay)
	_, _, res.RouteDelayP99, res.RouteDelayMean = Summary(r.routeDelay)
	return res
}

// Result is one router's outcome on one workload (definitions in the
// package doc).
type Result struct {
	// Router is the router's name; Note what the report must say about it.
	Router, Note string
	// Requests arrived; Scheduled got their first step; Completed finished;
	// Rejected could never fit an engine.
	Requests, Scheduled, Completed, Rejected int
	// PromptTokens of scheduled requests, CachedTokens of them hit, and
	// PrefillTokens computed (recomputation included).
	PromptTokens, CachedTokens, PrefillTokens int64
	// HitRequests hit at least one block.
	HitRequests int
	// TTFT holds every time to first token, sorted; the rest summarise it.
	TTFT                                []time.Duration
	TTFTP50, TTFTP90, TTFTP99, TTFTMean time.Duration
	Makespan                            time.Duration
	Throughput, OutputTokensPerSec      float64
	LoadSkew, RequestSkew               float64
	Preemptions                         int
	// IndexProblems counts what kvindex could not apply exactly and the
	// KV-cache groups whose resident blocks differ from their engine's
	// cache (0 when the engines and the index agree); -1 when no index was
	// used. IndexDetail names them by kind, with the first difference.
	IndexProblems int64
	IndexDetail   string
	// Wall is how long the simulation took to run.
	Wall time.Duration
	// RouteDelayMean and RouteDelayP99 summarise the router's answer time
	// charged to TTFT (live mode; zero in virtual time).
	RouteDelayMean, RouteDelayP99 time.Duration
	// Predicted counts the scheduled requests whose router predicted their
	// hit (kvindex's match on the chosen engine, at most the prompt's full
	// blocks before its last token); PredictExact of them were exact,
	// PredictOver over the engine's hit, and PredictAbsErr sums
	// |predicted - hit| in tokens.
	Predicted, PredictExact, PredictOver int
	PredictAbsErr                        int64
	// The error's two parts: PredictRouteErr sums |predicted - the
	// engine's hit when the request was routed| (what kvindex had not yet
	// heard of: steps in progress, and Route's speculation), and
	// PredictQueueErr |that - the hit when scheduled| (the cache changing
	// while the request waited); PredictLost counts requests that lost
	// cached blocks (evicted) between the two.
	PredictRouteErr, PredictQueueErr int64
	PredictLost                      int
	// Estimated counts the scheduled requests whose router estimated
	// their TTFT (kvindex's estimate on the chosen engine); EstTTFTSum
	// sums the estimates, EstRealSum their TTFTs, EstAbsErr
	// |estimate - TTFT|, and EstWithin counts estimates within 25% of the
	// TTFT. EstLong counts the estimates of at least EstLong (a queue),
	// EstLongSum and EstLongRealSum their estimates and TTFTs.
	Estimated, EstWithin, EstLong                                 int
	EstTTFTSum, EstRealSum, EstAbsErr, EstLongSum, EstLongRealSum time.Duration
}

// EstLong is the estimate from which Result counts an estimate as a
// queue's (EstLong).
const EstLong = time.Second

// EstMean and EstRealMean are the mean estimated TTFT and the mean TTFT of
// the same requests; EstMAE the mean absolute error; EstWithinShare the
// share within 25% of the TTFT.
func (r *Result) EstMean() time.Duration { return durRatio(r.EstTTFTSum, r.Estimated) }

// EstRealMean: see EstMean.
func (r *Result) EstRealMean() time.Duration { return durRatio(r.EstRealSum, r.Estimated) }

// EstMAE: see EstMean.
func (r *Result) EstMAE() time.Duration { return durRatio(r.EstAbsErr, r.Estimated) }

// EstWithinShare: see EstMean.
func (r *Result) EstWithinShare() float64 { return ratio(float64(r.EstWithin), float64(r.Estimated)) }

// EstLongRatio is the TTFT of the requests estimated at EstLong or more
// over their estimate (1: calibrated; above 1: the queues took longer);
// 0 when there were none.
func (r *Result) EstLongRatio() float64 {
	return ratio(r.EstLongRealSum.Seconds(), r.EstLongSum.Seconds())
}

func durRatio(d time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// PredictMAE is the mean absolute error of the predicted hits, in tokens.
func (r *Result) PredictMAE() float64 { return ratio(float64(r.PredictAbsErr), float64(r.Predicted)) }

// PredictExactShare is the share of predictions that were exact.
func (r *Result) PredictExactShare() float64 {
	return ratio(float64(r.PredictExact), float64(r.Predicted))
}

// PredictRouteMAE and PredictQueueMAE are the mean absolute parts of the
// error (PredictRouteErr, PredictQueueErr), in tokens.
func (r *Result) PredictRouteMAE() float64 {
	return ratio(float64(r.PredictRouteErr), float64(r.Predicted))
}

// PredictQueueMAE is PredictQueueErr's mean (see PredictRouteMAE).
func (r *Result) PredictQueueMAE() float64 {
	return ratio(float64(r.PredictQueueErr), float64(r.Predicted))
}

// PredictOverShare is the share of predictions above the engine's hit.
func (r *Result) PredictOverShare() float64 {
	return ratio(float64(r.PredictOver), float64(r.Predicted))
}

// TokenHitRate is CachedTokens / PromptTokens (0 when nothing ran).
func (r *Result) TokenHitRate() float64 {
	return ratio(float64(r.CachedTokens), float64(r.PromptTokens))
}

// RequestHitRate is HitRequests / Scheduled.
func (r *Result) RequestHitRate() float64 { return ratio(float64(r.HitRequests), float64(r.Scheduled)) }

func abs(n int) int { return max(n, -n) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Percentile returns the nearest-rank p-th percentile of sorted values
// (0 when empty).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	k := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(k, 1), n)-1]
}

// Summary returns the nearest-rank 50th, 90th and 99th percentiles and
// the mean of sorted values (zeros when empty).
func Summary(sorted []time.Duration) (p50, p90, p99, mean time.Duration) {
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	if len(sorted) > 0 {
		mean = sum / time.Duration(len(sorted))
	}
	return Percentile(sorted, 50), Percentile(sorted, 90), Percentile(sorted, 99), mean
}

// Skew returns max/mean of xs (1 for all equal; 0 when the mean is 0).
func Skew(xs []float64) float64 {
	var sum, top float64
	for _, x := range xs {
		sum += x
		top = max(top, x)
	}
	if sum == 0 {
		return 0
	}
	return top / (sum / float64(len(xs)))
}
