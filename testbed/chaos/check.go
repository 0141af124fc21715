package chaos

import (
	"fmt"
	"math"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/soak"
)

// lagWindow is how long after an answer the checker looks for a lag that
// explains it: the removal the answer had not applied yet is observed in
// the replica's kvindex_event_lag_seconds when it is applied.
const lagWindow = 15 * time.Second

// checker judges every answer against the engines' truth (invariant a):
// no answer credits a worker with a block its engine did not hold when
// the request was sent, beyond the measured event lag, unless the answer
// flags the worker (STALE, UNSYNCED, RECOVERING) or the block is
// speculative. A credit of a block dropped longer ago than Bounds.Detect
// waits (pending) until the replica's lag histogram says whether it
// applied deltas that late around then.
//
// # Concurrency
//
// mu guards every field; the engines are asked without it.
type checker struct {
	r *run

	mu      sync.Mutex
	counts  map[string]int64
	maxAge  time.Duration // the stalest credit accepted (within Detect or lag)
	maxLag  float64       // the largest lag bucket seen, seconds
	pending []pendingCredit
	lags    [][]lagSample // by replica
	prev    []histogram   // by replica: the last scrape's lag buckets
}

// pendingCredit is a credit older than Bounds.Detect, waiting for the
// replica's measured lag.
type pendingCredit struct {
	replica int
	recv    time.Time
	age     time.Duration
	what    string
	faults  string
}

// lagSample is the largest lag (a bucket's upper bound, seconds; +Inf
// past the last) a replica observed between two scrapes, at the second.
type lagSample struct {
	at time.Time
	ub float64
}

// histogram is one scrape of a process instance's histogram: per-bucket
// (not cumulative) counts, the last for +Inf.
type histogram struct {
	instance int
	bounds   []float64
	counts   []uint64
}

func newChecker(r *run) *checker {
	n := r.lay.Replicas
	return &checker{r: r, counts: map[string]int64{}, lags: make([][]lagSample, len(n)), prev: make([]histogram, len(n))}
}

func (c *checker) add(name string, n int64) {
	c.mu.Lock()
	c.counts[name] += n
	c.mu.Unlock()
}

// flagged says whether an answer's health for a worker excuses a stale
// credit.
func flagged(h kvindexv1.WorkerHealth) bool {
	switch h {
	case kvindexv1.WorkerHealth_WORKER_HEALTH_STALE, kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED, kvindexv1.WorkerHealth_WORKER_HEALTH_RECOVERING:
		return true
	}
	return false
}

// answer checks one answer of replica j to a prompt of tokens sent at
// sent and received at recv.
func (c *checker) answer(j int, what string, tokens []uint32, sent, recv time.Time, resp *kvindexv1.ScoreResponse) {
	hashes := soak.BlockHashes(HashSeed(Model), BlockSize, tokens, nil)
	c.add("answers", 1)
	if int(resp.GetPromptBlocks()) != len(hashes) {
		c.r.violate("a", "insane_answer", "%s from %s: prompt_blocks %d for a prompt of %d full blocks", what, ReplicaName(j), resp.GetPromptBlocks(), len(hashes))
	}
	for _, w := range resp.GetWorkers() {
		i := c.r.podIndex(w.GetWorker().GetPod())
		m, spec := int(w.GetMatchedBlocks()), int(w.GetSpeculativeBlocks())
		switch {
		case i < 0 || w.GetWorker().GetDpRank() != 0:
			c.r.violate("a", "unknown_worker", "%s from %s names worker %s/%d, which the fleet does not have", what, ReplicaName(j), w.GetWorker().GetPod(), w.GetWorker().GetDpRank())
			continue
		case m > len(hashes) || spec > m:
			c.r.violate("a", "insane_answer", "%s from %s: %s matched %d blocks (%d speculative) of a %d-block prompt", what, ReplicaName(j), PodName(i), m, spec, len(hashes))
			continue
		}
		credited := m - spec
		if credited == 0 {
			continue
		}
		c.add("credits", 1)
		c.add("credited_blocks", int64(credited))
		age, block, never := c.r.engines[i].Staleness(hashes[:credited], sent)
		health := w.GetHealth()
		detail := func() string {
			held := fmt.Sprintf("dropped by its engine %v before the request was sent", age.Round(time.Millisecond))
			if never {
				held = "never held by its engine"
			}
			return fmt.Sprintf("%s answered by %s %v after it was sent: %s credited with %d blocks (%d more speculative), health %s; block %d %s",
				what, ReplicaName(j), recv.Sub(sent).Round(time.Millisecond), PodName(i), credited, spec, health, block, held)
		}
		switch {
		case age == 0:
			c.add("credits_held", 1)
		case flagged(health):
			c.add("credits_flagged", 1)
		case never:
			c.r.violateAt("a", "wrong_answer", recv, "%s", detail())
		case age <= c.r.bounds.Detect:
			c.add("credits_within_detect", 1)
			c.accept(age)
		default:
			p := pendingCredit{replica: j, recv: recv, age: age, what: detail(), faults: c.r.activeFaults()}
			c.mu.Lock()
			c.pending = append(c.pending, p)
			c.mu.Unlock()
		}
	}
}

