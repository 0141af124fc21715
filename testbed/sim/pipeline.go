package sim

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/engine"
)

// pipeline is kvindex in process: the real decoder, index and scorer,
// without sockets. Engines' batches are encoded with events.AppendPayload
// exactly as vLLM sends them, decoded with events.Decoder and applied with
// indexer.Worker.ApplyBatch, as the daemon's subscriber does; routers call
// scoring.Scorer, the entry the gRPC server answers with.
type pipeline struct {
	ix      *indexer.Index
	workers []*indexer.Worker
	scorer  *scoring.Scorer
	wire    events.EncodeOptions
	dec     *events.Decoder
	batch   events.Batch
	buf     []byte

	decodeErrors, applyErrors int64
	batches                   int64
	firstErr                  error
}

// simEpoch is the wall-clock instant virtual time 0 maps to for kvindex's
// tracker (any fixed instant works: only differences matter).
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newPipeline builds the in-process kvindex. now, when set, is kvindex's
// clock (virtual time), so that speculative blocks and in-flight load
// expire in simulated seconds.
func newPipeline(o *Options, now func() time.Duration) (*pipeline, error) {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(o.Model, o.Engine.BlockSize); err != nil {
		return nil, fmt.Errorf("sim: kvindex: %w", err)
	}
	p := &pipeline{ix: ix, wire: o.Wire, dec: events.NewDecoder()}
	for i := range o.Engines {
		w, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(i)}, Model: o.Model, Endpoint: "in-process"})
		if err != nil {
			return nil, fmt.Errorf("sim: kvindex: %w", err)
		}
		p.workers = append(p.workers, w)
	}
	var clock func() time.Time
	if now != nil {
		clock = func() time.Time { return simEpoch.Add(now()) }
	}
	pol := scoring.DefaultPolicy()
	pol.Cost = CostModel(o.Engine)
	p.scorer = scoring.New(ix, scoring.Options{Policy: &pol, Tracker: scoring.NewTracker(scoring.TrackerOptions{Now: clock})})
	return p, nil
}

// encode returns b as vLLM's msgpack payload. The result is reused by the
// next call unless keep is set.
func (p *pipeline) encode(b *events.Batch, keep bool) ([]byte, error) {
	var err error
	if keep {
		return events.AppendPayload(nil, b, p.wire)
	}
	p.buf, err = events.AppendPayload(p.buf[:0], b, p.wire)
	return p.buf, err
}

// apply decodes one engine's payload and applies it to its worker.
func (p *pipeline) apply(engine int, payload []byte) {
	p.batches++
	if err := p.dec.Decode(payload, &p.batch); err != nil {
		p.decodeErrors++
		p.keepErr(fmt.Errorf("engine %d: decode: %w", engine, err))
		return
	}
	if err := p.workers[engine].ApplyBatch(&p.batch); err != nil {
		p.applyErrors++
		p.keepErr(err)
	}
}

func (p *pipeline) keepErr(err error) {
	if p.firstErr == nil {
		p.firstErr = err
	}
}

// problems counts what the index could not apply exactly, and checks that
// every worker holds as many blocks as its engine has cached (distinct
// hashes). It returns the count and the first problem seen.
func (p *pipeline) problems(f *fleet) (int64, error) {
	n := p.decodeErrors + p.applyErrors
	for i, w := range p.workers {
		s := w.Stats()
		n += s.Orphans + s.UnknownBlocks + s.BlockSizeMismatches + s.InvalidEvents
		if want := int64(f.engines[i].CachedBlocks()); s.ResidentBlocks != want {
			n++
			p.keepErr(fmt.Errorf("engine %d caches %d distinct blocks but kvindex holds %d for it", i, want, s.ResidentBlocks))
		}
	}
	return n, p.firstErr
}

// CostModel is kvindex's cost model calibrated to the simulated
// engines: their time model, step budget and cache size, what an operator
// measures from vLLM's metrics (scoring.Calibrate).
func CostModel(c engine.Config) scoring.CostModel {
	c.Defaults()
	return scoring.CostModel{
		PrefillTokensPerSec:   c.Time.PrefillTokensPerSec,
		AttentionPairsPerSec:  c.Time.AttentionPairsPerSec,
		StepOverhead:          c.Time.StepOverhead,
		DecodePerSeq:          c.Time.DecodePerSeq,
		DecodePerContextToken: c.Time.DecodePerContextToken,
		MaxBatchedTokens:      c.MaxBatchedTokens,
		KVCapacityTokens:      c.CacheBlocks * c.BlockSize,
	}
}
