package indexer

// Benchmarks of checkpoints (docs/benchmarks.md, "Fleet primitives"): a
// 30,000-block worker's checkpoint and its restore:
//
//	go test -run '^$' -bench 'Checkpoint' -benchmem -count 6 ./indexer

import (
	"io"
	"testing"
)

// BenchmarkCheckpoint is the checkpoint of a 30,000-block worker (see
// worker30k), each segment encoded (AppendBinary) into a reused buffer.
// bytes/block is the encoding's size per resident block.
func BenchmarkCheckpoint(b *testing.B) {
	w := worker30k(b)
	blocks := w.Stats().ResidentBlocks
	var buf []byte
	size := 0
	emit := func(s *CheckpointSegment) error {
		var err error
		buf, err = s.AppendBinary(buf[:0])
		size += len(buf)
		return err
	}
	b.ReportAllocs()
	for b.Loop() {
		size = 0
		if err := w.Checkpoint(emit); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size)/float64(blocks), "bytes/block")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
}

// BenchmarkRestoreCheckpoint is the restore of a 30,000-block worker's
// checkpoint, decoded from its encoding (UnmarshalBinary into a reused
// segment), into a worker of another index, which each restore replaces
// (so each also clears the 30,000 blocks the last one restored, as a
// restore into a running worker would; an agent restores into empty
// workers, which skips that).
func BenchmarkRestoreCheckpoint(b *testing.B) {
	w := worker30k(b)
	blocks := w.Stats().ResidentBlocks
	var encoded [][]byte
	if err := w.Checkpoint(func(s *CheckpointSegment) error {
		e, err := s.AppendBinary(nil)
		encoded = append(encoded, e)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	rw := newFleet(b, 1, Config{}).ws[0]
	var seg CheckpointSegment
	b.ReportAllocs()
	for b.Loop() {
		i := 0
		err := rw.RestoreCheckpoint(func() (*CheckpointSegment, error) {
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
	if rw.Digest() != w.Digest() {
		b.Fatal("the restored digest differs from its source's")
	}
}
