package indexer

// Benchmarks of the fleet primitives (docs/benchmarks.md, "Fleet
// primitives"): recorded apply against plain apply, keyed apply, and
// snapshots, restores and digests of a 30,000-block worker:
//
//	go test -run '^$' -bench 'ApplyBatchDelta|ApplyDelta|Snapshot|Restore|Digest' -count 6 ./indexer

import (
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
)

// BenchmarkApplyBatchDelta is the cost of recording: BenchmarkApply's
// stream applied, batch by batch, to two workers in the same state, one
// with ApplyBatch and one with ApplyBatchDelta into a reused Delta, each
// call timed, on one core. Pairing the calls keeps the ratio clear of
// the machine's drift and of other load, which move both alike.
// plain-ns and recorded-ns are per batch (about 80 stored and 80 removed
// blocks); ratio is recorded over plain.
func BenchmarkApplyBatchDelta(b *testing.B) {
	const ring, window = 1280, 1024
	s := newApplyStream(1, ring, window, 0, false)
	plain, recorded := newFleet(b, 1, Config{}).ws[0], newFleet(b, 1, Config{}).ws[0]
	var batch events.Batch
	var d Delta
	for i := range s.batches {
		_ = plain.ApplyBatch(s.fill(i, &batch))
		_ = recorded.ApplyBatch(s.fill(i, &batch))
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var tPlain, tRecorded time.Duration
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; b.Loop(); n++ {
		// Each call's events are in cache for the one after it: the two
		// take turns going first.
		for k := range 2 {
			t0 := time.Now()
			var err error
			if (n+k)%2 == 0 {
				err = plain.ApplyBatch(s.fill(i, &batch))
				tPlain += time.Since(t0)
			} else {
				d.Reset()
				err = recorded.ApplyBatchDelta(s.fill(i, &batch), &d)
				tRecorded += time.Since(t0)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if i++; i == len(s.batches) {
			i = 0
		}
	}
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N), "plain-ns")
	b.ReportMetric(float64(tRecorded.Nanoseconds())/float64(b.N), "recorded-ns")
	b.ReportMetric(float64(tRecorded)/float64(tPlain), "ratio")
	if plain.Digest() != recorded.Digest() {
		b.Fatal("the two workers' digests differ")
	}
}

// deltaRing is one lap of BenchmarkApply's stream in its steady state, as
// the deltas its source recorded, and a keyed replica that applied the
// laps before: applying the ring again and again keeps the replica in the
// steady state (the lap ends where it began).
type deltaRing struct {
	deltas []Delta
	stores []int // OpStores per delta
	rep    *Worker
}

func newDeltaRing(b *testing.B, window int) *deltaRing {
	const ring = 1280
	s := newApplyStream(1, ring, window, 0, false)
	f := newFleet(b, 1, Config{})
	rf := newFleet(b, 0, Config{})
	rep, err := rf.ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "replica"}, Model: benchModel, Keyed: true})
	if err != nil {
		b.Fatal(err)
	}
	r := &deltaRing{deltas: make([]Delta, ring), stores: make([]int, ring), rep: rep}
	var batch events.Batch
	for lap := range 2 {
		for i := range s.batches {
			d := &r.deltas[i]
			d.Reset()
			d.Seq = uint64(lap*ring + i + 1)
			_ = f.ws[0].ApplyBatchDelta(s.fill(i, &batch), d)
			if err := rep.ApplyDelta(d); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := range r.deltas {
		for _, e := range r.deltas[i].Entries {
			if e.Op == OpStore {
				r.stores[i]++
			}
		}
	}
	if f.ws[0].Digest() != rep.Digest() {
		b.Fatal("the replica's digest differs from its source's")
	}
	return r
}

// BenchmarkApplyDelta is keyed apply on one core: a replica applying the
// deltas of BenchmarkApply's stream (about 80 k resident blocks), each
// about 80 stores of new blocks and 80 removals. blocks/s counts stores,
// their removals applied in the same time, as BenchmarkApply's does.
func BenchmarkApplyDelta(b *testing.B) {
	r := newDeltaRing(b, 1024)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	blocks, i := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := r.rep.ApplyDelta(&r.deltas[i]); err != nil {
			b.Fatal(err)
		}
		blocks += r.stores[i]
		if i++; i == len(r.deltas) {
			i = 0
		}
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	if n := r.rep.Stats().DeltaMismatches; n != 0 {
		b.Fatalf("%d mismatches", n)
	}
}

// worker30k returns a worker holding BenchmarkApply's stream's steady
// state with a window of 375 batches: about 30,000 blocks in chains of 4
// to 16 blocks continued half the time (so about one key in six starts a
// branch).
func worker30k(b *testing.B) *Worker {
	const ring, window = 1280, 375
	s := newApplyStream(1, ring, window, 0, false)
	f := newFleet(b, 1, Config{})
	var batch events.Batch
	for i := range s.batches {
		_ = f.ws[0].ApplyBatch(s.fill(i, &batch))
	}
	if n := f.ws[0].Stats().ResidentBlocks; n < 28000 || n > 32000 {
		b.Fatalf("the worker holds %d blocks, want about 30,000", n)
	}
	return f.ws[0]
}

// BenchmarkSnapshot is the snapshot of a 30,000-block worker, each
// segment encoded (AppendBinary) into a reused buffer. bytes/block is the
// encoding's size per resident block.
func BenchmarkSnapshot(b *testing.B) {
	w := worker30k(b)
	blocks := w.Stats().ResidentBlocks
	var buf []byte
	size := 0
	emit := func(s *SnapshotSegment) error {
		var err error
		buf, err = s.AppendBinary(buf[:0])
		size += len(buf)
		return err
	}
	b.ReportAllocs()
	for b.Loop() {
		size = 0
		if err := w.Snapshot(emit); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size)/float64(blocks), "bytes/block")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
}

