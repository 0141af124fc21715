// Package benchsuite holds only benchmarks that cross package boundaries,
// such as decoding vLLM payloads (events) and applying them to the index
// (indexer) on one goroutine. It has no non-test code: it exists so that
// such benchmarks can import both packages without an import cycle, while
// each package's own benchmarks stay beside the code they measure.
//
// `make bench` (scripts/bench.sh) runs these with the other target
// benchmarks and compares the results against the project's targets.
package benchsuite
