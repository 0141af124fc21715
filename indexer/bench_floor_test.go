package indexer

// Benchmarks against the floor: the least work that computing a prompt's
// keys can cost, run in the same process and interleaved call by call with
// what it measures, so that both see the same machine. The floor is a bare
// chained xxh3: each block's bytes hashed with xxh3.HashSeed, seeded by
// the previous block's hash, into a reused slice. ratio is the measured
// p50 over the floor's p50 (docs/benchmarks.md, "Against the floor").

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// floorKeys is the floor: chained xxh3.HashSeed over each full block of
// tokens (as little-endian bytes), appended to dst.
func floorKeys(tokens []uint32, blockSize int, seed uint64, dst []uint64) []uint64 {
	if len(tokens) == 0 {
		return dst
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
	n := blockSize * 4
	h := seed
	for i := 0; (i+1)*n <= len(b); i++ {
		h = xxh3.HashSeed(b[i*n:(i+1)*n], h)
		dst = append(dst, h)
	}
	return dst
}

// BenchmarkPromptKeysFloor is BenchmarkPromptKeys32K (the keys of a
// 32 K-token prompt, 2,048 blocks of 16) beside the floor over the same
// tokens, call by call: keys-p50-ns, floor-p50-ns, and ratio.
func BenchmarkPromptKeysFloor(b *testing.B) {
	toks := randTokens(rand.New(rand.NewPCG(1, 1)), 32768)
	dst := make([]Key, 0, 2048)
	fdst := make([]uint64, 0, 2048)
	root := uint64(RootKey(benchModel, ""))
	keys := make(latencies, 0, b.N)
	floor := make(latencies, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		dst = PromptKeys(benchModel, benchBS, toks, nil, dst[:0])
		t1 := time.Now()
		fdst = floorKeys(toks, benchBS, root, fdst[:0])
		t2 := time.Now()
		keys = append(keys, int64(t1.Sub(t0)))
		floor = append(floor, int64(t2.Sub(t1)))
	}
	b.StopTimer()
	if len(dst) != 2048 || !slices.EqualFunc(dst, fdst, func(k Key, h uint64) bool { return uint64(k) == h }) {
		b.Fatal("the floor computed other keys")
	}
	k, f := keys.pct(0.5), floor.pct(0.5)
	b.ReportMetric(k, "keys-p50-ns")
	b.ReportMetric(f, "floor-p50-ns")
	b.ReportMetric(k/f, "ratio")
}

// scoreShape is a fleet and the prompts a Score benchmark cycles through,
// with the number of blocks each worker must match.
type scoreShape struct {
	*fleet
	prompts [][]uint32
	want    func(p int, w WorkerID) int // blocks worker w matches of prompt p
}

// newScoreShapeFull is prompts of blocks blocks, each held whole by all of
// workers workers, which also hold own blocks of their own each (so that
// the index is not just the prompts).
func newScoreShapeFull(b testing.TB, workers, prompts, blocks, own int) *scoreShape {
	r := rand.New(rand.NewPCG(5, uint64(blocks)))
	s := &scoreShape{fleet: newFleet(b, workers, Config{})}
	for range prompts {
		s.prompts = append(s.prompts, randTokens(r, blocks*benchBS))
	}
	for _, w := range s.ws {
		for _, p := range s.prompts {
			s.store(b, w, 0, false, p)
		}
		for range own / 256 {
			s.store(b, w, 0, false, randTokens(r, 256*benchBS))
		}
	}
	s.want = func(int, WorkerID) int { return blocks }
	return s
}

// newScoreShapeDepths is one prompt of blocks blocks over workers workers,
// worker i holding its first blocks*(i+1)/workers: every worker matches,
// each to a different depth, so that the walk meets a holder-set change
// and a finished match at every worker's depth.
func newScoreShapeDepths(b testing.TB, workers, blocks int) *scoreShape {
	r := rand.New(rand.NewPCG(6, uint64(blocks)))
	s := &scoreShape{fleet: newFleet(b, workers, Config{})}
	p := randTokens(r, blocks*benchBS)
	s.prompts = [][]uint32{p}
	depth := func(w WorkerID) int { return blocks * (int(w) + 1) / workers }
	for i, w := range s.ws {
		s.store(b, w, 0, false, p[:depth(WorkerID(i))*benchBS])
	}
	s.want = func(_ int, w WorkerID) int { return depth(w) }
	return s
}

// BenchmarkScoreFloor is the index side of a Score (PromptKeys and Match,
// into reused scratch, as BenchmarkScore128x8) beside the floor over the
// same prompt, call by call: p50-ns/p99-ns per Score, floor-p50-ns, and
// ratio (p50-ns over floor-p50-ns); match-p50-ns is Match alone, timed in
// a pass of its own.
//
//   - 128x8: BenchmarkScore128x8's fleet, 8 workers each holding 64
//     prompts of 128 blocks and 8,192 blocks of their own.
//   - 2048x8: 8 workers each holding 16 prompts of 2,048 blocks (32 K
//     tokens) and 8,192 blocks of their own.
//   - 15000x96: one 240 K-token prompt (15,000 blocks) over 96 workers,
//     worker i holding its first 15,000*(i+1)/96 blocks, so that all 96
//     match, to 96 different depths: the longest prompt and the most
//     holder-set changes of the three.
func BenchmarkScoreFloor(b *testing.B) {
	shapes := []struct {
		name string
		make func(b *testing.B) *scoreShape
	}{
		{"128x8", func(b *testing.B) *scoreShape {
			f, prompts := score128x8(b)
			return &scoreShape{fleet: f, prompts: prompts, want: func(int, WorkerID) int { return 128 }}
		}},
		{"2048x8", func(b *testing.B) *scoreShape { return newScoreShapeFull(b, 8, 16, 2048, 8192) }},
		{"15000x96", func(b *testing.B) *scoreShape { return newScoreShapeDepths(b, 96, 15000) }},
	}
	for _, sh := range shapes {
		b.Run(sh.name, func(b *testing.B) {
			s := sh.make(b)
			m, _ := s.ix.Model(benchModel)
			allow := allowModel(s.ix, m)
			root := uint64(RootKey(benchModel, ""))
			n := len(s.prompts[0]) / benchBS
			keys := make([]Key, 0, n)
			fdst := make([]uint64, 0, n)
			dst := make([]Match, 0, len(s.ws))
			runtime.GC()
			lat := make(latencies, 0, b.N)
			mlat := make(latencies, 0, b.N)
			floor := make(latencies, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				p := s.prompts[i%len(s.prompts)]
				t0 := time.Now()
				keys = PromptKeys(benchModel, benchBS, p, nil, keys[:0])
				dst = s.ix.Match(keys, allow, dst[:0])
				t1 := time.Now()
				fdst = floorKeys(p, benchBS, root, fdst[:0])
				t2 := time.Now()
				lat = append(lat, int64(t1.Sub(t0)))
				floor = append(floor, int64(t2.Sub(t1)))
			}
			// Match alone, on the keys of each prompt, in a pass of its own
			// (a clock read between PromptKeys and Match would add to the
			// Score measured above).
			pkeys := make([][]Key, len(s.prompts))
			for i, p := range s.prompts {
				pkeys[i] = PromptKeys(benchModel, benchBS, p, nil, nil)
			}
			for i := range min(b.N, 10000) {
				t0 := time.Now()
				s.ix.Match(pkeys[i%len(pkeys)], allow, dst[:0])
				mlat = append(mlat, int64(time.Since(t0)))
			}
			b.StopTimer()
			if len(dst) != len(s.ws) {
				b.Fatalf("%d matches, want %d", len(dst), len(s.ws))
			}
			last := (b.N - 1) % len(s.prompts)
			for _, d := range dst {
				if want := s.want(last, d.Worker); d.Blocks != want {
					b.Fatalf("worker %d matched %d blocks, want %d", d.Worker, d.Blocks, want)
				}
			}
			// Without extra keys, a prompt's keys are the floor's hashes.
			if !slices.EqualFunc(keys, fdst, func(k Key, h uint64) bool { return uint64(k) == h }) {
				b.Fatal("the floor computed other keys")
			}
			lat.report(b, "")
			b.ReportMetric(mlat.pct(0.5), "match-p50-ns")
			f := floor.pct(0.5)
			b.ReportMetric(f, "floor-p50-ns")
			b.ReportMetric(lat.pct(0.5)/f, "ratio")
		})
	}
}
