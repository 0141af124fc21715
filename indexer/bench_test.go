package indexer

// Benchmarks behind the index's performance targets; scripts/bench.sh (make bench)
// runs them by these names and prints target vs measured. Custom metrics:
// blocks/s (stored blocks applied per second, their removals included),
// p50-ns/p99-ns (per-call latency percentiles collected here), ratio,
// bytes/residency, engine-bytes/block and all-bytes/residency. The naive
// map+mutex baseline (refIndex) runs beside the real thing as
// BenchmarkNaive*:
//
//	go test -run '^$' -bench 'Naive' ./indexer
//
// and the hashing floor runs call by call beside PromptKeys and Score in
// bench_floor_test.go.

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/blockmap"
)

const (
	benchModel = "bench"
	benchBS    = 16
)

// randTokens returns n random token ids from a Llama-3-sized vocabulary.
func randTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(128256))
	}
	return t
}

// contentHash is a content-based engine hash, as vLLM's are: a block has
// the same engine hash on every worker.
func contentHash(k Key) uint64 { return uint64(k)*0x9e3779b97f4a7c15 | 1 }

// storeEvents returns BlockStored events of at most per blocks that store
// tokens (whole blocks) after the block whose key is parent (hasParent
// false: from the root), with content-based hashes; it returns the last
// block's key too.
func storeEvents(parent Key, hasParent bool, root Key, tokens []uint32, per int) ([]events.Event, Key) {
	var evs []events.Event
	k := parent
	if !hasParent {
		k = root
	}
	for i := 0; i < len(tokens)/benchBS; i += per {
		ev := events.Event{Kind: events.KindBlockStored, BlockSize: benchBS, HasParent: hasParent || i > 0, ParentHash: contentHash(k)}
		for j := i; j < min(i+per, len(tokens)/benchBS); j++ {
			toks := tokens[j*benchBS : (j+1)*benchBS]
			k = BlockKey(k, toks, nil)
			ev.BlockHashes = append(ev.BlockHashes, contentHash(k))
			ev.TokenIDs = append(ev.TokenIDs, toks...)
		}
		evs = append(evs, ev)
	}
	return evs, k
}

// fleet is an index of one model with n workers.
type fleet struct {
	ix   *Index
	ws   []*Worker
	root Key
}

func newFleet(tb testing.TB, n int, cfg Config) *fleet {
	tb.Helper()
	f := &fleet{ix: New(cfg), root: RootKey(benchModel, "")}
	if _, err := f.ix.AddModel(benchModel, benchBS); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		w, err := f.ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: fmt.Sprintf("pod-%04d", i)}, Model: benchModel})
		if err != nil {
			tb.Fatal(err)
		}
		f.ws = append(f.ws, w)
	}
	return f
}

// store applies tokens to w as 16-block events chained from parent, and
// returns the last key.
func (f *fleet) store(tb testing.TB, w *Worker, parent Key, hasParent bool, tokens []uint32) Key {
	evs, last := storeEvents(parent, hasParent, f.root, tokens, 16)
	for i := range evs {
		if err := w.ApplyBatch(&events.Batch{Events: evs[i : i+1]}); err != nil {
			tb.Fatal(err)
		}
	}
	return last
}

// latencies collects per-call durations and reports percentiles.
type latencies []int64

func (l latencies) pct(p float64) float64 {
	s := slices.Clone(l)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return float64(s[min(len(s)-1, int(float64(len(s))*p))])
}

func (l latencies) report(b *testing.B, prefix string) {
	b.ReportMetric(l.pct(0.50), prefix+"p50-ns")
	b.ReportMetric(l.pct(0.99), prefix+"p99-ns")
}