// BenchmarkRestore is the restore of a 30,000-block worker's snapshot,
// decoded from its encoding (UnmarshalBinary into a reused segment), into
// a keyed worker of another index, which each restore replaces.
func BenchmarkRestore(b *testing.B) {
	w := worker30k(b)
	blocks := w.Stats().ResidentBlocks
	var encoded [][]byte
	if err := w.Snapshot(func(s *SnapshotSegment) error {
		e, err := s.AppendBinary(nil)
		encoded = append(encoded, e)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	rf := newFleet(b, 0, Config{})
	rep, err := rf.ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "replica"}, Model: benchModel, Keyed: true})
	if err != nil {
		b.Fatal(err)
	}
	var seg SnapshotSegment
	b.ReportAllocs()
	for b.Loop() {
		i := 0
		err := rep.Restore(func() (*SnapshotSegment, error) {
			if i == len(encoded) {
				return nil, io.EOF
			}
			i++
			return &seg, seg.UnmarshalBinary(encoded[i-1])
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
	if rep.Digest() != w.Digest() {
		b.Fatal("the restored digest differs from its source's")
	}
}

// BenchmarkDigest is the digest of a 30,000-block worker fed engine
// events, and of a keyed replica of it.
func BenchmarkDigest(b *testing.B) {
	w := worker30k(b)
	rf := newFleet(b, 0, Config{})
	rep, err := rf.ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "replica"}, Model: benchModel, Keyed: true})
	if err != nil {
		b.Fatal(err)
	}
	var segs []*SnapshotSegment
	if err := w.Snapshot(func(s *SnapshotSegment) error {
		c := *s
		segs = append(segs, &c)
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	if err := rep.Restore(segmentsOf(segs)); err != nil {
		b.Fatal(err)
	}
	blocks := w.Stats().ResidentBlocks
	for _, tc := range []struct {
		name string
		w    *Worker
	}{{"engine", w}, {"keyed", rep}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = tc.w.Digest()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
		})
	}
}
