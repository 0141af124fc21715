package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// serveIndex serves an index over gRPC on loopback: model "llama" (block
// size 4) with pod-a/0 holding the 3 blocks of tokens 1..12 on GPU and the
// first 2 also on CPU, and pod-b/0 holding the first block.
func serveIndex(t *testing.T) string {
	t.Helper()
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel("llama", 4); err != nil {
		t.Fatal(err)
	}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	for _, w := range []struct {
		pod    string
		blocks int
	}{{"pod-a", 3}, {"pod-b", 1}} {
		wk, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: w.pod}, Model: "llama", Endpoint: "tcp://" + w.pod + ":5557"})
		if err != nil {
			t.Fatal(err)
		}
		hashes := []uint64{11, 12, 13}[:w.blocks]
		evs := []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens[:4*w.blocks], BlockSize: 4}}
		if w.pod == "pod-a" {
			evs = append(evs, events.Event{Kind: events.KindBlockStored, BlockHashes: hashes[:2], Medium: events.MediumCPU})
		}
		if err := wk.ApplyBatch(&events.Batch{Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	api.NewServer(ix, nil, api.Options{}).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// kvindexctl runs the CLI in-process and returns its exit code and output.
func kvindexctl(stdin string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// squash collapses runs of spaces so that assertions ignore column widths.
func squash(s string) string {
	var ls []string
	for _, l := range strings.Split(s, "\n") {
		ls = append(ls, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(ls, "\n")
}

func TestKvindexctlAgainstServer(t *testing.T) {
	addr := serveIndex(t)

	code, out, errOut := kvindexctl("", "--addr", addr, "score", "--model", "llama", "--tokens", "1,2,3,4,5,6,7,8,9,10,11,12,13")
	if code != 0 {
		t.Fatalf("score exited %d: %s", code, errOut)
	}
	t.Logf("kvindexctl score:\n%s", out)
	for _, want := range []string{
		"model: llama",
		"block size: 4 tokens",
		"prompt blocks: 3 (12 of 13 tokens in full blocks)",
		"WORKER MATCHED BLOCKS MATCHED TOKENS % OF PROMPT BY MEDIUM",
		"pod-a/0 3 12 100.0% GPU 3, CPU 2",
		"pod-b/0 1 4 33.3% GPU 1",
	} {
		if !strings.Contains(squash(out), want) {
			t.Errorf("score output lacks %q:\n%s", want, out)
		}
	}

	// Candidates from stdin tokens; the JSON form is protojson.
	code, out, errOut = kvindexctl("[1,2,3,4]", "--addr", addr, "--json", "score", "--model", "llama", "--tokens-file", "-", "--worker", "pod-b/0")
	if code != 0 {
		t.Fatalf("score --json exited %d: %s", code, errOut)
	}
	var resp struct {
		PromptBlocks int `json:"promptBlocks"`
		Workers      []struct {
			Worker        struct{ Pod string }
			MatchedBlocks int `json:"matchedBlocks"`
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("score --json output is not JSON: %v\n%s", err, out)
	}
	if resp.PromptBlocks != 1 || len(resp.Workers) != 1 || resp.Workers[0].Worker.Pod != "pod-b" || resp.Workers[0].MatchedBlocks != 1 {
		t.Errorf("score --json: %s", out)
	}

	code, out, errOut = kvindexctl("", "--addr", addr, "workers")
	if code != 0 {
		t.Fatalf("workers exited %d: %s", code, errOut)
	}
	t.Logf("kvindexctl workers:\n%s", out)
	for _, want := range []string{
		"WORKER MODEL ENDPOINT HEALTH SEQ LAST EVENT RESIDENT GAPS REPLAYS RESTARTS CLEARS ERRORS ORPHANS",
		"pod-a/0 llama tcp://pod-a:5557 UNKNOWN - just now 3 (GPU 3, CPU 2) 0 - 0 0 0 0",
		"pod-b/0 llama tcp://pod-b:5557 UNKNOWN - just now 1 0 - 0 0 0 0",
	} {
		if !strings.Contains(squash(out), want) {
			t.Errorf("workers output lacks %q:\n%s", want, out)
		}
	}

	// Server errors print the code and the server's message; exit code 1.
	code, out, errOut = kvindexctl("", "--addr", addr, "score", "--model", "gpt", "--tokens", "1")
	if code != 1 || out != "" {
		t.Errorf("score of an unknown model exited %d with output %q", code, out)
	}
	if want := "kvindexctl: score at " + addr + `: InvalidArgument: model: unknown model "gpt"; known: llama`; strings.TrimSpace(errOut) != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
	code, _, errOut = kvindexctl("", "--addr", addr, "score", "--model", "llama", "--tokens", "1", "--worker", "pod-z/0")
	if code != 1 || !strings.Contains(errOut, `InvalidArgument: workers[0]: unknown worker pod-z/0`) {
		t.Errorf("unknown candidate: exit %d, stderr %q", code, errOut)
	}
}

// serveAuthIndex serves serveIndex's index behind bearer tokens ("reader"
// with the read scope, "router" with route only) and at most one Watch.
func serveAuthIndex(t *testing.T) (string, *indexer.Index) {
	t.Helper()
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel("llama", 4); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "pod-a"}, Model: "llama"}); err != nil {
		t.Fatal(err)
	}
	auth, err := api.NewAuth([]api.Token{{Name: "reader", Secret: "r-secret", Scopes: api.ScopeRead}, {Name: "router", Secret: "x-secret", Scopes: api.ScopeRoute}}, api.AuthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(auth.ServerOptions()...)
	api.NewServer(ix, nil, api.Options{MaxWatches: 1}).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String(), ix
}

// TestKvindexctlRefusals: an unreachable server, a missing token, a token
// without the read scope, and a server at its limit of watches each give
// the server's code and what to do about it; the read scope covers the
// inspection calls.
func TestKvindexctlRefusals(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	code, _, errOut := kvindexctl("", "--addr", deadAddr, "--timeout", "2s", "dump", "--worker", "pod-a/0")
	if code != 1 || !strings.Contains(errOut, "dump at "+deadAddr+": Unavailable") || !strings.Contains(errOut, "the server cannot be reached: check --addr") {
		t.Errorf("unreachable: exit %d, stderr %q", code, errOut)
	}

	addr, ix := serveAuthIndex(t)
	t.Setenv("KVINDEX_TOKEN", "")
	code, _, errOut = kvindexctl("", "--addr", addr, "lookup", "--model", "llama", "--tokens", "1,2,3,4")
	if code != 1 || !strings.Contains(errOut, "lookup at "+addr+": Unauthenticated") || !strings.Contains(errOut, "give --token-file or $KVINDEX_TOKEN") {
		t.Errorf("no token: exit %d, stderr %q", code, errOut)
	}
	t.Setenv("KVINDEX_TOKEN", "x-secret")
	code, _, errOut = kvindexctl("", "--addr", addr, "diagnose", "--model", "llama", "--tokens", "1,2,3,4", "--worker", "pod-a/0")
	if code != 1 || !strings.Contains(errOut, "diagnose at "+addr+": PermissionDenied") || !strings.Contains(errOut, "lacks the scope") {
		t.Errorf("route-only token: exit %d, stderr %q", code, errOut)
	}
	t.Setenv("KVINDEX_TOKEN", "r-secret")
	for _, args := range [][]string{
		{"lookup", "--model", "llama", "--tokens", "1,2,3,4"},
		{"dump", "--worker", "pod-a/0"},
		{"diagnose", "--model", "llama", "--tokens", "1,2,3,4", "--worker", "pod-a/0"},
		{"top", "--iterations", "1"},
	} {
		if code, _, errOut := kvindexctl("", append([]string{"--addr", addr}, args...)...); code != 0 {
			t.Errorf("read token, %s: exit %d, stderr %q", args[0], code, errOut)
		}
	}
	// One watch open; a second is refused ResourceExhausted.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var out, errOut bytes.Buffer
		run(ctx, []string{"--addr", addr, "watch"}, strings.NewReader(""), &out, &errOut)
	}()
	for deadline := time.Now().Add(5 * time.Second); ix.NumObservers() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first watch did not register")
		}
	}
	code, _, errOut = kvindexctl("", "--addr", addr, "watch", "--count", "1")
	if !strings.Contains(errOut, "watch at "+addr+": ResourceExhausted: watch: the server's limit of 1 concurrent watches is reached") || !strings.Contains(errOut, "retry later") {
		t.Errorf("second watch: exit %d, stderr %q", code, errOut)
	}
	cancel()
	<-done
}

// TestHealth: `kvindexctl health` exits 0 while the server is SERVING and
// 1 once it drains (NOT_SERVING), as a container health check needs;
// --http checks an agent's /healthz.
func TestHealth(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv := api.NewServer(indexer.New(indexer.Config{}), nil, api.Options{})
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	addr := lis.Addr().String()

	code, out, errOut := kvindexctl("", "--addr", addr, "health")
	if code != 0 || strings.TrimSpace(out) != "SERVING" {
		t.Fatalf("health of a serving server: exit %d, %q %q", code, out, errOut)
	}
	srv.Health().Shutdown()
	code, out, errOut = kvindexctl("", "--addr", addr, "health")
	if code != 1 || strings.TrimSpace(out) != "NOT_SERVING" || !strings.Contains(errOut, "not serving") {
		t.Fatalf("health of a draining server: exit %d, %q %q", code, out, errOut)
	}
	code, _, errOut = kvindexctl("", "--addr", "127.0.0.1:1", "--timeout", "2s", "health")
	if code != 1 || !strings.Contains(errOut, "health at 127.0.0.1:1") {
		t.Fatalf("health of nothing: exit %d, %q", code, errOut)
	}

	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	defer ok.Close()
	if code, out, errOut := kvindexctl("", "health", "--http", ok.URL+"/healthz"); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("--http healthy: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := kvindexctl("", "health", "--http", ok.URL+"/nope"); code != 1 || !strings.Contains(errOut, "404") {
		t.Fatalf("--http 404: exit %d, %q", code, errOut)
	}
}
