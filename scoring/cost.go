package scoring

import (
	"fmt"
	"math"
	"time"
)

// CostModel is GuardTTFT's model of how long a vLLM engine takes for a
// step, one for all engines of a model; Calibrate fits it from metrics. A
// step that prefills p tokens, attending over a (new token, context token)
// pairs (a chunk of n tokens after k computed ones: n*k + n*(n+1)/2),
// while d requests decode with c tokens of context in all, takes
//
//	StepOverhead + p / PrefillTokensPerSec + a / AttentionPairsPerSec
//	    + d * DecodePerSeq + c * DecodePerContextToken
//
// and holds at most MaxBatchedTokens tokens (a decoding request takes one).
// An engine runs at most MaxNumSeqs requests; a request finding it full
// waits for running ones to finish (GuardTTFT's slot wait).
type CostModel struct {
	PrefillTokensPerSec   float64       // the engine's prefill rate, attention aside.
	AttentionPairsPerSec  float64       // the prefill attention rate; 0: no attention term.
	StepOverhead          time.Duration // the fixed cost of a forward pass.
	DecodePerSeq          time.Duration // the cost of each decoding request in a step.
	DecodePerContextToken time.Duration // the cost of reading one context token of a decoding request.
	MaxBatchedTokens      int           // vLLM's max_num_batched_tokens.
	// MaxNumSeqs is vLLM's max_num_seqs, the requests an engine runs at
	// once; 0 turns off the slot wait.
	MaxNumSeqs int
	// KVCapacityTokens is one engine's KV cache in tokens; 0 when unknown,
	// which turns off the pressure and evict terms and estimates decoding
	// context from the average prompt instead of KV usage.
	KVCapacityTokens int
}

// DefaultCostModel describes Llama-3.1-8B (bf16) on one H100 80GB, the
// engine kvsim simulates (derivations in testbed/sim/engine's package doc),
// with vLLM's scheduler defaults for the OpenAI server on a GPU of 70 GiB
// or more (vllm/engine/arg_utils.py, get_batch_defaults): 8,192 batched
// tokens, 1,024 requests. kvsim's engines run 256 (the default below
// 70 GiB) and its pipeline says so.
func DefaultCostModel() CostModel {
	return CostModel{
		PrefillTokensPerSec:   17500,
		AttentionPairsPerSec:  9.4e8,
		StepOverhead:          6 * time.Millisecond,
		DecodePerSeq:          100 * time.Microsecond,
		DecodePerContextToken: 39 * time.Nanosecond,
		MaxBatchedTokens:      8192,
		MaxNumSeqs:            1024,
		KVCapacityTokens:      400000,
	}
}

// Validate reports a parameter out of range, naming it.
func (m *CostModel) Validate() error {
	switch {
	case !(m.PrefillTokensPerSec > 0) || math.IsInf(m.PrefillTokensPerSec, 0):
		return fmt.Errorf("cost model: prefill_tokens_per_sec %v must be a positive finite number", m.PrefillTokensPerSec)
	case m.AttentionPairsPerSec < 0 || math.IsNaN(m.AttentionPairsPerSec) || math.IsInf(m.AttentionPairsPerSec, 0):
		return fmt.Errorf("cost model: attention_pairs_per_sec %v must be a finite number >= 0", m.AttentionPairsPerSec)
	case m.StepOverhead < 0, m.DecodePerSeq < 0, m.DecodePerContextToken < 0:
		return fmt.Errorf("cost model: negative step cost (overhead %v, per decoding request %v, per context token %v)", m.StepOverhead, m.DecodePerSeq, m.DecodePerContextToken)
	case m.MaxBatchedTokens <= 0:
		return fmt.Errorf("cost model: max_batched_tokens %d must be positive", m.MaxBatchedTokens)
	case m.MaxNumSeqs < 0:
		return fmt.Errorf("cost model: max_num_seqs %d is negative", m.MaxNumSeqs)
	case m.KVCapacityTokens < 0:
		return fmt.Errorf("cost model: kv_capacity_tokens %d is negative", m.KVCapacityTokens)
	}
	return nil
}