// applyStream is a ring of batches of one worker's realistic ingest: each
// batch is a scheduler step of 8 BlockStored events of 4 to 16 blocks of
// 16 tokens, each continuing its request slot's chain half the time and
// starting a new one (from parent, or the root) otherwise, plus one
// single-block BlockRemoved per block the batch window steps earlier
// stored, last block first (vLLM's eviction order). After one lap the
// worker holds a steady window of blocks and every event applies.
//
// The batches are kept compact (hashes, and token ids drawn from a 256 KB
// pool: only a chain's first block needs tokens of its own, later keys
// are unique through their parents), and fill writes one into a reused
// events.Batch, as the decoder does: so ApplyBatch reads events that are
// in cache, as it does in the product. (Applying a ring of 1,280
// pre-built batches instead reads 28 MB of cold events, which measured
// 35% slower: 18 us per batch against 11.3 us for a ring of 80.)
type applyStream struct {
	batches []compactBatch
	stored  []int
}

type compactBatch struct {
	stores  []compactStore
	removed []uint64 // one BlockRemoved each
}

type compactStore struct {
	parent    uint64
	hasParent bool
	hashes    []uint64
	tokens    []uint32
}

// fill writes batch i into b, reusing b's memory.
func (s *applyStream) fill(i int, b *events.Batch) *events.Batch {
	cb := &s.batches[i]
	b.Events = b.Events[:0]
	for _, st := range cb.stores {
		b.Events = append(b.Events, events.Event{Kind: events.KindBlockStored, BlockSize: benchBS,
			HasParent: st.hasParent, ParentHash: st.parent, BlockHashes: st.hashes, TokenIDs: st.tokens})
	}
	for j := range cb.removed {
		b.Events = append(b.Events, events.Event{Kind: events.KindBlockRemoved, BlockHashes: cb.removed[j : j+1]})
	}
	return b
}

func newApplyStream(seed uint64, n, window int, parent uint64, hasParent bool) *applyStream {
	r := rand.New(rand.NewPCG(seed, 1))
	pool := randTokens(r, 1<<16)
	s := &applyStream{batches: make([]compactBatch, n), stored: make([]int, n)}
	hash := seed << 40
	var tails [8]uint64
	for i := range n {
		cb := &s.batches[i]
		for slot := range 8 {
			st := compactStore{parent: parent, hasParent: hasParent}
			cont := i > 0 && r.IntN(2) == 0
			if cont {
				st.hasParent, st.parent = true, tails[slot]
			}
			nb := 4 + r.IntN(13)
			for range nb {
				hash++
				st.hashes = append(st.hashes, hash*0x9e3779b97f4a7c15|1<<63)
			}
			off := r.IntN(len(pool) - nb*benchBS)
			st.tokens = pool[off : off+nb*benchBS]
			if !cont {
				// A new sequence: its first block's tokens are its own.
				st.tokens = append(randTokens(r, benchBS), st.tokens[benchBS:]...)
			}
			tails[slot] = st.hashes[nb-1]
			s.stored[i] += nb
			cb.stores = append(cb.stores, st)
		}
	}
	for i := range s.batches {
		for _, st := range s.batches[(i-window+n)%n].stores {
			for j := len(st.hashes) - 1; j >= 0; j-- {
				s.batches[i].removed = append(s.batches[i].removed, st.hashes[j])
			}
		}
	}
	return s
}

// BenchmarkApply is apply alone: a warm worker in the steady state of
// applyStream (about 80 k resident blocks), on one core (GOMAXPROCS 1, so
// that the garbage collector shares it). blocks/s counts stored blocks;
// their removals are applied in the same time, and so is filling the
// reused Batch (fill).
func BenchmarkApply(b *testing.B) { benchApply(b, 1024, Config{}) }

// BenchmarkApplyNoRemovalRecord is BenchmarkApply without the per-worker
// removal record (Config.RemovalHistory < 0): the record's cost is the
// difference.
func BenchmarkApplyNoRemovalRecord(b *testing.B) { benchApply(b, 1024, Config{RemovalHistory: -1}) }

