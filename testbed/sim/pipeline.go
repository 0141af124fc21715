package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/engine"
)

// pipeline is kvindex in process without sockets: batches are encoded as
// vLLM sends them, decoded and applied as the daemon's subscriber does,
// and routers call the scorer the gRPC server answers with.
type pipeline struct {
	workers []*indexer.Worker
	scorer  *scoring.Scorer
	wire    events.EncodeOptions
	dec     *events.Decoder
	batch   events.Batch
	buf     []byte

	decodeErrors int64 // payloads that failed to decode
	firstErr     error // the first decode or apply error
}

// simEpoch is virtual time 0 on kvindex's tracker's clock (any instant).
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newPipeline builds the in-process kvindex on the clock now (virtual
// time), so that speculative blocks and in-flight load expire in
// simulated seconds.
func newPipeline(o *Options, now func() time.Duration) (*pipeline, error) {
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(o.Model, o.Engine.BlockSize); err != nil {
		return nil, fmt.Errorf("sim: kvindex: %w", err)
	}
	p := &pipeline{wire: o.Wire, dec: events.NewDecoder()}
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
	p.scorer = scoring.New(ix, scoring.Options{Policy: &pol, Tracker: scoring.NewTracker(scoring.TrackerOptions{Now: clock}), NoGroupCaps: o.NoGroupCaps})
	return p, nil
}

// encode returns b as vLLM's msgpack payload, reused by the next call
// unless keep is set.
func (p *pipeline) encode(b *events.Batch, keep bool) ([]byte, error) {
	var err error
	if keep {
		return events.AppendPayload(nil, b, p.wire)
	}
	p.buf, err = events.AppendPayload(p.buf[:0], b, p.wire)
	return p.buf, err
}

func (p *pipeline) apply(engine int, payload []byte) {
	if err := p.dec.Decode(payload, &p.batch); err != nil {
		p.decodeErrors++
		p.keepErr(fmt.Errorf("engine %d: decode: %w", engine, err))
		return
	}
	if err := p.workers[engine].ApplyBatch(&p.batch); err != nil {
		p.keepErr(err) // each failed event is counted by its worker's Stats
	}
}

func (p *pipeline) keepErr(err error) {
	if p.firstErr == nil {
		p.firstErr = err
	}
}

// check counts what the index could not apply exactly and the KV-cache
// groups whose resident blocks differ from their engine's cache.
func (p *pipeline) check(f *fleet) *indexCheck {
	c := &indexCheck{}
	c.add(probDecode, p.decodeErrors)
	if p.firstErr != nil {
		first, _, _ := strings.Cut(p.firstErr.Error(), "\n") // a batch's errors are joined by lines
		c.note("%s", first)
	}
	for i, w := range p.workers {
		s := w.Stats()
		c.addStats(&s)
		c.compareGroups(i, f.engines[i], workerGroups(w.Groups()))
	}
	return c
}

// CostModel is kvindex's cost model calibrated to the simulated engines,
// as an operator measures it from vLLM's metrics (scoring.Calibrate).
func CostModel(c engine.Config) scoring.CostModel {
	c.Defaults()
	return scoring.CostModel{
		PrefillTokensPerSec:   c.Time.PrefillTokensPerSec,
		AttentionPairsPerSec:  c.Time.AttentionPairsPerSec,
		StepOverhead:          c.Time.StepOverhead,
		DecodePerSeq:          c.Time.DecodePerSeq,
		DecodePerContextToken: c.Time.DecodePerContextToken,
		MaxBatchedTokens:      c.MaxBatchedTokens,
		MaxNumSeqs:            c.MaxNumSeqs,
		KVCapacityTokens:      c.CacheBlocks * c.BlockSize,
	}
}
