package fleetbench

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvindex/kvindex/events"
)

// Shape is one worker's engine stream: a ring of Ring batches, each a
// vLLM scheduler step, that repeats forever and keeps the worker at a
// steady resident set.
//
// Batch i, in the order vLLM emits its events: one BlockRemoved per GPU
// block stored Window batches earlier (vLLM evicts a cached block when it
// reuses its slot, one event per block); Requests BlockStored events of
// MinBlocks to MaxBlocks newly full blocks of BlockSize tokens on GPU,
// each request continuing its chain from the batch before half of the
// time (its parent named, as vLLM does) and starting a new sequence
// otherwise; the offload to CPU (a BlockStored with medium CPU and no
// tokens) of the blocks of every OffloadEvery-th request of OffloadDelay
// batches earlier; and one BlockRemoved per CPU block offloaded CPUWindow
// batches before. So about (Window + CPUWindow/OffloadEvery) batches'
// blocks are resident.
type Shape struct {
	Ring, Window         int
	Requests             int
	MinBlocks, MaxBlocks int
	BlockSize            int
	OffloadEvery         int // 0: no offload
	OffloadDelay         int
	CPUWindow            int
}

// DefaultShape is the stream of the benchmarks: 8 requests a step of 4
// to 16 blocks (80 stored blocks a batch on average, as
// testbed/benchsuite's stream), kept on GPU for 330 steps; a quarter of
// the requests offloaded to CPU two steps after their store and kept
// there 480 steps (the CPU tier outlives the GPU one): about 29,000
// resident blocks, 3,000 of them on CPU only.
func DefaultShape() Shape {
	return Shape{Ring: 640, Window: 330, Requests: 8, MinBlocks: 4, MaxBlocks: 16, BlockSize: 16,
		OffloadEvery: 4, OffloadDelay: 2, CPUWindow: 480}
}

func (s Shape) validate() error {
	switch {
	case s.Requests <= 0 || s.MinBlocks <= 0 || s.MaxBlocks < s.MinBlocks || s.BlockSize <= 0:
		return fmt.Errorf("fleetbench: shape %+v: requests, blocks and block size must be positive", s)
	case s.Window <= 1 || s.Window >= s.Ring:
		return fmt.Errorf("fleetbench: shape %+v: the window must be between 2 and the ring", s)
	case s.OffloadEvery > 0 && (s.OffloadDelay < 1 || s.OffloadDelay >= s.Window || s.OffloadDelay+s.CPUWindow >= s.Ring || s.CPUWindow < 1):
		return fmt.Errorf("fleetbench: shape %+v: offload delay must be under the window, and delay plus CPU window under the ring", s)
	}
	return nil
}

// Workload is one worker's stream of Shape, generated once from a seed:
// distinct seeds give disjoint content (every sequence starts with a block
// of its own tokens), so workers share no keys.
type Workload struct {
	shape   Shape
	pool    []uint32
	batches []compactBatch
	Stored  []int // GPU blocks stored by each batch (what blocks/s counts)
}

// compactStore is one request's BlockStored; its tokens are its own first
// block when it starts a sequence, then the pool from off.
type compactStore struct {
	hashes    []uint64
	parent    uint64
	hasParent bool
	head      []uint32
	off       int
	offload   bool
}

// compactBatch is one ring position, in event order.
type compactBatch struct {
	removeGPU []uint64
	stores    []compactStore
	offloads  []*compactStore
	removeCPU []uint64
}

