package fleet

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/defaults"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// ErrKeyScheme: an agent computes content keys with another scheme than
// this replica, so its blocks could never match this replica's prompts.
var ErrKeyScheme = errors.New("fleet: agent's key scheme differs")

// Replicas is a replica's natsbus.WorkerSet over its index: each
// registered worker becomes a keyed worker fed by snapshots and deltas.
type Replicas struct {
	ix  *indexer.Index
	log *slog.Logger
}

// NewReplicas returns the worker set of ix.
func NewReplicas(ix *indexer.Index, log *slog.Logger) *Replicas {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	return &Replicas{ix: ix, log: log}
}

// AddWorker implements natsbus.WorkerSet: the model is added with the
// agent's block size when the index does not have it; a different block
// size or key scheme refuses the worker (its blocks would never match).
func (r *Replicas) AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (natsbus.KeyedSink, error) {
	if reg.GetKeyScheme() != indexer.KeyScheme {
		return nil, fmt.Errorf("%w: worker %s uses %q, this replica %q", ErrKeyScheme, ref, reg.GetKeyScheme(), indexer.KeyScheme)
	}
	if _, err := r.ix.AddModel(reg.GetModel(), int(reg.GetBlockSize())); err != nil {
		return nil, fmt.Errorf("fleet: worker %s: %w", ref, err)
	}
	w, err := r.ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: reg.GetModel(), Endpoint: "nats:" + reg.GetDeltaSubject(), Keyed: true})
	if err != nil {
		return nil, fmt.Errorf("fleet: worker %s: %w", ref, err)
	}
	return &replicaSink{w: w}, nil
}

// RemoveWorker implements natsbus.WorkerSet.
func (r *Replicas) RemoveWorker(ref events.WorkerRef) {
	if err := r.ix.RemoveWorker(ref); err != nil {
		r.log.Warn("removing a fleet worker", "worker", ref.String(), "err", err)
	}
}

// replicaSink feeds one keyed worker. Its methods run on the transport's
// goroutine for the worker, one at a time.
type replicaSink struct {
	w   *indexer.Worker
	d   indexer.Delta
	seg indexer.SnapshotSegment
}

// ApplyDelta implements natsbus.KeyedSink.
func (s *replicaSink) ApplyDelta(seq uint64, d *events.Delta) error {
	fromWire(d, seq, &s.d)
	return s.w.ApplyDelta(&s.d)
}

// Restore implements natsbus.KeyedSink: each segment in the index's binary
// encoding.
func (s *replicaSink) Restore(next func() ([]byte, error)) error {
	return s.w.Restore(func() (*indexer.SnapshotSegment, error) {
		b, err := next()
		if err != nil {
			return nil, err
		}
		if err := s.seg.UnmarshalBinary(b); err != nil {
			return nil, err
		}
		return &s.seg, nil
	})
}

// Reset implements natsbus.KeyedSink.
func (s *replicaSink) Reset(reason string) { s.w.Reset(reason) }
