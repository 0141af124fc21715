package metrics

import (
	"math"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	s := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]time.Duration{50: 5, 90: 9, 99: 10, 100: 10, 10: 1, 0: 1, 15: 2} {
		if got := Percentile(s, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty")
	}
}

func TestSkew(t *testing.T) {
	if got := Skew([]float64{1, 1, 1, 1}); got != 1 {
		t.Errorf("even: %v", got)
	}
	if got := Skew([]float64{4, 0, 0, 0}); got != 4 {
		t.Errorf("all on one of four: %v", got)
	}
	if got := Skew([]float64{3, 1}); got != 1.5 {
		t.Errorf("3,1: %v", got)
	}
	if Skew([]float64{0, 0}) != 0 || Skew(nil) != 0 {
		t.Error("zero")
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(2)
	s := time.Second
	// Three requests: two hit (100 and 0 of 400 and 200 tokens), one rejected.
	r.Arrived(0, 1*s)
	r.Arrived(1, 2*s)
	r.Arrived(2, 3*s)
	r.Routed(0)
	r.Routed(1)
	r.Rejected(2)
	r.FirstToken(0, 1500*time.Millisecond, 400, 100)
	r.FirstToken(1, 4*s, 200, 0)
	r.Finished(0, 3*s, 10)
	r.Finished(1, 11*s, 30)
	res := r.Result("x", []int64{300, 100}, 1)
	if res.Requests != 3 || res.Scheduled != 2 || res.Completed != 2 || res.Rejected != 1 {
		t.Fatalf("counts %+v", res)
	}
	if got := res.TokenHitRate(); math.Abs(got-100.0/600) > 1e-12 {
		t.Errorf("token hit rate %v", got)
	}
	if res.RequestHitRate() != 0.5 {
		t.Errorf("request hit rate %v", res.RequestHitRate())
	}
	if res.TTFTP50 != 500*time.Millisecond || res.TTFTP99 != 2*s || res.TTFTMean != 1250*time.Millisecond {
		t.Errorf("ttft p50 %v p99 %v mean %v", res.TTFTP50, res.TTFTP99, res.TTFTMean)
	}
	// Makespan 1 s .. 11 s: 2 requests and 40 tokens in 10 s.
	if res.Makespan != 10*s || res.Throughput != 0.2 || res.OutputTokensPerSec != 4 {
		t.Errorf("makespan %v throughput %v tok/s %v", res.Makespan, res.Throughput, res.OutputTokensPerSec)
	}
	if res.PrefillTokens != 400 || res.LoadSkew != 1.5 || res.RequestSkew != 1 || res.Preemptions != 1 {
		t.Errorf("prefill %d skew %v req skew %v", res.PrefillTokens, res.LoadSkew, res.RequestSkew)
	}
}

// TestRecorderEstimateError: estimated TTFTs against the TTFTs: 1 s vs
// 1 s (exact), 0.5 s vs 1 s (0.5 s under), 2 s vs 3 s (1 s under, more
// than 25%); request 3 is rejected and request 4 has no estimate: neither
// counts. The two estimated at a second or more took 4 s for 3 s.
func TestRecorderEstimateError(t *testing.T) {
	r := NewRecorder(1)
	est := []time.Duration{time.Second, time.Second / 2, 2 * time.Second, time.Second}
	for id, e := range est {
		r.Arrived(id, time.Second)
		r.Estimated(id, e)
	}
	r.Arrived(4, 0)
	r.Rejected(3)
	for id, ttft := range []time.Duration{time.Second, time.Second, 3 * time.Second} {
		r.FirstToken(id, time.Second+ttft, 256, 0)
	}
	r.FirstToken(4, time.Second, 256, 0)
	res := r.Result("x", nil, 0)
	if res.Estimated != 3 || res.EstWithin != 1 || res.EstLong != 2 {
		t.Fatalf("estimated %d, within 25%% %d, at a second or more %d", res.Estimated, res.EstWithin, res.EstLong)
	}
	if res.EstMean() != 3500*time.Millisecond/3 || res.EstRealMean() != 5*time.Second/3 || res.EstMAE() != 500*time.Millisecond {
		t.Errorf("mean estimate %v, mean TTFT %v, error %v", res.EstMean(), res.EstRealMean(), res.EstMAE())
	}
	if math.Abs(res.EstWithinShare()-1.0/3) > 1e-12 || math.Abs(res.EstLongRatio()-4.0/3) > 1e-12 {
		t.Errorf("within share %v, long ratio %v", res.EstWithinShare(), res.EstLongRatio())
	}
	if z := (&Result{}); z.EstMean() != 0 || z.EstLongRatio() != 0 {
		t.Error("no estimates, yet a mean")
	}
}

func TestRecorderPredictionError(t *testing.T) {
	r := NewRecorder(1)
	// Predicted hits against the engine's: 64 vs 64 (exact), 128 vs 32
	// (over by 96), 0 vs 48 (under by 48); request 3 is rejected and
	// request 4 has no prediction: neither counts. When routed the engines
	// held 64 (no change), 128 (kvindex was right then; 96 evicted while
	// queued) and 16 (kvindex 16 short; 32 more stored while queued).
	atRoute := []int{64, 128, 16, 16}
	for id, p := range []int{64, 128, 0, 16} {
		r.Arrived(id, 0)
		r.Predicted(id, p, atRoute[id])
	}
	r.Arrived(4, 0)
	r.Rejected(3)
	for id, hit := range []int{64, 32, 48} {
		r.FirstToken(id, time.Second, 256, hit)
	}
	r.FirstToken(4, time.Second, 256, 16)
	res := r.Result("x", nil, 0)
	if res.Predicted != 3 || res.PredictExact != 1 || res.PredictOver != 1 || res.PredictAbsErr != 144 {
		t.Fatalf("predicted %d, exact %d, over %d, error %d tokens", res.Predicted, res.PredictExact, res.PredictOver, res.PredictAbsErr)
	}
	if res.PredictMAE() != 48 || math.Abs(res.PredictExactShare()-1.0/3) > 1e-12 || math.Abs(res.PredictOverShare()-1.0/3) > 1e-12 {
		t.Errorf("MAE %v, exact %v, over %v", res.PredictMAE(), res.PredictExactShare(), res.PredictOverShare())
	}
	if res.PredictRouteErr != 16 || res.PredictQueueErr != 128 || res.PredictLost != 1 || res.PredictQueueMAE() != 128.0/3 {
		t.Errorf("parts: when routed %d, while queued %d tokens, %d lost blocks", res.PredictRouteErr, res.PredictQueueErr, res.PredictLost)
	}
	if (&Result{}).PredictMAE() != 0 {
		t.Error("no predictions, yet an error")
	}
}
