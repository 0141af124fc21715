package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// EngineSpec is one simulated engine: one worker (a pod's DP rank), the
// model it serves, where it publishes (binding in pull mode, connecting
// with Push) and how (enginepub.PublisherConfig), and its cache's
// physical blocks.
type EngineSpec struct {
	Worker         events.WorkerRef
	Model          string
	Endpoint       string
	Push           bool
	Topic          string
	ReplayEndpoint string
	ReplayFrames   int
	Encoding       events.EncodeOptions
	Capacity       int
}

// EngineOptions tune how every engine behaves: its replay buffer (vLLM's
// buffer_steps), 1..RequestsPerStep requests a step, the probability that
// a step starts a loss of 1..3 messages (kept for replay, never sent) or
// is an AllBlocksCleared, and the fraction of evictions out of LRU order.
type EngineOptions struct {
	BufferSteps         int
	RequestsPerStep     int
	LossRate, ClearRate float64
	// ClearEvery, below BufferSteps, forces a clear after this many
	// messages without one, so that the replay buffer always reaches back
	// to the last clear (or the engine's start) and a daemon that joins
	// learns the cache exactly.
	ClearEvery  int
	RandomEvict float64
	Workload    WorkloadOptions
}

// DefaultEngineOptions are the soak's: vLLM's 10,000-step buffer, a loss
// in one step of 200, a clear in one of 2,000 and at least every 8,000.
func DefaultEngineOptions() EngineOptions {
	return EngineOptions{BufferSteps: 10_000, RequestsPerStep: 2, LossRate: 0.005, ClearRate: 0.0005, ClearEvery: 8_000, RandomEvict: 0.02, Workload: DefaultWorkloadOptions()}
}

// EngineStats count what an engine did, over all its processes: messages
// published (sent or lost) and lost, KV events and the blocks stored and
// removed in them, AllBlocksCleared sent, restarts and requests.
type EngineStats struct {
	Steps, Lost             int64
	Events, Stored, Removed int64
	Clears, Restarts        int64
	Requests                int64
}

// Engine is a simulated vLLM engine: a publisher with a replay buffer and
// the true cache its requests leave, one process at a time (Restart
// starts the next).
//
// # Concurrency
//
// mu is held for every step and by Lock; while a caller holds it (between
// Lock and Unlock) the engine publishes nothing and its cache may be read
// through the Locked methods, which need it held. pmu guards the recent
// prompts alone, so that Prompt never waits for a paused engine.
type Engine struct {
	spec    EngineSpec
	opts    EngineOptions
	seed    uint64
	index   int
	systems [][]uint32

	mu    sync.Mutex
	pub   *enginepub.Publisher
	gen   int // engine process number, from 0
	cache *Cache
	wl    *Workload
	rng   *rand.Rand
	// lastSeq is the seq of the last message of this process, valid when
	// sent; lastLost says it was lost.
	lastSeq      uint64
	sent         bool
	lastLost     bool
	burst        int
	resync       bool // the next step is a clear
	sinceClear   int
	sinceRestart int
	stats        EngineStats
	evs          []events.Event

	pmu     sync.Mutex
	recent  [32][]uint32 // ring of the last prompts, for checkpoints and load
	nrecent int          // prompts so far in this process; the ring holds the last len(recent)
}

// NewEngine opens the engine's publisher (binding its sockets) and
// starts its first process with an empty cache.
func NewEngine(spec EngineSpec, opts EngineOptions, seed uint64, index int, systems [][]uint32) (*Engine, error) {
	e := &Engine{spec: spec, opts: opts, seed: seed, index: index, systems: systems}
	if err := e.startLocked(context.Background(), 0); err != nil {
		return nil, err
	}
	return e, nil
}

// Spec returns the engine's spec.
func (e *Engine) Spec() EngineSpec { return e.spec }

// startLocked starts process gen: a fresh cache, workload and publisher,
// seq from 0. Binding is retried for up to two seconds (the previous
// process's ports are being released).
func (e *Engine) startLocked(ctx context.Context, gen int) error {
	e.gen = gen
	stream := uint64(e.index)<<32 | uint64(gen)
	e.rng = rand.New(rand.NewPCG(e.seed, stream))
	var err error
	if e.cache, err = NewCache(BlockSizeOf(e.spec.Model), e.spec.Capacity, stringSeed(e.spec.Model), e.opts.RandomEvict, rand.New(rand.NewPCG(e.seed^0x5eed, stream))); err != nil {
		return err
	}
	if e.wl, err = NewWorkload(e.opts.Workload, e.systems, rand.New(rand.NewPCG(e.seed^0xc0ffee, stream))); err != nil {
		return err
	}
	e.sent, e.lastLost, e.burst, e.sinceClear, e.sinceRestart = false, false, 0, 0, 0
	e.pmu.Lock()
	e.nrecent = 0
	e.pmu.Unlock()
	cfg := enginepub.PublisherConfig{
		Endpoint: e.spec.Endpoint, Topic: e.spec.Topic, Encoding: e.spec.Encoding, Bind: !e.spec.Push,
		ReplayEndpoint: e.spec.ReplayEndpoint, ReplayFrames: e.spec.ReplayFrames, BufferSteps: e.opts.BufferSteps,
	}
	for deadline := time.Now().Add(2 * time.Second); ; {
		if e.pub, err = enginepub.NewPublisher(cfg); err == nil {
			return nil
		}
		if time.Now().After(deadline) || !sleep(ctx, 50*time.Millisecond) {
			return fmt.Errorf("soak: engine %s process %d: %w", e.spec.Worker, gen, err)
		}
	}
}