// BenchmarkApplyCached is BenchmarkApply with a window of 16 batches: the
// worker holds about 1,300 blocks, and its engine map and nodes stay in
// cache, so that this is apply's cost without the cache misses.
func BenchmarkApplyCached(b *testing.B) { benchApply(b, 16, Config{}) }

func benchApply(b *testing.B, window int, cfg Config) {
	const ring = 1280
	s := newApplyStream(1, ring, window, 0, false)
	f := newFleet(b, 1, cfg)
	w := f.ws[0]
	var batch events.Batch
	for i := range s.batches {
		_ = w.ApplyBatch(s.fill(i, &batch)) // the first lap removes blocks not stored yet
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	blocks, i := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := w.ApplyBatch(s.fill(i, &batch)); err != nil {
			b.Fatal(err)
		}
		blocks += s.stored[i]
		if i++; i == len(s.batches) {
			i = 0
		}
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	if got, want := w.Stats().ResidentBlocks, int64(window*80); got < want*8/10 || got > want*12/10 {
		b.Fatalf("worker holds %d blocks, want about %d", got, want)
	}
}

// BenchmarkNaiveApply is BenchmarkApply on the map+mutex baseline.
func BenchmarkNaiveApply(b *testing.B) {
	const ring, window = 1280, 1024
	s := newApplyStream(1, ring, window, 0, false)
	ref := newRefIndex()
	ref.addModel(benchModel, benchBS)
	w := ref.addWorker(benchModel)
	var batch events.Batch
	for i := range s.batches {
		w.apply(s.fill(i, &batch))
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	blocks, i := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		w.apply(s.fill(i, &batch))
		blocks += s.stored[i]
		if i++; i == len(s.batches) {
			i = 0
		}
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkPromptKeys32K is the content keys of a 32 K-token prompt (2,048
// blocks of 16), into a reused slice.
func BenchmarkPromptKeys32K(b *testing.B) {
	toks := randTokens(rand.New(rand.NewPCG(1, 1)), 32768)
	dst := make([]Key, 0, 2048)
	b.ReportAllocs()
	for b.Loop() {
		dst = PromptKeys(benchModel, benchBS, toks, nil, dst[:0])
	}
	if len(dst) != 2048 {
		b.Fatal(len(dst))
	}
}

// score128x8 builds 64 prompts of 128 blocks, each held whole by the same
// 8 workers, which also hold 8,192 blocks of their own each (so that the
// index is not just the prompts).
func score128x8(b *testing.B) (*fleet, [][]uint32) {
	r := rand.New(rand.NewPCG(2, 2))
	f := newFleet(b, 8, Config{})
	var prompts [][]uint32
	for range 64 {
		prompts = append(prompts, randTokens(r, 128*benchBS))
	}
	for _, w := range f.ws {
		for _, p := range prompts {
			f.store(b, w, 0, false, p)
		}
		for range 32 {
			f.store(b, w, 0, false, randTokens(r, 256*benchBS))
		}
	}
	return f, prompts
}

// allowModel is the filter api.Server passes: workers of the request's
// model.
func allowModel(ix *Index, m *Model) func(WorkerID) bool {
	models := make([]*Model, ix.NumWorkers())
	for _, w := range ix.Workers() {
		models[w.ID()] = w.Model()
	}
	return func(id WorkerID) bool { return int(id) < len(models) && models[id] == m }
}

// BenchmarkScore128x8 is the index side of a Score: PromptKeys of a
// 128-block (2,048-token) prompt and Match, into reused scratch, with all
// 8 holders matching all 128 blocks. p50-ns and p99-ns are per call;
// allocs/op must be 0.
func BenchmarkScore128x8(b *testing.B) {
	f, prompts := score128x8(b)
	m, _ := f.ix.Model(benchModel)
	allow := allowModel(f.ix, m)
	keys := make([]Key, 0, 128)
	dst := make([]Match, 0, 8)
	lat := make(latencies, 0, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		keys = PromptKeys(benchModel, benchBS, prompts[i%len(prompts)], nil, keys[:0])
		dst = f.ix.Match(keys, allow, dst[:0])
		if len(lat) < cap(lat) {
			lat = append(lat, int64(time.Since(t0)))
		}
	}
	b.StopTimer()
	if len(dst) != 8 || dst[0].Blocks != 128 {
		b.Fatalf("matches %+v", dst)
	}
	lat.report(b, "")
}

// BenchmarkNaiveScore128x8 is BenchmarkScore128x8 on the map+mutex
// baseline (one map probe and O(holders) per block).
func BenchmarkNaiveScore128x8(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	ref := newRefIndex()
	ref.addModel(benchModel, benchBS)
	var prompts [][]uint32
	for range 64 {
		prompts = append(prompts, randTokens(r, 128*benchBS))
	}
	for range 8 {
		w := ref.addWorker(benchModel)
		for _, p := range prompts {
			evs, _ := storeEvents(0, false, RootKey(benchModel, ""), p, 16)
			w.apply(&events.Batch{Events: evs})
		}
	}
	keys := make([]Key, 0, 128)
	dst := make([]Match, 0, 8)
	pos := make([]int32, 8)
	for i := range pos {
		pos[i] = -1
	}
	lat := make(latencies, 0, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		keys = PromptKeys(benchModel, benchBS, prompts[i%len(prompts)], nil, keys[:0])
		dst = ref.naiveMatch(keys, dst[:0], pos)
		if len(lat) < cap(lat) {
			lat = append(lat, int64(time.Since(t0)))
		}
	}
	b.StopTimer()
	if len(dst) != 8 || dst[0].Blocks != 128 {
		b.Fatalf("matches %+v", dst)
	}
	lat.report(b, "")
}

// shape4096 is the fleet of BenchmarkScore4096x1000: 1,000 workers all
// hold one 512-block prefix (a long system prompt) and a tail of their own
// of 16 to 256 blocks after it; 8 of them also hold the benchmark prompt's
// continuation, to depths of 16 to all 3,584 blocks.
type shape4096 struct {
	*fleet
	prompt     []uint32
	prefixLast Key
}

var tailDepths = []int{3584, 2048, 1024, 512, 256, 128, 64, 16}

func newShape4096(b *testing.B, workers int) *shape4096 {
	r := rand.New(rand.NewPCG(3, 3))
	s := &shape4096{fleet: newFleet(b, workers, Config{})}
	prefix := randTokens(r, 512*benchBS)
	cont := randTokens(r, 3584*benchBS)
	s.prompt = append(slices.Clone(prefix), cont...)
	for i, w := range s.ws {
		s.prefixLast = s.store(b, w, 0, false, prefix)
		s.store(b, w, s.prefixLast, true, randTokens(r, (16+r.IntN(241))*benchBS))
		if i < len(tailDepths) {
			s.store(b, w, s.prefixLast, true, cont[:tailDepths[i]*benchBS])
		}
	}
	return s
}

func (s *shape4096) check(b *testing.B, dst []Match) {
	if len(dst) != len(s.ws) {
		b.Fatalf("%d matches, want %d", len(dst), len(s.ws))
	}
	for _, m := range dst {
		want := 512
		if int(m.Worker) < len(tailDepths) {
			want += tailDepths[m.Worker]
		}
		if m.Blocks != want {
			b.Fatalf("worker %d matched %d, want %d", m.Worker, m.Blocks, want)
		}
	}
}

// BenchmarkScore4096x1000 is the index side of a Score of a 4,096-block
// (65,536-token) prompt over newShape4096: PromptKeys and Match (1,000
// matches). p50-ns/p99-ns are per call; match-p50-ns/match-p99-ns are
// Match alone (PromptKeys is 2 x BenchmarkPromptKeys32K of it).
func BenchmarkScore4096x1000(b *testing.B) {
	s := newShape4096(b, 1000)
	m, _ := s.ix.Model(benchModel)
	allow := allowModel(s.ix, m)
	keys := make([]Key, 0, 4096)
	dst := make([]Match, 0, 1024)
	lat := make(latencies, 0, 1<<20)
	mlat := make(latencies, 0, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		keys = PromptKeys(benchModel, benchBS, s.prompt, nil, keys[:0])
		t1 := time.Now()
		dst = s.ix.Match(keys, allow, dst[:0])
		if len(lat) < cap(lat) {
			lat = append(lat, int64(time.Since(t0)))
			mlat = append(mlat, int64(time.Since(t1)))
		}
	}
	b.StopTimer()
	s.check(b, dst)
	lat.report(b, "")
	mlat.report(b, "match-")
}

// BenchmarkNaiveScore4096x1000 is Match alone over the same shape on the
// map+mutex baseline (it pays O(holders) on each of the 512 shared blocks).
func BenchmarkNaiveScore4096x1000(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	ref := newRefIndex()
	ref.addModel(benchModel, benchBS)
	root := RootKey(benchModel, "")
	prefix := randTokens(r, 512*benchBS)
	cont := randTokens(r, 3584*benchBS)
	prompt := append(slices.Clone(prefix), cont...)
	for i := range 1000 {
		w := ref.addWorker(benchModel)
		evs, last := storeEvents(0, false, root, prefix, 16)
		tail, _ := storeEvents(last, true, root, randTokens(r, (16+r.IntN(241))*benchBS), 16)
		evs = append(evs, tail...)
		if i < len(tailDepths) {
			c, _ := storeEvents(last, true, root, cont[:tailDepths[i]*benchBS], 16)
			evs = append(evs, c...)
		}
		w.apply(&events.Batch{Events: evs})
	}
	keys := PromptKeys(benchModel, benchBS, prompt, nil, nil)
	dst := make([]Match, 0, 1024)
	pos := make([]int32, 1000)
	for i := range pos {
		pos[i] = -1
	}
	lat := make(latencies, 0, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		dst = ref.naiveMatch(keys, dst[:0], pos)
		if len(lat) < cap(lat) {
			lat = append(lat, int64(time.Since(t0)))
		}
	}
	b.StopTimer()
	if len(dst) != 1000 {
		b.Fatal(len(dst))
	}
	lat.report(b, "match-")
}

// BenchmarkScoreUnderIngest measures Score's tail latency on one core
// while another goroutine ingests about 1 M blocks/s into the same index:
// 4 of the fleet's workers replay applyStream (new requests start from the
// shared prefix, so ingest creates and retires branches of the very node
// every Score walks through), paced in 1 ms steps. Scoring alternates 20
// times between slices with ingest stopped (p99-idle-ns) and running
// (p99-ns), so that both see the same background; ratio is p99-ns /
// p99-idle-ns, and ingest-blocks/s the rate achieved while running.
// allocs/op counts the ingest's allocations too.
func BenchmarkScoreUnderIngest(b *testing.B) {
	b.Run("4096x1000", func(b *testing.B) {
		s := newShape4096(b, 1000)
		m, _ := s.ix.Model(benchModel)
		keys := make([]Key, 0, 4096)
		dst := make([]Match, 0, 1024)
		allow := allowModel(s.ix, m)
		underIngest(b, s.fleet, s.ws[len(s.ws)-4:], contentHash(s.prefixLast), func() {
			keys = PromptKeys(benchModel, benchBS, s.prompt, nil, keys[:0])
			dst = s.ix.Match(keys, allow, dst[:0])
		})
		s.check(b, dst)
	})
	b.Run("128x8", func(b *testing.B) {
		f, prompts := score128x8(b)
		m, _ := f.ix.Model(benchModel)
		keys := make([]Key, 0, 128)
		dst := make([]Match, 0, 8)
		allow := allowModel(f.ix, m)
		i := 0
		// The 8 workers ingest too, new requests from the root.
		underIngest(b, f, f.ws[4:], 0, func() {
			keys = PromptKeys(benchModel, benchBS, prompts[i%len(prompts)], nil, keys[:0])
			dst = f.ix.Match(keys, allow, dst[:0])
			i++
		})
	})
}

func underIngest(b *testing.B, f *fleet, ingest []*Worker, parent uint64, score func()) {
	const ring, window, rate, slices = 640, 256, 1_000_000, 20
	streams := make([]*applyStream, len(ingest))
	for i, w := range ingest {
		streams[i] = newApplyStream(uint64(100+i), ring, window, parent, parent != 0)
		var batch events.Batch
		for j := range streams[i].batches {
			_ = w.ApplyBatch(streams[i].fill(j, &batch))
		}
	}
	runtime.GC()

	// The ingest goroutine applies rate blocks/s, a millisecond's share at
	// a time, while on is set.
	var on, stop atomic.Bool
	var ingested atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := make([]int, len(ingest))
		var batch events.Batch
		for !stop.Load() {
			if !on.Load() {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			start, blocks := time.Now(), 0
			for step := 1; on.Load() && !stop.Load(); step++ {
				for blocks < rate*step/1000 {
					k := blocks % len(ingest)
					s := streams[k]
					_ = ingest[k].ApplyBatch(s.fill(next[k], &batch))
					blocks += s.stored[next[k]]
					next[k] = (next[k] + 1) % len(s.batches)
				}
				if d := time.Until(start.Add(time.Duration(step) * time.Millisecond)); d > 0 {
					time.Sleep(d)
				}
			}
			ingested.Add(int64(blocks))
		}
	}()

	// Idle and busy slices alternate, so that both see the same background
	// (other processes, the garbage collector) and the ratio measures the
	// ingest alone.
	//
	// The scoring goroutine keeps its OS thread, so that the kernel's count
	// of involuntary switches of that thread (threadSwitches, Linux only)
	// tells how often its calls waited for a CPU: when something outside
	// the benchmark takes a core, ingest and Score share one and the busy
	// p99 measures the wait, not the index (docs/benchmarks.md).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	idle := make(latencies, 0, b.N)
	busy := make(latencies, 0, b.N)
	var busyTime time.Duration
	var switches [2]int64 // idle, busy
	b.ReportAllocs()
	b.ResetTimer()
	for sl := range 2 * slices {
		n := max(1, b.N/slices)
		lat := &idle
		if sl%2 == 1 {
			lat = &busy
			on.Store(true)
			time.Sleep(2 * time.Millisecond) // ingest reaches its pace
		}
		t0, sw0 := time.Now(), threadSwitches()
		for range n {
			t := time.Now()
			score()
			*lat = append(*lat, int64(time.Since(t)))
		}
		switches[sl%2] += threadSwitches() - sw0
		if sl%2 == 1 {
			busyTime += time.Since(t0)
			on.Store(false)
		}
	}
	stop.Store(true)
	wg.Wait()
	b.StopTimer()
	idleP99, busyP99 := idle.pct(0.99), busy.pct(0.99)
	b.ReportMetric(idleP99, "p99-idle-ns")
	b.ReportMetric(busyP99, "p99-ns")
	b.ReportMetric(busyP99/idleP99, "ratio")
	// Involuntary switches of the scoring thread per 1,000 Scores.
	b.ReportMetric(float64(switches[0])*1000/float64(len(idle)), "idle-switches/kop")
	b.ReportMetric(float64(switches[1])*1000/float64(len(busy)), "busy-switches/kop")
	b.ReportMetric(float64(ingested.Load())/(busyTime+time.Duration(slices)*2*time.Millisecond).Seconds(), "ingest-blocks/s")
}

// BenchmarkMemory10M builds 10 M (block, worker) residencies, 1,000
// workers x 10,000 blocks, and measures the heap after GC: bytes/residency
// is the residency index (tree, holder sets, heads) over residencies,
// engine-bytes/block the workers' engine maps (measured by dropping them)
// over resident blocks, and all-bytes/residency both together (one engine
// entry per residency) over residencies.
//
//   - shared: a realistic fleet behind a prefix-aware router. 40 system
//     prompts of 16 to 512 blocks; each worker holds 12 of them (about
//     3,000 blocks) and conversations of its own, 64 to 1,024 blocks each,
//     that continue from one of its prompts; a quarter of the
//     conversations are also held by a second worker.
//   - unshared: the worst case for the index, every block held by one
//     worker only, in chains of 64 to 1,024 blocks.
func BenchmarkMemory10M(b *testing.B) {
	for _, shared := range []bool{true, false} {
		name := "unshared"
		if shared {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				memory10M(b, shared)
			}
		})
	}
}

func memory10M(b *testing.B, shared bool) {
	const workers, perWorker = 1000, 10000
	r := rand.New(rand.NewPCG(4, 4))
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	// Token ids are drawn from one 1 Mi pool so that building costs no
	// 10 M-block token allocation; random offsets keep blocks distinct.
	pool := randTokens(r, 1<<20)
	toks := func(blocks int) []uint32 {
		n := blocks * benchBS
		off := r.IntN(len(pool) - n)
		t := slices.Clone(pool[off : off+n])
		t[0] = uint32(r.Uint32()) // make the first block (and so the chain) unique
		return t
	}
	type prompt struct {
		tokens []uint32
		last   Key
	}
	var prompts []prompt
	for range 40 {
		t := toks(16 + r.IntN(497))
		keys := PromptKeys(benchModel, benchBS, t, nil, nil)
		prompts = append(prompts, prompt{t, keys[len(keys)-1]})
	}
	type conv struct {
		prompt int
		tokens []uint32
	}
	base := heap()
	f := newFleet(b, workers, Config{WorkerCapacity: -1})
	b.ResetTimer()
	start := time.Now()
	var replicas, next []conv // conversations the next worker holds too
	for _, w := range f.ws {
		held := 0
		has := map[int]bool{}
		var mine []int // the prompts this worker holds, in order
		hold := func(p int) {
			if shared && !has[p] {
				has[p] = true
				mine = append(mine, p)
				f.store(b, w, 0, false, prompts[p].tokens)
				held += len(prompts[p].tokens) / benchBS
			}
		}
		if shared {
			for _, p := range r.Perm(len(prompts))[:12] {
				hold(p)
			}
		}
		for _, c := range replicas {
			if held+len(c.tokens)/benchBS > perWorker {
				break
			}
			hold(c.prompt)
			f.store(b, w, prompts[c.prompt].last, true, c.tokens)
			held += len(c.tokens) / benchBS
		}
		next = next[:0]
		for held < perWorker {
			n := min(64+r.IntN(961), perWorker-held)
			t := toks(n)
			if shared {
				p := mine[r.IntN(len(mine))]
				f.store(b, w, prompts[p].last, true, t)
				if r.IntN(4) == 0 {
					next = append(next, conv{p, t})
				}
			} else {
				f.store(b, w, 0, false, t)
			}
			held += n
		}
		replicas, next = next, replicas
	}
	build := time.Since(start)
	b.StopTimer()
	var resident int64
	for _, w := range f.ws {
		resident += w.Stats().ResidentBlocks
	}
	total := heap() - base
	for _, w := range f.ws {
		w.engine, w.dups = blockmap.Map{}, nil
	}
	index := heap() - base
	b.ReportMetric(float64(index)/float64(resident), "bytes/residency")
	b.ReportMetric(float64(total-index)/float64(resident), "engine-bytes/block")
	b.ReportMetric(float64(total)/float64(resident), "all-bytes/residency")
	b.ReportMetric(float64(resident), "residencies")
	b.ReportMetric(float64(resident)/build.Seconds(), "build-blocks/s")
	runtime.KeepAlive(f)
}
