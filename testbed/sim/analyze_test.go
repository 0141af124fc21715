package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

func TestReuseCeilingByHand(t *testing.T) {
	toks := func(n int, base uint32) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = base + uint32(i)
		}
		return out
	}
	shared := toks(64, 0)
	w := &workload.Workload{Name: "hand", Requests: []workload.Request{
		workload.FromTokens(0, append(append([]uint32(nil), shared...), toks(16, 1000)...), 1),
		workload.FromTokens(time.Minute, append(append([]uint32(nil), shared...), toks(16, 2000)...), 1),
		workload.FromTokens(20*time.Minute, append(append([]uint32(nil), shared...), toks(32, 3000)...), 1),
	}}
	r := ReuseCeiling(w, 16, 10*time.Minute)
	// The second request reuses the 64 shared tokens within a minute; the
	// third 20 minutes after the last sighting: ever, not in the window.
	if r.PromptTokens != 80+80+96 || r.Window != 64 || r.Ever != 128 {
		t.Fatalf("reuse %+v, want 256 prompt tokens, 64 within 10 minutes, 128 ever", r)
	}
}

func TestVerdict(t *testing.T) {
	res := func(name string, hit float64, p99 time.Duration) metrics.Result {
		return metrics.Result{Router: name, PromptTokens: 1000, CachedTokens: int64(hit * 1000), TTFTP99: p99}
	}
	point := func(blocks int, rr, pl float64, rrP99, plP99 time.Duration) SweepPoint {
		return SweepPoint{CacheBlocks: blocks, Results: []metrics.Result{res("round-robin", rr, rrP99), res("precise", pl, plP99), res("precise+load", pl, plP99)}}
	}
	for _, tc := range []struct {
		reuse  Reuse
		points []SweepPoint
		want   string
	}{
		{Reuse{PromptTokens: 100, Window: 4}, nil, "no: only 4.0%"},
		{Reuse{PromptTokens: 100, Window: 40}, []SweepPoint{point(1000, 0.1, 0.12, time.Second, time.Second)}, "marginal:"},
		{Reuse{PromptTokens: 100, Window: 40}, []SweepPoint{point(1000, 0.1, 0.3, time.Second, 1200*time.Millisecond)}, "marginal:"},
		{Reuse{PromptTokens: 100, Window: 40}, []SweepPoint{point(2000, 0.2, 0.22, time.Second, time.Second), point(1000, 0.1, 0.3, time.Second, 800*time.Millisecond)},
			"yes: at 1000 blocks per engine precise+load caches 30.0% of prompt tokens (round-robin 10.0%, ceiling 40.0% within 10m0s) with p99 TTFT 0.80s (round-robin 1.00s)"},
	} {
		if got := Verdict(tc.reuse, 10*time.Minute, tc.points); !strings.HasPrefix(got, tc.want) {
			t.Errorf("verdict %q, want %q...", got, tc.want)
		}
	}
}

func TestVLLMTokenizer(t *testing.T) {
	var got map[string]json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil || r.URL.Path != "/tokenize" {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"tokens": [7, 8, 9], "count": 3, "max_model_len": 8192}`)
	}))
	defer srv.Close()
	tok := VLLMTokenizer(srv.URL+"/tokenize", srv.Client())
	ids, err := tok(json.RawMessage(`{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}`))
	if err != nil || len(ids) != 3 || ids[2] != 9 {
		t.Fatalf("tokens %v, %v", ids, err)
	}
	if _, ok := got["max_tokens"]; ok || string(got["model"]) != `"m"` || got["messages"] == nil {
		t.Errorf("posted %v, want model and messages only", got)
	}
	if _, err := VLLMTokenizer(srv.URL+"/nope", srv.Client())(json.RawMessage(`{"prompt": "x"}`)); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("a failing endpoint: %v", err)
	}
}

// TestAnalyzeEndToEnd writes a token log in which every request repeats
// one of 8 long system prompts, drawn at random, and checks the report
// and its verdict: with caches that hold one prompt, round-robin
// thrashes and precise+load partitions the prompts.
func TestAnalyzeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log.jsonl")
	var b bytes.Buffer
	for i := range 300 {
		sys := make([]uint32, 2048)
		for k := range sys {
			sys[k] = uint32(workload.Mix64(uint64(i))%8*100000) + uint32(k)
		}
		q := []uint32{uint32(1_000_000 + i), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
		line, _ := json.Marshal(map[string]any{"timestamp": i * 50, "token_ids": append(sys, q...), "output_length": 16})
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ac := AnalyzeConfig{Log: path, Sizes: []int{4096, 256}, Options: Options{Engines: 4, Engine: engine.Config{}}}
	if err := Analyze(context.Background(), ac, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Log(s)
	// 292 of 300 requests reuse 2,048 of 2,064 tokens: 96.6%.
	wants := []string{"log: 300 requests", "within 10m0s: 96.6%", "round-robin", "precise+load", "p99 TTFT:", "verdict: yes: at 256 blocks per engine"}
	for _, want := range append(wants, router.Peers...) {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	ac.Log = filepath.Join(dir, "other.jsonl")
	if err := os.WriteFile(ac.Log, []byte(`{"timestamp": 0, "text": "x"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Analyze(context.Background(), ac, &out); err == nil || !strings.Contains(err.Error(), "none of hash_ids") {
		t.Errorf("a log of an unknown format: %v", err)
	}
}
