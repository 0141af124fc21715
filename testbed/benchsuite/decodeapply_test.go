package benchsuite

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// stream is a pre-encoded, endlessly repeatable feed of one worker's
// payloads: a ring of batches in which batch i stores fresh blocks and
// removes the blocks batch i-window stored, so that after one warm-up lap
// the worker holds a steady window batches' worth of blocks and every
// event applies cleanly.
type stream struct {
	payloads [][]byte
	stored   []int // blocks stored by each payload
	resident int   // blocks the worker holds in the steady state
}

// Shape of a realistic vLLM scheduler step (see shared/spec): 8 requests
// each storing 4 to 16 newly full 16-token blocks, chained to earlier
// blocks of the same request, and one BlockRemoved per evicted block (vLLM
// emits them one by one as it reuses free cached blocks).
const (
	blockSize      = 16
	eventsPerBatch = 8
	minBlocks      = 4
	maxBlocks      = 16
	// Token ids are uniform over a Qwen/Llama-3 sized vocabulary: a random
	// mix of msgpack uint16 and uint32 forms, the decoder's worst case
	// (real text, mostly frequent low ids, is more predictable).
	vocab = 151000
)

// newStream builds a ring of n batches in enc with a steady window of
// window batches (window < n).
func newStream(tb testing.TB, n, window int, enc events.Encoding) *stream {
	tb.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	hash := uint64(0)
	nextHash := func() uint64 { hash++; return hash*0x9e3779b97f4a7c15 | 1<<63 }
	// Each of the 8 request slots continues its chain from the previous
	// batch half of the time, and starts a new sequence otherwise.
	var tails [eventsPerBatch]uint64
	hashes := make([][]uint64, n)
	batches := make([]*events.Batch, n)
	s := &stream{payloads: make([][]byte, n), stored: make([]int, n)}
	for i := range batches {
		b := &events.Batch{Timestamp: 1764400000 + float64(i)/100, HasDPRank: true}
		for slot := range eventsPerBatch {
			ev := events.Event{Kind: events.KindBlockStored, BlockSize: blockSize, MediumName: "GPU",
				HasGroupIdx: true, SpecKind: "full_attention"}
			if i > 0 && r.IntN(2) == 0 {
				ev.ParentHash, ev.HasParent = tails[slot], true
			}
			nb := minBlocks + r.IntN(maxBlocks-minBlocks+1)
			for range nb {
				h := nextHash()
				ev.BlockHashes = append(ev.BlockHashes, h)
				for range blockSize {
					ev.TokenIDs = append(ev.TokenIDs, uint32(r.IntN(vocab)))
				}
			}
			tails[slot] = ev.BlockHashes[nb-1]
			hashes[i] = append(hashes[i], ev.BlockHashes...)
			s.stored[i] += nb
			b.Events = append(b.Events, ev)
		}
		batches[i] = b
	}
	for i, b := range batches {
		for _, h := range hashes[(i-window+n)%n] {
			b.Events = append(b.Events, events.Event{Kind: events.KindBlockRemoved,
				BlockHashes: []uint64{h}, MediumName: "GPU", HasGroupIdx: true})
		}
		p, err := events.AppendPayload(nil, b, events.EncodeOptions{Encoding: enc})
		if err != nil {
			tb.Fatalf("encode batch %d: %v", i, err)
		}
		s.payloads[i] = p
	}
	for i := n - window; i < n; i++ {
		s.resident += s.stored[i]
	}
	return s
}

// newWorker returns a worker of a fresh index that has applied one lap of
// s, so that it is in the steady state. The first lap removes blocks not
// stored yet and links to parents not stored yet; those errors are
// expected and ignored.
func newWorker(tb testing.TB, s *stream) *indexer.Worker {
	tb.Helper()
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel("m", blockSize); err != nil {
		tb.Fatal(err)
	}
	w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "pod-0"}, Model: "m"})
	if err != nil {
		tb.Fatal(err)
	}
	d := events.NewDecoder()
	var b events.Batch
	for i, p := range s.payloads {
		if err := d.Decode(p, &b); err != nil {
			tb.Fatalf("warm-up batch %d: %v", i, err)
		}
		_ = w.ApplyBatch(&b)
	}
	return w
}

// TestDecodeApplySteadyState checks the benchmark's premise: after the
// warm-up lap every batch decodes and applies without error, and the
// worker's size stays at the window.
func TestDecodeApplySteadyState(t *testing.T) {
	s := newStream(t, 64, 48, events.EncodingMap)
	w := newWorker(t, s)
	d := events.NewDecoder()
	var b events.Batch
	for lap := range 2 {
		for i, p := range s.payloads {
			if err := d.Decode(p, &b); err != nil {
				t.Fatalf("lap %d batch %d: %v", lap, i, err)
			}
			if err := w.ApplyBatch(&b); err != nil {
				t.Fatalf("lap %d batch %d: %v", lap, i, err)
			}
		}
		if got := w.Stats().ResidentBlocks; got != int64(s.resident) {
			t.Fatalf("lap %d: %d resident blocks, want %d", lap, got, s.resident)
		}
	}
}

// BenchmarkDecodeApply is one worker's ingest path end to end, minus the
// socket: decode a vLLM payload into a reused Batch and apply it to the
// index, on one goroutine with GOMAXPROCS(1) so that the garbage collector
// shares the same core (the target is "one core"). Each batch is a
// realistic scheduler step (8 BlockStored events of 4-16 blocks of 16
// tokens, chained, ~80 blocks) plus one BlockRemoved per evicted block,
// keeping the worker at ~80 k resident blocks. blocks/s counts stored
// blocks; removals are applied in the same time.
func BenchmarkDecodeApply(b *testing.B) {
	const ring, window = 1280, 1024
	for _, enc := range []events.Encoding{events.EncodingMap, events.EncodingArray} {
		b.Run(enc.String(), func(b *testing.B) {
			s := newStream(b, ring, window, enc)
			w := newWorker(b, s)
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			d := events.NewDecoder()
			var batch events.Batch
			bytes, blocks, i := 0, 0, 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				p := s.payloads[i]
				if err := d.Decode(p, &batch); err != nil {
					b.Fatal(err)
				}
				if err := w.ApplyBatch(&batch); err != nil {
					b.Fatal(err)
				}
				bytes += len(p)
				blocks += s.stored[i]
				if i++; i == len(s.payloads) {
					i = 0
				}
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(blocks)/sec, "blocks/s")
			b.ReportMetric(float64(bytes)/sec/1e6, "MB/s")
			if got := w.Stats().ResidentBlocks; got < int64(s.resident)*9/10 || got > int64(s.resident)*11/10 {
				b.Fatalf("worker holds %d blocks, want about %d", got, s.resident)
			}
		})
	}
}

// BenchmarkDecodeOnlyRing is BenchmarkDecodeApply without the apply, over
// the same payloads: the decoder's share of the ingest path.
func BenchmarkDecodeOnlyRing(b *testing.B) {
	s := newStream(b, 1280, 1024, events.EncodingMap)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	d := events.NewDecoder()
	var batch events.Batch
	blocks, i := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Decode(s.payloads[i], &batch); err != nil {
			b.Fatal(err)
		}
		blocks += s.stored[i]
		if i++; i == len(s.payloads) {
			i = 0
		}
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}
