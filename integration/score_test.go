package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

var encodings = []struct {
	name string
	enc  events.EncodeOptions
}{
	{"array-era", events.EncodeOptions{Encoding: events.EncodingArray}},
	{"map-era", events.EncodeOptions{Encoding: events.EncodingMap}},
}

// TestStoreRemoveClear follows one worker's prompt through BlockStored,
// BlockRemoved of a middle block, and AllBlocksCleared, in both event
// encodings, checking Score's exact answer after each.
func TestStoreRemoveClear(t *testing.T) {
	for _, e := range encodings {
		t.Run(e.name, func(t *testing.T) {
			f := startFleet(t, podSpec{name: "a", enc: e.enc})
			var eng engine
			prompt := tokens("system prompt and question", 8*blockSize+5) // 8 full blocks
			// The engine announces the prompt in two steps, the second
			// naming the first's last block as parent.
			ev1, h1 := eng.store(0, prompt[:3*blockSize])
			ev2, h2 := eng.store(h1[2], prompt[3*blockSize:8*blockSize])
			f.publish("a", 0, ev1)
			f.publish("a", 0, ev2)

			resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
			if resp.GetBlockSize() != blockSize || resp.GetPromptBlocks() != 8 {
				t.Fatalf("block_size %d prompt_blocks %d, want %d 8", resp.GetBlockSize(), resp.GetPromptBlocks(), blockSize)
			}
			if n, by := matched(resp, "a", 0); n != 8 || by["GPU"] != 8 {
				t.Fatalf("after store: %d blocks %v, want 8 on GPU", n, by)
			}
			// A longer prompt with the same prefix still matches 8 blocks.
			longer := concat(prompt[:8*blockSize], tokens("follow-up", 4*blockSize))
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: longer}), "a", 0); n != 8 {
				t.Fatalf("longer prompt matched %d, want 8", n)
			}

			// Evicting block 5 (in the second event) cuts the prefix to 5.
			f.publish("a", 0, removed(h2[2]))
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "a", 0); n != 5 {
				t.Fatalf("after removing block 5: %d, want 5", n)
			}
			// Evicting block 0 leaves nothing consecutive from the start.
			f.publish("a", 0, removed(h1[0]))
			resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
			if n, _ := matched(resp, "a", 0); n != 0 || len(resp.GetWorkers()) != 0 {
				t.Fatalf("after removing block 0: %d (%d workers listed), want none", n, len(resp.GetWorkers()))
			}
			// Recomputing block 0 (a new engine hash, the same content)
			// reconnects blocks 1-4, which stayed cached: keys are content
			// addressed, as vLLM's own prefix lookup is.
			ev0, _ := eng.store(0, prompt[:blockSize])
			f.publish("a", 0, ev0)
			if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "a", 0); n != 5 {
				t.Fatalf("after re-store of block 0: %d, want 5", n)
			}
			f.publish("a", 0, cleared)
			resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
			if len(resp.GetWorkers()) != 0 {
				t.Fatalf("after AllBlocksCleared: %v, want no worker", resp.GetWorkers())
			}
			// Listed as a candidate, the cleared worker shows zero.
			resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, Workers: []*kvindexv1.WorkerRef{{Pod: "a"}}})
			if len(resp.GetWorkers()) != 1 || resp.GetWorkers()[0].GetMatchedBlocks() != 0 {
				t.Fatalf("candidate after clear: %v", resp.GetWorkers())
			}
			lw, err := f.client.ListWorkers(t.Context(), &kvindexv1.ListWorkersRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(lw.GetWorkers()) != 1 {
				t.Fatalf("ListWorkers: %v", lw)
			}
			w := lw.GetWorkers()[0]
			if w.GetLastSeq() != 5 || w.GetResidentBlocks() != 0 || w.GetBlocksStored() != 9 || w.GetBlocksRemoved() != 2 || w.GetClears() != 1 || w.GetGaps() != 0 || w.GetDecodeErrors() != 0 {
				t.Fatalf("ListWorkers: %v", w)
			}
		})
	}
}