// Calibration is what vLLM's metrics give over a window, from which
// Calibrate fits a CostModel.
type Calibration struct {
	// PrefillSeconds and PrefillTokens: the window's sums of
	// vllm:request_prefill_time_seconds and of the uncached prompt tokens
	// (vllm:prompt_tokens_total minus vllm:prefix_cache_hits_total).
	PrefillSeconds, PrefillTokens float64
	// PrefillPairs is the window's attention pairs (uncached x cached +
	// uncached^2 / 2 over requests), whose time at base's
	// AttentionPairsPerSec is taken out before the prefill rate is fitted;
	// 0 fits one linear rate.
	PrefillPairs float64
	// ITL are (running requests, mean inter-token latency) pairs over
	// decode-only windows; two or more distinct levels fit StepOverhead
	// and DecodePerSeq by least squares.
	ITL []ITLPoint
	// NumGPUBlocks and BlockSize are vllm:cache_config_info's labels.
	NumGPUBlocks, BlockSize int
}

// ITLPoint is one decode-only operating point: Running requests decoding
// and the mean seconds per step.
type ITLPoint struct {
	Running float64
	Seconds float64
}

// Calibrate returns base with the parameters c measures replaced (prefill
// rate, StepOverhead and DecodePerSeq, KV capacity). It fails, naming the
// input, when a measure is present but unusable.
func Calibrate(base CostModel, c Calibration) (CostModel, error) {
	m := base
	if c.PrefillSeconds > 0 || c.PrefillTokens > 0 {
		if !(c.PrefillSeconds > 0 && c.PrefillTokens > 0) {
			return m, fmt.Errorf("calibrate: prefill %v s over %v tokens: both must be positive", c.PrefillSeconds, c.PrefillTokens)
		}
		secs := c.PrefillSeconds
		if c.PrefillPairs > 0 && m.AttentionPairsPerSec > 0 {
			secs -= c.PrefillPairs / m.AttentionPairsPerSec
		}
		if secs <= 0 {
			return m, fmt.Errorf("calibrate: prefill %v s is all attention (%v pairs at %v pairs/s)", c.PrefillSeconds, c.PrefillPairs, m.AttentionPairsPerSec)
		}
		m.PrefillTokensPerSec = c.PrefillTokens / secs
	}
	if len(c.ITL) > 0 {
		var n, sx, sy, sxx, sxy float64
		for _, p := range c.ITL {
			n++
			sx += p.Running
			sy += p.Seconds
			sxx += p.Running * p.Running
			sxy += p.Running * p.Seconds
		}
		den := n*sxx - sx*sx
		if n < 2 || den == 0 {
			return m, fmt.Errorf("calibrate: inter-token latency at %d running level(s): need two distinct levels", len(c.ITL))
		}
		slope := (n*sxy - sx*sy) / den
		icept := (sy - slope*sx) / n
		if slope < 0 || icept < 0 {
			return m, fmt.Errorf("calibrate: inter-token latency fits %.3g s + %.3g s per request: a negative cost", icept, slope)
		}
		m.StepOverhead = time.Duration(math.Round(icept * float64(time.Second)))
		m.DecodePerSeq = time.Duration(math.Round(slope * float64(time.Second)))
	}
	if c.NumGPUBlocks > 0 {
		if c.BlockSize <= 0 {
			return m, fmt.Errorf("calibrate: %d GPU blocks of block size %d", c.NumGPUBlocks, c.BlockSize)
		}
		m.KVCapacityTokens = c.NumGPUBlocks * c.BlockSize
	}
	return m, m.Validate()
}

// Estimate is a candidate's estimated time to first token under a
// CostModel and its parts, in seconds: wait_w to relief_w of the package doc.
type Estimate struct {
	Wait     float64 // the queued prefill ahead and the decode steps it shares.
	Prefill  float64 // the request's own uncached prefill and its share of steps.
	Pressure float64 // the recompute of what the engine preempts to fit the request.
	Delay    float64 // what the prefill adds to the requests queueing behind it.
	Evict    float64 // the later recompute of the cached blocks the request evicts.
	Relief   float64 // what caching the prompt here saves later requests sharing it.
}

// TTFT is the estimated time to first token: Wait + Prefill + Pressure.
func (e *Estimate) TTFT() float64 { return e.Wait + e.Prefill + e.Pressure }

// Cost is what GuardTTFT minimises: TTFT + Delay + Evict - Relief.
func (e *Estimate) Cost() float64 { return e.TTFT() + e.Delay + e.Evict - e.Relief }

// evict fills e.Evict: the request's tokens that do not fit beside what
// the worker holds (its pool blocks, every group's, plus KV in use) evict cached blocks,
// which later requests hit at about the fleet's hit rate h and recompute:
// evicted x h / rate. Zero when the capacity is unknown.
func (m *costParams) evict(e *Estimate, l *Load, own float64, pr *Prompt) {
	e.Evict = 0
	if m.kv <= 0 || pr.AvgPromptTokens <= 0 || pr.AvgUncachedTokens <= 0 {
		return
	}
	h := 1 - pr.AvgUncachedTokens/pr.AvgPromptTokens
	if h <= 0 {
		return
	}
	occupied := math.Min(m.kv, float64(l.ResidentBlocks)*float64(pr.BlockSize)+l.KVUsage*m.kv)
	if evicted := occupied + own - m.kv; evicted > 0 {
		e.Evict = math.Min(evicted, own) * math.Min(h, 1) / m.rate
	}
}