// Lock pauses the engine: it publishes nothing until Unlock.
func (e *Engine) Lock() { e.mu.Lock() }

// Unlock resumes the engine.
func (e *Engine) Unlock() { e.mu.Unlock() }

// Step runs one engine step and publishes its batch.
func (e *Engine) Step() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stepLocked(true)
}

// stepLocked builds one batch (a clear, or 1..RequestsPerStep requests),
// publishes it, lost or not, and updates the truth. mayLose false
// forces it through.
func (e *Engine) stepLocked(mayLose bool) error {
	if e.pub == nil {
		return fmt.Errorf("soak: engine %s: no publisher (its restart failed)", e.spec.Worker)
	}
	e.evs = e.evs[:0]
	clearNow := e.sinceClear+1 >= e.opts.ClearEvery || e.rng.Float64() < e.opts.ClearRate || e.resync
	e.resync = false
	if clearNow {
		e.evs = append(e.evs, e.cache.Clear())
	} else {
		for range 1 + e.rng.IntN(e.opts.RequestsPerStep) {
			p := e.wl.Next()
			e.pmu.Lock()
			e.recent[e.nrecent%len(e.recent)] = p
			e.nrecent++
			e.pmu.Unlock()
			e.evs = e.cache.Request(p, e.evs)
			e.stats.Requests++
		}
	}
	if mayLose && e.burst == 0 && e.rng.Float64() < e.opts.LossRate {
		e.burst = 1 + e.rng.IntN(3)
	}
	lose := mayLose && e.burst > 0
	publish := e.pub.Publish
	if lose {
		e.burst--
		e.stats.Lost++
		publish = e.pub.PublishLost
	}
	seq, err := publish(&events.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9, Events: e.evs, DPRank: e.spec.Worker.DPRank, HasDPRank: true})
	if err != nil {
		return fmt.Errorf("soak: engine %s: %w", e.spec.Worker, err)
	}
	e.lastSeq, e.sent, e.lastLost = seq, true, lose
	e.stats.Steps++
	e.sinceRestart++
	e.sinceClear++
	if clearNow {
		e.sinceClear = 0
		e.stats.Clears++
	}
	for _, ev := range e.evs {
		e.stats.Events++
		switch ev.Kind {
		case events.KindBlockStored:
			e.stats.Stored += int64(len(ev.BlockHashes))
		case events.KindBlockRemoved:
			e.stats.Removed += int64(len(ev.BlockHashes))
		}
	}
	return nil
}

// FlushLocked makes sure the daemon can know the engine's last seq: when
// the last message was lost, this process has sent nothing or a resync
// is due, it runs one more step that is sent.
func (e *Engine) FlushLocked() error {
	if e.sent && !e.lastLost && !e.resync {
		return nil
	}
	return e.stepLocked(false)
}

// ResyncLocked makes the engine's next step an AllBlocksCleared, after
// which an index that lost track of it is exact again.
func (e *Engine) ResyncLocked() { e.resync = true }

// LastSeqLocked returns the seq of the process's last message and
// whether it sent one.
func (e *Engine) LastSeqLocked() (uint64, bool) { return e.lastSeq, e.sent }

// CacheLocked returns the true cache, which the caller must not change.
func (e *Engine) CacheLocked() *Cache { return e.cache }

// RecentLocked returns a copy of the list of the engine's recent prompts
// (the prompts themselves are shared and must not be changed).
func (e *Engine) RecentLocked() [][]uint32 {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	return append([][]uint32(nil), e.recent[:min(e.nrecent, len(e.recent))]...)
}

// SinceRestartLocked returns the messages of the current process.
func (e *Engine) SinceRestartLocked() int { return e.sinceRestart }

// RestartLocked ends the engine process and starts the next on the same
// ports: seq from 0, an empty cache and replay buffer, a fresh workload;
// it returns once a subscriber has reached the new socket (or ctx is
// done), so that the first message is not lost to the slow joiner. The
// engine stays down for down.
func (e *Engine) RestartLocked(ctx context.Context, down time.Duration) error {
	pub := e.pub
	e.pub = nil // until the next process's publisher is up
	if err := pub.Close(); err != nil {
		return fmt.Errorf("soak: engine %s: close process %d: %w", e.spec.Worker, e.gen, err)
	}
	sleep(ctx, down)
	if err := e.startLocked(ctx, e.gen+1); err != nil {
		return err
	}
	e.stats.Restarts++
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := e.pub.WaitForSubscribers(wctx, 1); err != nil {
		return fmt.Errorf("soak: engine %s process %d: %w", e.spec.Worker, e.gen, err)
	}
	return nil
}

// StatsLocked returns the engine's counters.
func (e *Engine) StatsLocked() EngineStats { return e.stats }

// Prompt returns one of the engine's recent prompts chosen with rng, or
// nil before its first request.
func (e *Engine) Prompt(rng *rand.Rand) []uint32 {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	if e.nrecent == 0 {
		return nil
	}
	return e.recent[rng.IntN(min(e.nrecent, len(e.recent)))]
}

// Close closes the publisher.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pub == nil {
		return nil
	}
	err := e.pub.Close()
	e.pub = nil
	return err
}
