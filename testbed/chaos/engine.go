package chaos

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/enginepub"
	"github.com/kvindex/kvindex/testbed/soak"
)

// EngineConfig is one simulated engine: its pod (one worker, DP rank 0),
// model, cache, the ports its PUB and replay ROUTER sockets bind, its
// replay buffer (vLLM's buffer_steps) and the seed of its choices.
type EngineConfig struct {
	Index               int
	Pod, Model          string
	BlockSize, Capacity int
	PubPort, ReplayPort int
	BufferSteps         int
	// LossEvery: one step in LossEvery starts a loss of 1-3 messages,
	// kept for replay but not sent; 0 loses none.
	LossEvery int
	Seed      uint64
	Systems   [][]uint32
}

// The engines' behaviour: a step every stepEvery of one or two requests,
// the router's first; a loss of 1-3 messages (kept for replay) in one
// step of lossEvery (EngineConfig.LossEvery); a reset_prefix_cache in one of clearEvery; one
// eviction in fifty out of LRU order; at most maxQueued routed requests
// waiting.
const (
	stepEvery   = 50 * time.Millisecond
	lossEvery   = 200
	clearEvery  = 3000
	randomEvict = 0.02
	maxQueued   = 64
)

// workload keeps prompts short enough that an engine sends ~20 KB/s: the
// bandwidth caps of a schedule slow its stream without starving it.
var workload = soak.WorkloadOptions{Conversations: 8, MaxTurns: 6, MaxTokens: 800, UserTokens: 64, ReplyTokens: 128, OneShot: 0.15}

// Engine is a simulated vLLM engine inside the harness: a publisher of
// vLLM's KV events (enginepub, with a replay buffer) and the true cache
// its requests leave (soak.Cache), which is the oracle the checks ask.
// Besides the cache it remembers when it last stopped holding each block
// (an eviction, a clear, the end of its process), so that an answer can
// be judged against what the engine held when it was asked.
//
// # Concurrency
//
// mu guards every field below it; a step, a restart and every query take
// it. Restart releases it while the engine is down.
type Engine struct {
	cfg      EngineConfig
	model    *indexer.Model
	hashSeed uint64

	mu      sync.Mutex
	pub     *enginepub.Publisher // nil while down
	gen     int                  // process number, from 0
	cache   *soak.Cache
	wl      *soak.Workload
	rng     *rand.Rand
	queue   [][]uint32 // routed prompts, served first
	burst   int        // messages still to lose
	frozen  bool
	idle    bool                   // steps publish empty batches
	removed map[uint64]int64       // engine hash -> unix ns it was last dropped
	keys    map[uint64]indexer.Key // engine hash -> content key
	recent  [32][]uint32           // ring of recent prompts
	nrecent int
	stats   EngineStats
	evs     []events.Event
	hashes  []uint64
	pkeys   []indexer.Key
}

// EngineStats count what an engine did over all its processes.
type EngineStats struct {
	Steps, Lost, Stored, Removed  int64
	Clears, Restarts, Requests    int64
	Routed, RoutedDropped, Frozen int64
}

// NewEngine binds the engine's sockets and starts its first process.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	m, err := indexer.New(indexer.Config{}).AddModel(cfg.Model, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("chaos: engine %d: %w", cfg.Index, err)
	}
	e := &Engine{cfg: cfg, model: m, hashSeed: HashSeed(cfg.Model), removed: map[uint64]int64{}, keys: map[uint64]indexer.Key{}}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.startLocked(context.Background()); err != nil {
		return nil, err
	}
	return e, nil
}

// HashSeed is the engine hash seed of model's engines, so that they hash
// a block alike, as vLLM's engines of one model do.
func HashSeed(model string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(model))
	return h.Sum64()
}