func (c *checker) accept(age time.Duration) {
	c.mu.Lock()
	c.maxAge = max(c.maxAge, age)
	c.mu.Unlock()
}

// observeLag records replica j's lag histogram (kvindex_event_lag_seconds
// of source nats) as its process instance reported it at now.
func (c *checker) observeLag(j, instance int, fam *dto.MetricFamily, now time.Time) {
	h := histogram{instance: instance}
	for _, m := range fam.GetMetric() {
		src := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "source" {
				src = l.GetValue()
			}
		}
		if src != "nats" {
			continue
		}
		var below uint64
		for _, b := range m.GetHistogram().GetBucket() {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.counts = append(h.counts, b.GetCumulativeCount()-below)
			below = b.GetCumulativeCount()
		}
		h.bounds = append(h.bounds, math.Inf(1))
		h.counts = append(h.counts, m.GetHistogram().GetSampleCount()-below)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.prev[j]
	c.prev[j] = h
	if prev.instance != instance || len(prev.counts) != len(h.counts) {
		prev.counts = make([]uint64, len(h.counts)) // a new process counts from 0
	}
	ub := 0.0
	for k := range h.counts {
		if h.counts[k] > prev.counts[k] {
			ub = h.bounds[k]
		}
	}
	if ub > 0 {
		c.lags[j] = append(c.lags[j], lagSample{now, ub})
		c.maxLag = max(c.maxLag, ub)
	}
}

// resolve settles the pending credits whose lag window has passed at now
// (all of them when final): within the replica's measured lag, or a
// violation.
func (c *checker) resolve(now time.Time, final bool) {
	c.mu.Lock()
	var keep, bad []pendingCredit
	for _, p := range c.pending {
		lag := 0.0
		for _, s := range c.lags[p.replica] {
			if s.at.After(p.recv) && !s.at.After(p.recv.Add(lagWindow)) {
				lag = max(lag, s.ub)
			}
		}
		switch {
		case lag >= p.age.Seconds():
			c.counts["credits_within_lag"]++
			c.maxAge = max(c.maxAge, p.age)
		case final || now.After(p.recv.Add(lagWindow)):
			p.what += fmt.Sprintf("; beyond the detection bound %v and %s's measured lag (at most %gs within %v of the answer); faults then: %s",
				c.r.bounds.Detect, ReplicaName(p.replica), lag, lagWindow, p.faults)
			bad = append(bad, p)
		default:
			keep = append(keep, p)
		}
	}
	c.pending = keep
	c.mu.Unlock()
	for _, p := range bad {
		c.r.violateAt("a", "wrong_answer", p.recv, "%s", p.what)
	}
}

// snapshot returns the checker's counts with the stalest accepted credit
// (ms) and the largest measured lag bucket (ms).
func (c *checker) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{"max_accepted_staleness_ms": c.maxAge.Milliseconds()}
	for k, v := range c.counts {
		out[k] = v
	}
	if !math.IsInf(c.maxLag, 1) {
		out["max_measured_lag_bucket_ms"] = int64(c.maxLag * 1000)
	} else {
		out["max_measured_lag_bucket_ms"] = -1
	}
	return out
}
