package fleetbench

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/embednats"
)

// The benchmarks themselves run in make bench (scripts/bench.sh) with
// their processes; these tests keep their parts honest and quick.

// TestWorkloadIsSteady: a recorded lap of the default shape starts and
// ends in the same state (the benchmarks replay laps over and over), its
// deltas store new blocks, and the same seed records the same worker.
func TestWorkloadIsSteady(t *testing.T) {
	w, err := NewWorkload(DefaultShape(), 7)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Record(w, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Record(w, true)
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest || a.Resident != b.Resident || len(a.Deltas) != w.Len() {
		t.Fatalf("two recordings of seed 7: digests %#x %#x, resident %d %d, %d deltas for %d batches", a.Digest, b.Digest, a.Resident, b.Resident, len(a.Deltas), w.Len())
	}
	// About 29,000 resident blocks (DefaultShape's doc), some new blocks in
	// every batch.
	if a.Resident < 20000 || a.Resident > 40000 || a.Keys < int(a.Resident) {
		t.Fatalf("resident %d, keys %d", a.Resident, a.Keys)
	}
	blocks := 0
	for _, n := range a.Blocks {
		blocks += n
	}
	if perBatch := float64(blocks) / float64(len(a.Blocks)); perBatch < 40 || perBatch > 120 {
		t.Fatalf("%.1f new blocks a batch, want about 80", perBatch)
	}
	if _, err := NewWorkload(Shape{Ring: 10, Window: 20, Requests: 1, MinBlocks: 1, MaxBlocks: 1, BlockSize: 16}, 1); err == nil {
		t.Fatal("a window past the ring was accepted")
	}
}

// TestWireCountsBytes runs the wire benchmark against its embedded
// nats-server: every case measured, a store and a removal cost a handful
// of bytes each (a key varint and its tag), batching shares the header,
// and NATS's framing is added.
func TestWireCountsBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Wire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Cases) != 4 || r.Subject == "" {
		t.Fatalf("cases %d, subject %q", len(r.Cases), r.Subject)
	}
	byName := map[string]WireCase{}
	for _, c := range r.Cases {
		if c.Deltas == 0 || c.PerStore <= 0 || c.PerRemove <= 0 || c.WirePerStore <= c.PerStore {
			t.Fatalf("case %+v", c)
		}
		byName[c.Name] = c
	}
	one, many := byName["batch 1"], byName["batch 256"]
	if !(many.PerStore < one.PerStore && many.PerStore > 8 && many.PerStore < 12) {
		t.Fatalf("per store: batch 1 %.1f B, batch 256 %.1f B, want 256 near the key's 9 bytes and below 1", one.PerStore, many.PerStore)
	}
}

// TestLagHistQuantile: quantiles are read off the buckets as Prometheus's
// histogram_quantile reads them, after an earlier reading is taken off.
func TestLagHistQuantile(t *testing.T) {
	h := &lagHist{Bounds: []float64{0.001, 0.002, 0.005}, Counts: []float64{10, 60, 100, 100}}
	before := &lagHist{Bounds: h.Bounds, Counts: []float64{10, 10, 10, 10}}
	if err := h.add(before, -1); err != nil { // 50 in (1, 2] ms, 40 in (2, 5] ms
		t.Fatal(err)
	}
	if got := h.quantile(0.5); got != 1900*time.Microsecond {
		t.Fatalf("p50 %v, want 1.9ms", got)
	}
	// rank 89.1 of 90: 2 ms + 3 ms x 39.1/40
	if got := h.quantile(0.99); got < 4932*time.Microsecond || got > 4933*time.Microsecond {
		t.Fatalf("p99 %v, want 4.9325ms", got)
	}
	if got := (&lagHist{}).quantile(0.99); got != 0 {
		t.Fatalf("empty: %v", got)
	}
}

// TestForwarderFloor runs the lag floor's parts in process, over real
// ZeroMQ and a real nats-server: every engine batch sent is forwarded
// once and received once by the subscriber, with its engine timestamp
// read (a lag recorded per frame, none unreadable).
func TestForwarderFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := embednats.Start("fleetbench-test")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	es, err := startEngines(3, DefaultShape(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer closeEngines(es)
	fw, err := startForwarders(ctx, ns.URL(), ports(es))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := connect(ns.URL(), "fleetbench test subscriber")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var s sink
	if _, err := nc.Subscribe(floorSubject+">", s.handle); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	s.lag.start(0)
	if err := waitSubscribed(ctx, es, 1); err != nil {
		t.Fatal(err)
	}
	const batches = 300
	if _, err := playEngines(ctx, es, batches, 1e6); err != nil {
		t.Fatal(err)
	}
	if err := waitCaughtUp(ctx, &localSide{fw: fw}, true, es, batches); err != nil {
		t.Fatal(err)
	}
	for s.frames.Load() < batches {
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			t.Fatalf("the subscriber got %d of %d frames: %v", s.frames.Load(), batches, err)
		}
	}
	if err := fw.stop(); err != nil {
		t.Fatal(err)
	}
	r := s.lag.report(s.frames.Load())
	if got := fw.forwarded.Load(); got != batches || fw.failed.Load() != 0 {
		t.Errorf("forwarded %d (%d failed), want %d", got, fw.failed.Load(), batches)
	}
	if s.frames.Load() != batches || r.Deltas != batches || s.bad.Load() != 0 {
		t.Errorf("subscriber: %d frames, %d lags recorded, %d unreadable; want %d, %d, 0", s.frames.Load(), r.Deltas, s.bad.Load(), batches, batches)
	}
	if r.P50 <= 0 || r.P50 > r.Max || r.Max > time.Minute {
		t.Errorf("lag p50 %v, max %v", r.P50, r.Max)
	}
}

// TestBatchTime reads the timestamp of an encoded batch and refuses what
// is not one.
func TestBatchTime(t *testing.T) {
	b, err := events.AppendPayload(nil, &events.Batch{Timestamp: 1234.5}, events.EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ts, err := batchTime(b); err != nil || ts != 1234.5 {
		t.Fatalf("timestamp %v (%v), want 1234.5", ts, err)
	}
	for _, bad := range [][]byte{nil, {0x93}, {0x93, 0xca, 0, 0, 0, 0, 0, 0, 0, 0}, {0x81, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := batchTime(bad); err == nil {
			t.Errorf("% x: read as a batch", bad)
		}
	}
}

// TestMedianDuration: odd and even counts, and none.
func TestMedianDuration(t *testing.T) {
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{{nil, 0}, {[]time.Duration{3, 1, 2}, 2}, {[]time.Duration{4, 1, 3, 2}, 2}} {
		if got := medianDuration(tc.in); got != tc.want {
			t.Errorf("median of %v: %v, want %v", tc.in, got, tc.want)
		}
	}
}