// TestTwoWorkersDifferentPrefixes: two workers hold different-length
// prefixes of the same prompt, a third holds another prompt.
func TestTwoWorkersDifferentPrefixes(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"}, podSpec{name: "b", enc: events.EncodeOptions{Encoding: events.EncodingArray, ArrayFields: 6}}, podSpec{name: "c"})
	var ea, eb, ec engine
	prompt := tokens("shared prompt", 10*blockSize)
	evA, _ := ea.store(0, prompt[:10*blockSize])
	evB, _ := eb.store(0, prompt[:4*blockSize])
	evC, _ := ec.store(0, tokens("something else", 6*blockSize))
	f.publish("a", 0, evA)
	f.publish("b", 0, evB)
	f.publish("c", 0, evC)

	resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
	if len(resp.GetWorkers()) != 2 {
		t.Fatalf("workers = %v, want a and b only", resp.GetWorkers())
	}
	// Ranked by matched blocks, longest first.
	if resp.GetWorkers()[0].GetWorker().GetPod() != "a" || resp.GetWorkers()[0].GetMatchedBlocks() != 10 ||
		resp.GetWorkers()[1].GetWorker().GetPod() != "b" || resp.GetWorkers()[1].GetMatchedBlocks() != 4 {
		t.Fatalf("workers = %v, want a:10 then b:4", resp.GetWorkers())
	}
	if resp.GetWorkers()[1].GetMatchedTokens() != 4*blockSize {
		t.Fatalf("b matched tokens %d", resp.GetWorkers()[1].GetMatchedTokens())
	}
	// Candidate filter: only b and c, c with zero.
	resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, Workers: []*kvindexv1.WorkerRef{{Pod: "c"}, {Pod: "b"}}})
	if n, _ := matched(resp, "a", 0); n != 0 || len(resp.GetWorkers()) != 2 {
		t.Fatalf("filtered: %v", resp.GetWorkers())
	}
	if n, _ := matched(resp, "b", 0); n != 4 {
		t.Fatalf("filtered b: %d", n)
	}
	// A prompt of another model matches nothing.
	resp = f.score(&kvindexv1.ScoreRequest{Model: "other/model", TokenIds: prompt})
	if len(resp.GetWorkers()) != 0 {
		t.Fatalf("other model: %v", resp.GetWorkers())
	}
}

// TestLoRAPromptVsBase: a LoRA worker's blocks match only LoRA prompts, a
// base worker's only base prompts, even with identical tokens.
func TestLoRAPromptVsBase(t *testing.T) {
	f := startFleet(t, podSpec{name: "base"}, podSpec{name: "lora", enc: events.EncodeOptions{Encoding: events.EncodingMap}})
	var eb, el engine
	prompt := tokens("same tokens", 3*blockSize)
	evBase, _ := eb.store(0, prompt)
	evLoRA, _ := el.store(0, prompt)
	evLoRA.LoRAName, evLoRA.LoRAID, evLoRA.HasLoRAID = "sql-adapter", 1, true
	evLoRA.ExtraKeys = make([]events.ExtraKeys, 3)
	for i := range evLoRA.ExtraKeys {
		evLoRA.ExtraKeys[i] = events.AppendString(events.AppendTuple(nil, 1), "sql-adapter")
	}
	f.publish("base", 0, evBase)
	f.publish("lora", 0, evLoRA)

	resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompt})
	if n, _ := matched(resp, "base", 0); n != 3 || len(resp.GetWorkers()) != 1 {
		t.Fatalf("base prompt: %v, want base:3 only", resp.GetWorkers())
	}
	resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, LoraName: "sql-adapter"})
	if n, _ := matched(resp, "lora", 0); n != 3 || len(resp.GetWorkers()) != 1 {
		t.Fatalf("lora prompt: %v, want lora:3 only", resp.GetWorkers())
	}
	resp = f.score(&kvindexv1.ScoreRequest{TokenIds: prompt, LoraName: "other-adapter"})
	if len(resp.GetWorkers()) != 0 {
		t.Fatalf("other adapter: %v", resp.GetWorkers())
	}
}