// NewWorkload generates the ring of shape from seed.
func NewWorkload(shape Shape, seed uint64) (*Workload, error) {
	if err := shape.validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, 0x6b76696e646578))
	const vocab = 151000
	w := &Workload{shape: shape, pool: make([]uint32, 1<<16), batches: make([]compactBatch, shape.Ring), Stored: make([]int, shape.Ring)}
	for i := range w.pool {
		w.pool[i] = uint32(r.IntN(vocab))
	}
	hash := seed << 32
	tails := make([]uint64, shape.Requests)
	bs := shape.BlockSize
	for i := range w.batches {
		b := &w.batches[i]
		b.stores = make([]compactStore, shape.Requests)
		for slot := range b.stores {
			st := &b.stores[slot]
			nb := shape.MinBlocks + r.IntN(shape.MaxBlocks-shape.MinBlocks+1)
			// Batch 0 starts every chain, so that the ring's laps are
			// identical.
			if i > 0 && r.IntN(2) == 0 {
				st.parent, st.hasParent = tails[slot], true
			} else {
				st.head = make([]uint32, bs)
				for k := range st.head {
					st.head[k] = uint32(r.IntN(vocab))
				}
			}
			st.hashes = make([]uint64, nb)
			for k := range st.hashes {
				hash++
				st.hashes[k] = hash*0x9e3779b97f4a7c15 | 1<<63
			}
			st.off = r.IntN(len(w.pool) - nb*bs)
			st.offload = shape.OffloadEvery > 0 && slot%shape.OffloadEvery == 0
			tails[slot] = st.hashes[nb-1]
			w.Stored[i] += nb
		}
	}
	n := shape.Ring
	for i := range w.batches {
		b := &w.batches[i]
		for _, st := range w.batches[(i-shape.Window+n)%n].stores {
			b.removeGPU = append(b.removeGPU, st.hashes...)
		}
		if shape.OffloadEvery == 0 {
			continue
		}
		for k := range w.batches[(i-shape.OffloadDelay+n)%n].stores {
			if st := &w.batches[(i-shape.OffloadDelay+n)%n].stores[k]; st.offload {
				b.offloads = append(b.offloads, st)
			}
		}
		for _, st := range w.batches[(i-shape.OffloadDelay-shape.CPUWindow+n)%n].stores {
			if st.offload {
				b.removeCPU = append(b.removeCPU, st.hashes...)
			}
		}
	}
	return w, nil
}

// Len is the ring's length in batches.
func (w *Workload) Len() int { return len(w.batches) }

// Filler fills Batches from a Workload, reusing its memory: the batch it
// fills is valid until the next Fill.
type Filler struct {
	b      events.Batch
	tokens []uint32
}

// Fill returns batch i of the ring in lap lap (from 0) with timestamp
// ts, in f's memory. In lap 0 the events that name blocks of batches
// before the stream's start are left out, so that a worker fed the stream
// from its start sees no unknown block. Cost: a copy of the batch's token
// ids (about 5 KB), no allocation once f has grown.
func (f *Filler) Fill(w *Workload, i, lap int, ts float64) *events.Batch {
	cb := &w.batches[i]
	sh := &w.shape
	first := lap == 0
	bs := w.shape.BlockSize
	total := 0
	for _, st := range cb.stores {
		total += len(st.hashes) * bs
	}
	if cap(f.tokens) < total {
		f.tokens = make([]uint32, total)
	}
	tokens := f.tokens[:0]
	evs := f.b.Events[:0]
	add := func(ev events.Event) { evs = append(evs, ev) }
	for k := range cb.removeGPU {
		if first && i < sh.Window {
			break
		}
		add(events.Event{Kind: events.KindBlockRemoved, BlockHashes: cb.removeGPU[k : k+1 : k+1], MediumName: "GPU", HasGroupIdx: true})
	}
	for k := range cb.stores {
		st := &cb.stores[k]
		start := len(tokens)
		if st.head != nil {
			tokens = append(tokens, st.head...)
			tokens = append(tokens, w.pool[st.off+bs:st.off+len(st.hashes)*bs]...)
		} else {
			tokens = append(tokens, w.pool[st.off:st.off+len(st.hashes)*bs]...)
		}
		add(events.Event{Kind: events.KindBlockStored, BlockHashes: st.hashes, ParentHash: st.parent, HasParent: st.hasParent,
			TokenIDs: tokens[start:len(tokens):len(tokens)], BlockSize: bs, MediumName: "GPU", HasGroupIdx: true, SpecKind: "full_attention"})
	}
	for _, st := range cb.offloads {
		if first && i < sh.OffloadDelay {
			break
		}
		add(events.Event{Kind: events.KindBlockStored, BlockHashes: st.hashes, ParentHash: st.parent, HasParent: st.hasParent,
			BlockSize: bs, Medium: events.MediumCPU, MediumName: "CPU", HasGroupIdx: true, SpecKind: "full_attention"})
	}
	for k := range cb.removeCPU {
		if first && i < sh.OffloadDelay+sh.CPUWindow {
			break
		}
		add(events.Event{Kind: events.KindBlockRemoved, BlockHashes: cb.removeCPU[k : k+1 : k+1], Medium: events.MediumCPU, MediumName: "CPU", HasGroupIdx: true})
	}
	f.tokens = tokens[:0]
	f.b = events.Batch{Timestamp: ts, Events: evs, HasDPRank: true}
	return &f.b
}
