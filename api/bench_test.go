package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// benchWorkers and benchBlocks shape the benchmark fleet: 8 workers, a
// 128-block (2048-token) prompt; worker i holds the first 16*(i+1) blocks,
// so every Score walks all 128 blocks with 1 to 8 holders per block.
const (
	benchWorkers = 8
	benchBlocks  = 128
)

func newBenchIndex(b *testing.B) (*indexer.Index, []uint32) {
	b.Helper()
	ix := indexer.New(indexer.Config{})
	mustModel(b, ix, "m")
	p := prompt(1, benchBlocks)
	for i := range benchWorkers {
		w := mustWorker(b, ix, "m", fmt.Sprintf("pod-%d", i), 0)
		n := benchBlocks * (i + 1) / benchWorkers
		apply(b, w, stored(uint64(i)<<32, p, 0, n))
	}
	return ix, p
}

// BenchmarkScoreGRPC is a router's view: one Score over real gRPC on TCP
// loopback, client and server in one process.
func BenchmarkScoreGRPC(b *testing.B) {
	ix, p := newBenchIndex(b)
	f := serve(b, ix, nil, api.Options{})
	req := &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := f.client.Score(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if len(resp.GetWorkers()) != benchWorkers {
			b.Fatalf("got %d workers", len(resp.GetWorkers()))
		}
	}
	b.ReportMetric(float64(benchBlocks), "blocks/op")
}

// BenchmarkScoreGRPCParallel is BenchmarkScoreGRPC with concurrent callers.
func BenchmarkScoreGRPCParallel(b *testing.B) {
	ix, p := newBenchIndex(b)
	f := serve(b, ix, nil, api.Options{})
	req := &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := f.client.Score(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkScoreInProcess is the server's own share of a Score: the
// handler called directly, without gRPC, marshalling or network.
func BenchmarkScoreInProcess(b *testing.B) {
	for _, mode := range []string{"token_ids", "block_keys", "metrics_tenant"} {
		b.Run(mode, func(b *testing.B) {
			ix, p := newBenchIndex(b)
			opts := api.Options{}
			if mode == "metrics_tenant" {
				// The hit-ratio metrics and a tenant label on the hot path.
				opts.Registerer = prometheus.NewRegistry()
			}
			s := api.NewServer(ix, nil, opts)
			req := &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}
			if mode == "metrics_tenant" {
				req.Tenant = "team-a"
			}
			if mode == "block_keys" {
				req = &kvindexv1.ScoreRequest{Model: "m"}
				for _, k := range indexer.PromptKeys("m", blockSize, p, nil, nil) {
					req.BlockKeys = append(req.BlockKeys, uint64(k))
				}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.Score(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(benchBlocks), "blocks/op")
		})
	}
}

// TestScoreAllocations pins the hot path's allocation count: the response
// slabs only, however many workers and blocks.
func TestScoreAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not stable under the race detector")
	}
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	p := prompt(1, benchBlocks)
	for i := range benchWorkers {
		w := mustWorker(t, ix, "m", fmt.Sprintf("pod-%d", i), 0)
		apply(t, w, stored(uint64(i)<<32, p, 0, benchBlocks*(i+1)/benchWorkers))
	}
	s := api.NewServer(ix, nil, api.Options{})
	// A server with its metrics counts each answer's predicted hit per
	// worker and tenant, resolved once.
	sm := api.NewServer(ix, nil, api.Options{Registerer: prometheus.NewRegistry()})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := sm.Score(ctx, &kvindexv1.ScoreRequest{Model: "m", TokenIds: p, Tenant: "team-a"}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 7 {
		t.Errorf("Score with metrics and a tenant allocates %.1f times, want <= 7", allocs)
	}
	for _, req := range []*kvindexv1.ScoreRequest{
		{Model: "m", TokenIds: p},
		{Model: "m", TokenIds: p, LoraName: "l", CacheSalt: "s"},
		{Model: "m", TokenIds: p, Workers: []*kvindexv1.WorkerRef{ref("pod-1", 0), ref("pod-7", 0)}},
	} {
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := s.Score(ctx, req); err != nil {
				t.Fatal(err)
			}
		})
		// 7 slabs (response, scores, refs, loads, score pointers, media,
		// media pointers); nothing per block or per worker.
		if allocs > 7 {
			t.Errorf("Score(lora %q, %d candidates) allocates %.1f times, want <= 7", req.LoraName, len(req.Workers), allocs)
		}
	}
}

// BenchmarkScoreJSON is a script's or non-Go router's view of Score: the
// request marshalled to JSON, POSTed over HTTP/1.1 on TCP loopback to
// HTTPHandler, the JSON answer read and decoded; each iteration also runs
// BenchmarkScoreGRPC's call, in turn, so that both means (json-ns,
// grpc-ns) and their ratio come from the same run on the same machine
// state.
func BenchmarkScoreJSON(b *testing.B) {
	ix, p := newBenchIndex(b)
	f := serve(b, ix, nil, api.Options{})
	url := serveHTTP(b, f.srv, nil) + "/kvindex.v1.IndexService/Score"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	req := &kvindexv1.ScoreRequest{Model: "m", TokenIds: p}
	ctx := context.Background()
	var jsonTime, grpcTime time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		body, err := protojson.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var got kvindexv1.ScoreResponse
		if err == nil {
			err = protojson.Unmarshal(out, &got)
		}
		if err != nil || resp.StatusCode != http.StatusOK || len(got.GetWorkers()) != benchWorkers {
			b.Fatalf("HTTP %d %.200s (%v), want %d workers", resp.StatusCode, out, err, benchWorkers)
		}
		mid := time.Now()
		if r, err := f.client.Score(ctx, req); err != nil || len(r.GetWorkers()) != benchWorkers {
			b.Fatalf("gRPC: %v", err)
		}
		jsonTime += mid.Sub(start)
		grpcTime += time.Since(mid)
	}
	n := float64(b.N)
	b.ReportMetric(float64(jsonTime.Nanoseconds())/n, "json-ns")
	b.ReportMetric(float64(grpcTime.Nanoseconds())/n, "grpc-ns")
	b.ReportMetric(float64(jsonTime)/float64(grpcTime), "ratio")
}
