package indexer

import (
	"runtime"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
)

// BenchmarkApplyFloor is BenchmarkApply (apply with removals, a warm
// worker of about 80 k blocks, one core) beside its floor, batch by batch
// in the same loop: a Go map from each stored block's hash to its parent's,
// holding the same window of blocks, into which the floor inserts the
// batch's stored hashes and from which it deletes its removed ones. The
// floor is the least any index of engine hashes pays per event: one map
// write per block stored and one per block removed, with no content key,
// no holder set and no removal record. It reports apply-blocks/s,
// floor-blocks/s and ratio, the first over the second (higher is better;
// 1 would be apply at the cost of a bare map).
func BenchmarkApplyFloor(b *testing.B) {
	const ring, window = 1280, 1024
	s := newApplyStream(1, ring, window, 0, false)
	f := newFleet(b, 1, Config{})
	w := f.ws[0]
	floor := make(map[uint64]uint64)
	floorApply := func(batch *events.Batch) {
		for i := range batch.Events {
			ev := &batch.Events[i]
			if ev.Kind == events.KindBlockRemoved {
				for _, h := range ev.BlockHashes {
					delete(floor, h)
				}
				continue
			}
			parent := ev.ParentHash
			for _, h := range ev.BlockHashes {
				floor[h] = parent
				parent = h
			}
		}
	}
	var batch events.Batch
	for i := range s.batches {
		_ = w.ApplyBatch(s.fill(i, &batch)) // the first lap removes blocks not stored yet
		floorApply(&batch)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	runtime.GC()
	var applyNS, floorNS time.Duration
	blocks, i := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s.fill(i, &batch)
		t0 := time.Now()
		if err := w.ApplyBatch(&batch); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		floorApply(&batch)
		t2 := time.Now()
		applyNS += t1.Sub(t0)
		floorNS += t2.Sub(t1)
		blocks += s.stored[i]
		if i++; i == len(s.batches) {
			i = 0
		}
	}
	b.StopTimer()
	if got, fl := w.Stats().ResidentBlocks, len(floor); got != int64(fl) {
		b.Fatalf("worker holds %d blocks, the floor's map %d: they applied different batches", got, fl)
	}
	ar := float64(blocks) / applyNS.Seconds()
	fr := float64(blocks) / floorNS.Seconds()
	b.ReportMetric(ar, "apply-blocks/s")
	b.ReportMetric(fr, "floor-blocks/s")
	b.ReportMetric(ar/fr, "ratio")
}