// startLocked starts process e.gen: an empty cache, a fresh workload and
// publisher, seq from 0. Binding is retried for two seconds while the
// last process's ports are released.
func (e *Engine) startLocked(ctx context.Context) error {
	stream := uint64(e.cfg.Index)<<32 | uint64(e.gen)
	e.rng = rand.New(rand.NewPCG(e.cfg.Seed, stream))
	var err error
	if e.cache, err = soak.NewCache(e.cfg.BlockSize, e.cfg.Capacity, e.hashSeed, randomEvict, rand.New(rand.NewPCG(e.cfg.Seed^0x5eed, stream))); err != nil {
		return err
	}
	if e.wl, err = soak.NewWorkload(workload, e.cfg.Systems, rand.New(rand.NewPCG(e.cfg.Seed^0xc0ffee, stream))); err != nil {
		return err
	}
	e.burst, e.nrecent = 0, 0
	cfg := enginepub.PublisherConfig{
		Endpoint: tcpAddr(e.cfg.PubPort), Topic: "kv@" + e.cfg.Pod + "@" + e.cfg.Model, Bind: true,
		ReplayEndpoint: tcpAddr(e.cfg.ReplayPort), BufferSteps: e.cfg.BufferSteps,
	}
	for deadline := time.Now().Add(2 * time.Second); ; {
		if e.pub, err = enginepub.NewPublisher(cfg); err == nil {
			return nil
		}
		if time.Now().After(deadline) || !sleep(ctx, 50*time.Millisecond) {
			return fmt.Errorf("chaos: engine %d process %d: %w", e.cfg.Index, e.gen, err)
		}
	}
}

// Step runs one engine step at now and publishes its batch (or keeps it
// for replay only, when lost). A frozen or down engine does nothing; an
// idle one publishes an empty batch.
func (e *Engine) Step(now time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.frozen || e.pub == nil {
		return nil
	}
	e.evs = e.evs[:0]
	switch {
	case e.idle:
	case e.rng.IntN(clearEvery) == 0:
		e.dropAllLocked(now)
		e.evs = append(e.evs, e.cache.Clear())
		e.stats.Clears++
	default:
		for range 1 + e.rng.IntN(2) {
			p := e.wl.Next()
			if len(e.queue) > 0 {
				p, e.queue = e.queue[0], e.queue[1:]
				e.stats.Routed++
			}
			e.serveLocked(p, now)
		}
	}
	if !e.idle && e.burst == 0 && e.cfg.LossEvery > 0 && e.rng.IntN(e.cfg.LossEvery) == 0 {
		e.burst = 1 + e.rng.IntN(3)
	}
	publish := e.pub.Publish
	if e.burst > 0 && !e.idle {
		e.burst--
		e.stats.Lost++
		publish = e.pub.PublishLost
	}
	if _, err := publish(&events.Batch{Timestamp: float64(now.UnixNano()) / 1e9, Events: e.evs, HasDPRank: true}); err != nil {
		return fmt.Errorf("chaos: engine %d: %w", e.cfg.Index, err)
	}
	e.stats.Steps++
	return nil
}

// serveLocked serves one request: the cache takes it, the engine learns
// its blocks' content keys and notes the blocks the request evicted.
func (e *Engine) serveLocked(p []uint32, now time.Time) {
	e.recent[e.nrecent%len(e.recent)] = p
	e.nrecent++
	e.stats.Requests++
	e.hashes = soak.BlockHashes(e.hashSeed, e.cfg.BlockSize, p, e.hashes[:0])
	e.pkeys = e.model.PromptKeys(p, nil, e.pkeys[:0])
	for i := range min(len(e.hashes), len(e.pkeys), e.cfg.Capacity) {
		e.keys[e.hashes[i]] = e.pkeys[i]
	}
	start := len(e.evs)
	e.evs = e.cache.Request(p, e.evs)
	for _, ev := range e.evs[start:] {
		switch ev.Kind {
		case events.KindBlockStored:
			e.stats.Stored += int64(len(ev.BlockHashes))
		case events.KindBlockRemoved:
			e.stats.Removed += int64(len(ev.BlockHashes))
			for _, h := range ev.BlockHashes {
				if !e.cache.Holds(h) {
					e.removed[h] = now.UnixNano()
				}
			}
		}
	}
}

// dropAllLocked notes every held block as dropped at now.
func (e *Engine) dropAllLocked(now time.Time) {
	e.hashes = e.cache.Hashes(e.hashes[:0])
	for _, h := range e.hashes {
		e.removed[h] = now.UnixNano()
	}
}

// Submit queues a routed prompt for the engine's next steps; it reports
// false when the queue is full (the prompt is dropped and counted).
func (e *Engine) Submit(p []uint32) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) >= maxQueued {
		e.stats.RoutedDropped++
		return false
	}
	e.queue = append(e.queue, p)
	return true
}