// TestDPPodTwoRanks: a pod with dp_size 2 publishes on port and port+1;
// each rank is its own worker.
func TestDPPodTwoRanks(t *testing.T) {
	f := startFleet(t, podSpec{name: "dp", dpSize: 2})
	var e0, e1 engine
	p0 := tokens("rank zero prompt", 5*blockSize)
	p1 := tokens("rank one prompt", 2*blockSize)
	ev0, _ := e0.store(0, p0)
	ev1, _ := e1.store(0, p1)
	f.publish("dp", 0, ev0)
	f.publish("dp", 1, ev1)
	resp := f.score(&kvindexv1.ScoreRequest{TokenIds: p0})
	if n, _ := matched(resp, "dp", 0); n != 5 || len(resp.GetWorkers()) != 1 {
		t.Fatalf("rank 0 prompt: %v", resp.GetWorkers())
	}
	resp = f.score(&kvindexv1.ScoreRequest{TokenIds: p1})
	if n, _ := matched(resp, "dp", 1); n != 2 || len(resp.GetWorkers()) != 1 {
		t.Fatalf("rank 1 prompt: %v", resp.GetWorkers())
	}
	lw, err := f.client.ListWorkers(t.Context(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(lw.GetWorkers()) != 2 {
		t.Fatalf("ListWorkers: %d workers, want 2", len(lw.GetWorkers()))
	}
	for _, w := range lw.GetWorkers() {
		want := map[uint32]uint64{0: 5, 1: 2}[w.GetWorker().GetDpRank()]
		if w.GetResidentBlocks() != want {
			t.Fatalf("rank %d resident %d, want %d", w.GetWorker().GetDpRank(), w.GetResidentBlocks(), want)
		}
	}
}

// TestBadInputGapsAndRestarts: a malformed message is counted and skipped
// without disturbing the next one; a seq gap is counted; a seq that goes
// back to 0 (engine restart) clears the worker. All visible in ListWorkers
// and /metrics.
func TestBadInputGapsAndRestarts(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"}, podSpec{name: "b"})
	var ea, eb engine
	prompt := tokens("prompt", 4*blockSize)
	evA, _ := ea.store(0, prompt)
	evB, _ := eb.store(0, prompt)
	f.publish("a", 0, evA)
	f.publish("b", 0, evB)

	pub := f.pods["a"].pubs[0]
	f.send("a", 0, func(p *enginepub.Publisher) (uint64, error) {
		return p.PublishRaw([]byte{0x93, 0xcb, 0x41}) // truncated envelope
	})
	pub.SetSeq(10) // messages 2..9 lost, and a has no replay endpoint
	second := tokens("second prompt", 2*blockSize)
	more, _ := ea.store(0, second)
	f.publish("a", 0, more)
	// The default gap policy (reset) forgets what a held before the loss:
	// lost removals could have left any of it wrong.
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "a", 0); n != 0 {
		t.Fatalf("after an unrecoverable gap, a still matches %d, want 0 (reset)", n)
	}
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: second}), "a", 0); n != 2 {
		t.Fatalf("after the gap, a matches %d of what came after it, want 2", n)
	}
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "b", 0); n != 4 {
		t.Fatalf("b disturbed: %d", n)
	}
	// Engine restart: seq back to 0 clears what a held before.
	pub.SetSeq(0)
	fresh, _ := ea.store(0, tokens("after restart", blockSize))
	f.publish("a", 0, fresh)
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "a", 0); n != 0 {
		t.Fatalf("after restart a still matches %d", n)
	}
	lw, err := f.client.ListWorkers(t.Context(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range lw.GetWorkers() {
		switch w.GetWorker().GetPod() {
		case "a":
			if w.GetDecodeErrors() != 1 || w.GetGaps() != 1 || w.GetMissedBatches() != 8 || w.GetUnrecoveredGaps() != 1 || w.GetRestarts() != 1 || w.GetResets() != 2 || w.GetResidentBlocks() != 1 || w.GetLastError() == "" {
				t.Fatalf("a: %v", w)
			}
		case "b":
			if w.GetDecodeErrors() != 0 || w.GetGaps() != 0 || w.GetResidentBlocks() != 4 {
				t.Fatalf("b: %v", w)
			}
		}
	}
	m := f.metrics()
	for _, want := range []string{
		`kvindex_decode_errors_total{dp_rank="0",model="test/model",pod="a"} 1`,
		`kvindex_seq_gaps_total{dp_rank="0",model="test/model",pod="a"} 1`,
		`kvindex_missed_batches_total{dp_rank="0",model="test/model",pod="a"} 8`,
		`kvindex_engine_restarts_total{dp_rank="0",model="test/model",pod="a"} 1`,
		`kvindex_resident_blocks{dp_rank="0",medium="GPU",model="test/model",pod="b"} 4`,
		`kvindex_blocks_stored_total{dp_rank="0",model="test/model",pod="a"} 7`,
		`kvindex_score_duration_seconds_count`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestDaemonBinaryServesAndStopsOnSIGTERM builds cmd/kvindex, runs `serve`
// with a config file, checks that gRPC answers, and that SIGTERM stops it
// cleanly with exit status 0.
func TestDaemonBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvindex")
	ctl := filepath.Join(dir, "kvindexctl")
	for out, pkg := range map[string]string{bin: "../cmd/kvindex", ctl: "../cmd/kvindexctl"} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	grpcPort := freePorts(t, 1)
	cfg := filepath.Join(dir, "kvindex.yaml")
	text, err := config.Marshal(&config.Config{
		GRPCListen:    "127.0.0.1:" + strconv.Itoa(grpcPort),
		MetricsListen: config.MetricsOff,
		Pods:          []config.Pod{{Name: "p", Model: "m", Endpoint: "tcp://127.0.0.1:" + strconv.Itoa(freePorts(t, 1))}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, text, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfg, "--log-format", "json")
	var logs syncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var ok bool
	for i := 0; i < 200 && !ok; i++ {
		out, err := exec.Command(ctl, "--addr", "127.0.0.1:"+strconv.Itoa(grpcPort), "workers").CombinedOutput()
		if err == nil && strings.Contains(string(out), "p/0") {
			ok = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !ok {
		t.Fatalf("kvindexctl workers never listed p/0; daemon logs:\n%s", logs.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("daemon ignored SIGTERM\n%s", logs.String())
	}
	if !regexp.MustCompile(`"msg":"kvindex shutting down"`).MatchString(logs.String()) {
		t.Fatalf("no shutdown log:\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a child process's output goroutine
// and the test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSubscriberReconnectsAfterEngineRestart: the engine's socket closes and
// a new engine process binds the same port with seq starting again at 0;
// the subscriber reconnects by itself, counts the restart, and the index
// holds only what the new engine announced.
func TestSubscriberReconnectsAfterEngineRestart(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"})
	var eng engine
	before := tokens("before restart", 3*blockSize)
	ev, _ := eng.store(0, before)
	f.publish("a", 0, ev)
	f.publish("a", 0, ev) // seq 1, so that the new engine's seq 0 goes back

	old := f.pods["a"].pubs[0]
	endpoint := f.d.Index().LookupWorker(events.WorkerRef{Pod: "a"}).Info().Endpoint
	old.Close()
	var pub *enginepub.Publisher
	var err error
	for i := 0; i < 100; i++ { // the port may take a moment to free
		if pub, err = enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: endpoint, Topic: "kv@a@" + model, Bind: true}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	f.pods["a"].pubs[0] = pub
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatalf("subscriber did not reconnect: %v", err)
	}
	after := tokens("after restart", 2*blockSize)
	ev2, _ := eng.store(0, after)
	f.publish("a", 0, ev2)

	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: before}), "a", 0); n != 0 {
		t.Fatalf("blocks from before the restart still match: %d", n)
	}
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: after}), "a", 0); n != 2 {
		t.Fatalf("after restart: %d, want 2", n)
	}
	st := f.d.Index().LookupWorker(events.WorkerRef{Pod: "a"}).Stats()
	if st.Resets != 1 || st.ResidentBlocks != 2 {
		t.Fatalf("index stats after restart: %+v", st)
	}
}