// costParams is a CostModel in float64 seconds and tokens.
type costParams struct {
	rate, attn, overhead, perSeq, perCtx, budget, kv, seqs float64
}

// params converts m, or DefaultCostModel when m has no prefill rate or
// step budget.
func (m *CostModel) params() costParams {
	c := *m
	if !(c.PrefillTokensPerSec > 0) || c.MaxBatchedTokens <= 0 {
		c = DefaultCostModel()
	}
	return costParams{
		rate: c.PrefillTokensPerSec, attn: c.AttentionPairsPerSec, overhead: c.StepOverhead.Seconds(), perSeq: c.DecodePerSeq.Seconds(),
		perCtx: c.DecodePerContextToken.Seconds(), budget: float64(c.MaxBatchedTokens), kv: float64(c.KVCapacityTokens),
		seqs: float64(c.MaxNumSeqs),
	}
}

// rho is the fleet's prefill utilisation per worker, at most 0.95.
func (m *costParams) rho(pr *Prompt) float64 {
	if pr.ArrivalRate <= 0 || pr.Workers <= 0 {
		return 0
	}
	return math.Min(pr.ArrivalRate/float64(pr.Workers)*pr.AvgUncachedTokens/m.rate, 0.95)
}

// slotWait is how long a request waits for a place in a full engine: the
// requests it finds beyond MaxNumSeqs - 1 each wait for one to finish, and
// an engine finishes requests as fast as they reach it in steady state (a
// / workers each second). The requests are what the engine reports or
// what kvindex routed there, whichever is larger. Zero without
// MaxNumSeqs or an arrival rate. Cost: a few floating-point operations.
func (m *costParams) slotWait(l *Load, pr *Prompt) float64 {
	if m.seqs <= 0 || pr.ArrivalRate <= 0 || pr.Workers <= 0 {
		return 0
	}
	ahead := float64(busy(l)) + 1 - m.seqs
	if ahead <= 0 {
		return 0
	}
	return ahead * float64(pr.Workers) / pr.ArrivalRate
}

// estimateAt fills e for a worker with load l, queue tokens of prefill
// ahead and own uncached tokens after cached ones, with arrivals requests
// per second reaching the worker after this one (0: no Delay term); the
// formula is in the package documentation. Queued tokens, whose prompts
// are unknown, attend over half the average prompt each. The queue ahead
// is not counted against free KV (it is admitted as running requests
// finish: counting it pushed every request off any worker with a queue).
// rho stays the fleet's: a hot prefix's holder gets its requests mostly
// cached. Cost: a few dozen floating-point operations.
func (m *costParams) estimateAt(e *Estimate, l *Load, queue, own, cached float64, pr *Prompt, arrivals float64) {
	rate := m.rate
	running := float64(l.Running)
	var ctx float64
	if m.kv > 0 && l.KVUsage > 0 {
		ctx = l.KVUsage * m.kv
	} else {
		ctx = running * pr.AvgPromptTokens
	}
	step := m.overhead + running*m.perSeq + ctx*m.perCtx
	// Decoding requests take a token each of a step; prefill keeps an eighth.
	budget := m.budget
	perStep := math.Max(budget-running, budget/8)
	own = math.Max(own, 1) // vLLM computes at least one token
	stepsQueue := math.Ceil(queue / perStep)
	stepsAll := math.Ceil((queue + own) / perStep)
	e.Wait = stepsQueue*step + queue/rate + m.slotWait(l, pr)
	e.Prefill = (stepsAll-stepsQueue)*step + own/rate
	if m.attn > 0 {
		e.Wait += queue * pr.AvgPromptTokens / 2 / m.attn
		e.Prefill += (own*cached + own*own/2) / m.attn
	}
	e.Pressure = 0
	if m.kv > 0 {
		free := (1 - math.Min(l.KVUsage, 1)) * m.kv
		if deficit := own - free; deficit > 0 {
			e.Pressure = deficit / rate
		}
	}
	e.Delay = 0
	if arrivals > 0 {
		e.Delay = e.Prefill * arrivals * (e.Wait + e.Prefill) / (1 - m.rho(pr))
	}
}