// Restart ends the engine's process (its sockets close, its cache is
// gone), waits down and starts the next on the same ports: seq from 0,
// an empty cache and replay buffer.
func (e *Engine) Restart(ctx context.Context, down time.Duration) error {
	e.mu.Lock()
	e.dropAllLocked(time.Now())
	e.cache.Clear()
	pub := e.pub
	e.pub, e.queue = nil, nil
	e.mu.Unlock()
	if pub != nil {
		if err := pub.Close(); err != nil {
			return fmt.Errorf("chaos: engine %d: close process %d: %w", e.cfg.Index, e.gen, err)
		}
	}
	sleep(ctx, down)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gen++
	e.stats.Restarts++
	return e.startLocked(ctx)
}

// WaitForSubscribers waits until a subscriber has reached the current
// process's PUB socket, or ctx is done.
func (e *Engine) WaitForSubscribers(ctx context.Context) error {
	e.mu.Lock()
	pub := e.pub
	e.mu.Unlock()
	if pub == nil {
		return fmt.Errorf("chaos: engine %d is down", e.cfg.Index)
	}
	return pub.WaitForSubscribers(ctx, 1)
}

// Freeze stops (true) or resumes (false) the engine's steps.
func (e *Engine) Freeze(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if on && !e.frozen {
		e.stats.Frozen++
	}
	e.frozen = on
}

// Idle makes every later step publish an empty batch (true), so that the
// cache stands still while the stream stays alive, or ends that.
func (e *Engine) Idle(on bool) {
	e.mu.Lock()
	e.idle = on
	e.mu.Unlock()
}

// Staleness judges a claim that the engine holds the blocks of engine
// hashes, made by an answer to a request sent at sent: how long before
// sent the engine last held the one it dropped longest before (0 when it
// holds them all, or dropped them at or after sent), which block that is,
// and whether the engine never held it at all (age is then +Inf).
func (e *Engine) Staleness(hashes []uint64, sent time.Time) (age time.Duration, block int, never bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	block = -1
	for i, h := range hashes {
		if e.cache.Holds(h) {
			continue
		}
		at, ok := e.removed[h]
		if !ok {
			return time.Duration(math.MaxInt64), i, true
		}
		if a := time.Duration(sent.UnixNano() - at); a > age {
			age, block = a, i
		}
	}
	return age, block, false
}

// Truth returns the blocks the engine holds and the digest kvindex's
// index computes for a worker holding exactly them on GPU
// (indexer.Worker.Digest), or an error naming a block whose content key
// the engine never learned.
func (e *Engine) Truth() (resident int, digest uint64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.hashes = e.cache.Hashes(e.hashes[:0])
	for _, h := range e.hashes {
		k, ok := e.keys[h]
		if !ok {
			return 0, 0, fmt.Errorf("chaos: engine %d holds block %#x of unknown content key", e.cfg.Index, h)
		}
		digest += DigestTerm(k, 1<<events.MediumGPU)
	}
	return len(e.hashes), digest, nil
}

// Prompt returns one of the engine's recent prompts, or a chain its cache
// holds (one in three), chosen with rng; nil before its first request.
func (e *Engine) Prompt(rng *rand.Rand) []uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rng.IntN(3) == 0 {
		if p := e.cache.Chain(rng); p != nil {
			return p
		}
	}
	if e.nrecent == 0 {
		return nil
	}
	return e.recent[rng.IntN(min(e.nrecent, len(e.recent)))]
}

// LongestPrefix returns how many of the prompt's first blocks the engine
// holds now.
func (e *Engine) LongestPrefix(p []uint32) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cache.LongestPrefix(p)
}

// Forget drops the memory of blocks dropped before cutoff: a later claim
// of one is judged "never held", stale beyond any bound all the same.
func (e *Engine) Forget(cutoff time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for h, at := range e.removed {
		if at < cutoff.UnixNano() && !e.cache.Holds(h) {
			delete(e.removed, h)
			delete(e.keys, h)
		}
	}
}

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Close closes the engine's sockets.
func (e *Engine) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pub != nil {
		_ = e.pub.Close()
		e.pub = nil
	}
}

// DigestTerm is a key's term in a worker's digest, as indexer.Worker.Digest
// computes it (splitmix64's finaliser of the key offset by its media
// mask); TestDigestTermIsTheIndexers keeps the two equal.
func DigestTerm(k indexer.Key, media uint8) uint64 {
	x := uint64(k) + (uint64(media)+1)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func tcpAddr(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }

// sleep waits d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
