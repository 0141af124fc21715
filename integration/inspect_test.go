package integration

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func ref(pod string) *kvindexv1.WorkerRef { return &kvindexv1.WorkerRef{Pod: pod} }

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLookupAndDump: Lookup's runs of holders along a prompt held in full
// by one worker and in part by another, over real gRPC; Dump's pages of a
// worker cover its keys once, in order, with ListWorkers' digest.
func TestLookupAndDump(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"}, podSpec{name: "b"})
	var ea, eb engine
	prompt := tokens("lookup", 8*blockSize)
	ev, _ := ea.store(0, prompt)
	f.publish("a", 0, ev)
	ev, _ = eb.store(0, prompt[:3*blockSize])
	f.publish("b", 0, ev)

	resp, err := f.client.Lookup(ctx5(t), &kvindexv1.LookupRequest{Model: model, TokenIds: concat(prompt, tokens("tail", 2*blockSize))})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPromptBlocks() != 10 || resp.GetIndexedBlocks() != 8 || len(resp.GetKeys()) != 10 || resp.GetTruncated() {
		t.Fatalf("prompt_blocks %d indexed %d keys %d truncated %v, want 10 8 10 false", resp.GetPromptBlocks(), resp.GetIndexedBlocks(), len(resp.GetKeys()), resp.GetTruncated())
	}
	type run struct {
		from, to uint32
		holders  string
	}
	var got []run
	for _, r := range resp.GetRuns() {
		var hs []string
		for _, h := range r.GetHolders() {
			hs = append(hs, h.GetWorker().GetPod()+":"+strings.Join(h.GetMedia(), "+")+":"+h.GetHealth().String())
		}
		got = append(got, run{r.GetFirstBlock(), r.GetEndBlock(), strings.Join(hs, ",")})
	}
	want := []run{{0, 3, "a:GPU:WORKER_HEALTH_OK,b:GPU:WORKER_HEALTH_OK"}, {3, 8, "a:GPU:WORKER_HEALTH_OK"}}
	if !slices.Equal(got, want) {
		t.Fatalf("runs %+v, want %+v", got, want)
	}

	var keys []uint64
	token := ""
	pages := 0
	for {
		page, err := f.client.Dump(ctx5(t), &kvindexv1.DumpRequest{Worker: ref("a"), PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if page.GetResidentKeys() != 8 || page.GetModel() != model || page.GetKeyed() {
			t.Fatalf("page %d: resident %d model %q keyed %v", pages, page.GetResidentKeys(), page.GetModel(), page.GetKeyed())
		}
		lw, err := f.client.ListWorkers(ctx5(t), &kvindexv1.ListWorkersRequest{Digests: true})
		if err != nil {
			t.Fatal(err)
		}
		if d := lw.GetWorkers()[0]; d.GetWorker().GetPod() != "a" || d.GetDigest() != page.GetDigest() {
			t.Fatalf("page digest %x, ListWorkers %s %x", page.GetDigest(), d.GetWorker().GetPod(), d.GetDigest())
		}
		for _, b := range page.GetBlocks() {
			keys = append(keys, b.GetKey())
			if !slices.Equal(b.GetMedia(), []string{"GPU"}) {
				t.Fatalf("key %x media %v", b.GetKey(), b.GetMedia())
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	wantKeys := slices.Clone(resp.GetKeys()[:8])
	slices.Sort(wantKeys)
	if pages != 3 || !slices.Equal(keys, wantKeys) {
		t.Fatalf("%d pages with keys %x, want 3 pages with %x", pages, keys, wantKeys)
	}
}

// diagnose asks the daemon, failing the test on an error.
func (f *fleet) diagnose(req *kvindexv1.DiagnoseRequest) *kvindexv1.DiagnoseResponse {
	f.t.Helper()
	if req.Model == "" {
		req.Model = model
	}
	resp, err := f.client.Diagnose(context.Background(), req)
	if err != nil {
		f.t.Fatalf("Diagnose: %v", err)
	}
	return resp
}

// reasons lists a diagnosis's reasons.
func reasons(d *kvindexv1.DiagnoseResponse) []kvindexv1.DiagnoseReason {
	var out []kvindexv1.DiagnoseReason
	for _, x := range d.GetFindings() {
		out = append(out, x.GetReason())
	}
	return out
}

// finding returns the diagnosis's finding of reason r, failing the test
// if there is none.
func finding(t *testing.T, d *kvindexv1.DiagnoseResponse, r kvindexv1.DiagnoseReason) *kvindexv1.DiagnoseFinding {
	t.Helper()
	for _, x := range d.GetFindings() {
		if x.GetReason() == r {
			return x
		}
	}
	t.Fatalf("no %s among %v", r, d.GetFindings())
	return nil
}

// TestDiagnoseReasons reproduces each reason Diagnose gives, each by a
// scenario of engine events over ZeroMQ and a Diagnose over gRPC.
func TestDiagnoseReasons(t *testing.T) {
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Events.StaleAfterSilence = 400 * time.Millisecond }},
		podSpec{name: "a"}, podSpec{name: "b"}, podSpec{name: "o", model: "other/model"}, podSpec{name: "s"})
	f.start()
	var ea, eb, eo, es engine
	prompt := tokens("diagnose", 6*blockSize)
	ev, ha := ea.store(0, prompt)
	f.publish("a", 0, ev)
	ev, _ = eb.store(0, prompt[:2*blockSize])
	f.publish("b", 0, ev)
	ev, _ = eo.store(0, prompt)
	f.publish("o", 0, ev)

	// A hit.
	d := f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("a")})
	if d.GetMatchedBlocks() != 6 || d.GetPromptBlocks() != 6 || reasons(d)[0] != kvindexv1.DiagnoseReason_DIAGNOSE_REASON_HIT {
		t.Fatalf("hit: %v", d)
	}
	// The engine removed block 4: a removal on record, and b holds nothing there.
	f.publish("a", 0, removed(ha[4]))
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("a")})
	if d.GetMatchedBlocks() != 4 || d.GetFirstMissKey() == 0 || reasons(d)[0] != kvindexv1.DiagnoseReason_DIAGNOSE_REASON_REMOVED {
		t.Fatalf("removed: %v", d)
	}
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_REMOVED); x.GetEventTime() == nil || time.Since(x.GetEventTime().AsTime()) > time.Minute {
		t.Fatalf("removed finding's time: %v", x)
	}
	// b misses block 2, which a holds.
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("b")})
	if d.GetMatchedBlocks() != 2 || !strings.Contains(finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_HELD_ELSEWHERE).GetDetail(), "a/0") {
		t.Fatalf("held elsewhere: %v", d)
	}
	finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_NOT_STORED)
	// A worker of another model.
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("o")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_MODEL_DIFFERS); !strings.Contains(x.GetDetail(), `"other/model"`) || !strings.Contains(x.GetDetail(), "holds 6 blocks") {
		t.Fatalf("model differs: %v", x)
	}
	// The request's salt, which the engine did not use.
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, CacheSalt: "tenant-1", Worker: ref("b")})
	if x := reasons(d)[0]; x != kvindexv1.DiagnoseReason_DIAGNOSE_REASON_SALT_DIFFERS || d.GetMatchedBlocks() != 0 {
		t.Fatalf("salt: %v", d)
	}
	// The engine stored under an adapter the request does not name, and
	// the request names one the engine never used.
	ev, _ = es.store(0, prompt)
	ev.LoRAName = "sql-adapter"
	f.publish("s", 0, ev)
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("s")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_LORA_DIFFERS); !strings.Contains(x.GetDetail(), `"sql-adapter"`) || !strings.Contains(x.GetDetail(), "holds 6 blocks") {
		t.Fatalf("lora differs: %v", x)
	}
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, LoraName: "chat-adapter", Worker: ref("s")})
	if x := reasons(d); !slices.Contains(x, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_LORA_DIFFERS) {
		t.Fatalf("lora differs from the request's adapter: %v", d)
	}
	// A cleared cache.
	f.publish("b", 0, cleared)
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("b")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_WORKER_RESET); x.GetEventTime() == nil || !strings.Contains(x.GetDetail(), "cleared") {
		t.Fatalf("reset: %v", x)
	}
	// b's engine now announces 32-token blocks while a and s announce 16:
	// the model keeps 16, b's blocks are kept at 32 and b is flagged.
	bad, _ := eb.store(0, tokens("big blocks", 4*blockSize))
	bad.BlockSize = 2 * blockSize
	bad.BlockHashes = bad.BlockHashes[:2]
	f.publish("b", 0, bad)
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: tokens("big blocks", 4*blockSize), Worker: ref("b")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_BLOCK_SIZE_MISMATCH); !strings.Contains(x.GetDetail(), "keys 32-token blocks, the model's prompts 16-token") {
		t.Fatalf("block size: %v", x)
	}
	if w := f.status("b", 0); w.GetBlockSize() != 32 || w.GetModelBlockSize() != 16 || w.GetResidentBlocks() != 2 {
		t.Fatalf("b's status: block size %d, model's %d, %d blocks; want 32, 16, 2", w.GetBlockSize(), w.GetModelBlockSize(), w.GetResidentBlocks())
	}
	// A prompt shorter than a block.
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt[:5], Worker: ref("a")})
	if reasons(d)[0] != kvindexv1.DiagnoseReason_DIAGNOSE_REASON_PROMPT_TOO_SHORT {
		t.Fatalf("too short: %v", d)
	}
	// o goes silent past the silence limit (the others keep talking).
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, p := range []string{"a", "b", "s"} {
			f.publish(p, 0, cleared)
		}
		d = f.diagnose(&kvindexv1.DiagnoseRequest{Model: "other/model", TokenIds: prompt, Worker: ref("o")})
		if d.GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_STALE || reasons(d)[0] != kvindexv1.DiagnoseReason_DIAGNOSE_REASON_HIT {
		t.Fatalf("stale: %v", d)
	}
	finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_WORKER_STALE)
}

// TestDiagnoseParity: the engine's own block hashes for a prompt against
// kvindex's keys: agreement, another block size, other tokens from a
// block, and another adapter.
func TestDiagnoseParity(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"}, podSpec{name: "l"})
	var ea, el engine
	prompt := tokens("parity", 5*blockSize)
	ev, ha := ea.store(0, prompt)
	f.publish("a", 0, ev)
	parity := func(toks []uint32, hashes []uint64, pod, lora string) *kvindexv1.ParityCheck {
		t.Helper()
		return f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: toks, EngineBlockHashes: hashes, Worker: ref(pod), LoraName: lora}).GetParity()
	}
	if p := parity(prompt, ha, "a", ""); p.GetVerdict() != kvindexv1.ParityVerdict_PARITY_VERDICT_AGREE || p.GetAgreedBlocks() != 5 || p.GetKnownBlocks() != 5 {
		t.Fatalf("agree: %v", p)
	}
	// An engine at block size 32 gives 2 hashes for 80 tokens.
	if p := parity(prompt, ha[:2], "a", ""); p.GetVerdict() != kvindexv1.ParityVerdict_PARITY_VERDICT_BLOCK_SIZE || !strings.Contains(p.GetDetail(), "27 to 40 tokens a block") {
		t.Fatalf("block size: %v", p)
	}
	// The router's tokens differ from token 48 (block 3) on.
	other := concat(prompt[:3*blockSize], tokens("other template", 2*blockSize))
	if p := parity(other, ha, "a", ""); p.GetVerdict() != kvindexv1.ParityVerdict_PARITY_VERDICT_TOKENS || p.GetFirstDisagreement() != 3 || !strings.Contains(p.GetDetail(), "from token 48") {
		t.Fatalf("tokens: %v", p)
	}
	// The engine ran the prompt under an adapter the router left out.
	ev, hl := el.store(0, prompt)
	ev.LoRAName = "ad"
	f.publish("l", 0, ev)
	if p := parity(prompt, hl, "l", ""); p.GetVerdict() != kvindexv1.ParityVerdict_PARITY_VERDICT_KEYING || p.GetFirstDisagreement() != 0 || !strings.Contains(p.GetDetail(), `"ad"`) {
		t.Fatalf("keying: %v", p)
	}
	if p := parity(prompt, []uint64{1, 2, 3, 4, 5}, "a", ""); p.GetVerdict() != kvindexv1.ParityVerdict_PARITY_VERDICT_UNKNOWN_HASHES {
		t.Fatalf("unknown hashes: %v", p)
	}
}

// TestInspectBadRequests: every bad request to the operator's RPCs is
// InvalidArgument naming the field at fault.
func TestInspectBadRequests(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"})
	c := f.client
	ctx := ctx5(t)
	watchErr := func(req *kvindexv1.WatchRequest) error {
		st, err := c.Watch(ctx, req)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	for _, tc := range []struct {
		name, prefix string
		call         func() error
	}{
		{"lookup no model", "model: required", func() error { _, err := c.Lookup(ctx, &kvindexv1.LookupRequest{TokenIds: []uint32{1}}); return err }},
		{"lookup unknown model", "model: unknown model", func() error {
			_, err := c.Lookup(ctx, &kvindexv1.LookupRequest{Model: "x", TokenIds: []uint32{1}})
			return err
		}},
		{"lookup no prompt", "token_ids: required", func() error { _, err := c.Lookup(ctx, &kvindexv1.LookupRequest{Model: model}); return err }},
		{"dump no worker", "worker: required", func() error { _, err := c.Dump(ctx, &kvindexv1.DumpRequest{}); return err }},
		{"dump unknown worker", "worker: unknown worker", func() error { _, err := c.Dump(ctx, &kvindexv1.DumpRequest{Worker: ref("zz")}); return err }},
		{"dump page size", "page_size: 10001 exceeds", func() error {
			_, err := c.Dump(ctx, &kvindexv1.DumpRequest{Worker: ref("a"), PageSize: 10001})
			return err
		}},
		{"dump page token", "page_token:", func() error {
			_, err := c.Dump(ctx, &kvindexv1.DumpRequest{Worker: ref("a"), PageToken: "nope"})
			return err
		}},
		{"diagnose no worker", "worker: required", func() error {
			_, err := c.Diagnose(ctx, &kvindexv1.DiagnoseRequest{Model: model, TokenIds: []uint32{1}})
			return err
		}},
		{"diagnose hashes without tokens", "engine_block_hashes: needs token_ids", func() error {
			_, err := c.Diagnose(ctx, &kvindexv1.DiagnoseRequest{Model: model, BlockKeys: []uint64{1}, Worker: ref("a"), EngineBlockHashes: []uint64{1}})
			return err
		}},
		{"watch kind", "kinds[0]:", func() error { return watchErr(&kvindexv1.WatchRequest{Kinds: []kvindexv1.WatchEventKind{9}}) }},
		{"watch buffer", "buffer: 5000 exceeds", func() error { return watchErr(&kvindexv1.WatchRequest{Buffer: 5000}) }},
		{"watch worker", "workers[0]: unknown worker", func() error { return watchErr(&kvindexv1.WatchRequest{Workers: []*kvindexv1.WorkerRef{ref("q")}}) }},
		{"watch model", "model: unknown model", func() error { return watchErr(&kvindexv1.WatchRequest{Model: "q"}) }},
	} {
		err := tc.call()
		st, _ := status.FromError(errors.Unwrap(err))
		if st == nil {
			st, _ = status.FromError(err)
		}
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tc.prefix) {
			t.Errorf("%s: %v, want InvalidArgument %q...", tc.name, err, tc.prefix)
		}
	}
}

// TestWatch streams applied events of one worker, filtered by kind, and
// under a reader that does not read, drops and counts instead of growing
// or slowing the index.
func TestWatch(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"}, podSpec{name: "b"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := f.client.Watch(ctx, &kvindexv1.WatchRequest{Workers: []*kvindexv1.WorkerRef{ref("a")}, Hashes: true,
		Kinds: []kvindexv1.WatchEventKind{kvindexv1.WatchEventKind_WATCH_EVENT_KIND_STORED, kvindexv1.WatchEventKind_WATCH_EVENT_KIND_CLEARED}})
	if err != nil {
		t.Fatal(err)
	}
	waitWatchers(t, f, 1)
	var ea, eb engine
	ev, ha := ea.store(0, tokens("watch", 3*blockSize))
	f.publish("b", 0, func() events.Event { e, _ := eb.store(0, tokens("b", blockSize)); return e }())
	f.publish("a", 0, ev)
	f.publish("a", 0, removed(ha[2]))
	f.publish("a", 0, cleared)
	got := []string{}
	for range 2 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.GetWorker().GetPod()+" "+m.GetKind().String())
		if m.GetKind() == kvindexv1.WatchEventKind_WATCH_EVENT_KIND_STORED {
			if m.GetBlocks() != 3 || !slices.Equal(m.GetBlockHashes(), ha) || m.GetBlockSize() != blockSize || m.GetMedium() != "GPU" || m.GetTime() == nil || m.GetModel() != model {
				t.Fatalf("stored event: %v", m)
			}
		}
	}
	if want := []string{"a WATCH_EVENT_KIND_STORED", "a WATCH_EVENT_KIND_CLEARED"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	cancel()
	if _, err := st.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("after cancel: %v", err)
	}
	// The client sees the cancel before the server's handler has removed
	// its observer: wait for that, so that the next wait counts the next
	// stream's observer and not this one's.
	waitWatchers(t, f, 0)

	// A reader of a 4-event buffer while one batch of 500 events applies:
	// the observer offers them faster than any stream sends, and what does
	// not fit is dropped and counted, on the stream and in the metric.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	slow, err := f.client.Watch(ctx2, &kvindexv1.WatchRequest{Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	waitWatchers(t, f, 1)
	burst := make([]events.Event, 500)
	for i := range burst {
		burst[i] = removed(uint64(i + 1)) // unknown blocks: counted, and still applied events
	}
	f.publish("a", 0, burst...)
	var dropped uint64
	for n := 0; dropped == 0; n++ {
		m, err := slow.Recv()
		if err != nil {
			t.Fatalf("slow stream after %d events: %v", n, err)
		}
		dropped = m.GetDropped()
		if n > 500 {
			t.Fatal("500 events delivered through a buffer of 4 with nothing dropped")
		}
	}
	if dropped > 496 {
		t.Fatalf("dropped %d of 500 through a buffer of 4", dropped)
	}
	if v := metricValue(t, f.metrics(), "kvindex_watch_dropped_events_total"); v < float64(dropped) {
		t.Fatalf("kvindex_watch_dropped_events_total %v, want at least %d", v, dropped)
	}
}

// metricValue returns the value of an unlabelled metric in a /metrics text.
func metricValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// waitWatchers waits until the daemon's index has n observers (the Watch
// streams registered).
func waitWatchers(t *testing.T, f *fleet, n int) {
	t.Helper()
	f.waitFor(func() bool { return f.d.Index().NumObservers() == n }, "watch streams to register")
}

// TestDiagnoseMoreReasons: an adapter the worker never used, extra keys
// the engine did not hash, blocks kvindex evicted for a worker's
// capacity, and orphaned blocks.
func TestDiagnoseMoreReasons(t *testing.T) {
	f := startFleet(t, podSpec{name: "c", capacity: 4}, podSpec{name: "x"}, podSpec{name: "r"})
	var ec, ex, er engine
	prompt := tokens("more reasons", 6*blockSize)

	// c's capacity is 4 blocks: storing 6 evicts the 2 stored least recently.
	ev, _ := ec.store(0, prompt[:2*blockSize])
	f.publish("c", 0, ev)
	ev2, _ := ec.store(0, tokens("later", 4*blockSize))
	f.publish("c", 0, ev2)
	d := f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("c")})
	if x := reasons(d); d.GetMatchedBlocks() != 0 || x[0] != kvindexv1.DiagnoseReason_DIAGNOSE_REASON_EVICTED_BY_INDEX {
		t.Fatalf("evicted: %v", d)
	}
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_EVICTED_BY_INDEX); !strings.Contains(x.GetDetail(), "evicted for capacity") || x.GetEventTime() == nil {
		t.Fatalf("evicted finding: %v", x)
	}

	// x stored the prompt plainly; the request sends extra keys (a
	// multimodal identifier on block 1) and an adapter x never used.
	ev, _ = ex.store(0, prompt)
	f.publish("x", 0, ev)
	extra := []*kvindexv1.ExtraKeys{{}, {Values: []*kvindexv1.ExtraValue{{Kind: &kvindexv1.ExtraValue_Str{Str: "img-1"}}}}}
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, BlockExtraKeys: extra, Worker: ref("x")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_EXTRA_KEYS_DIFFER); d.GetMatchedBlocks() != 1 || !strings.Contains(x.GetDetail(), "holds 6 blocks") {
		t.Fatalf("extra keys: %v", d)
	}
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, LoraName: "chat", Worker: ref("x")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_UNKNOWN_LORA); !strings.Contains(x.GetDetail(), `"chat"`) {
		t.Fatalf("unknown lora: %v", x)
	}
	finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_LORA_DIFFERS) // without the adapter, x holds it all

	// r stored the prompt's second half under a parent it never announced.
	ev, _ = er.store(0, prompt[3*blockSize:])
	ev.ParentHash, ev.HasParent = 12345, true
	f.publish("r", 0, ev)
	d = f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("r")})
	if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_ORPHANS); !strings.Contains(x.GetDetail(), "3 of the worker's blocks") {
		t.Fatalf("orphans: %v", x)
	}
}

// TestDiagnoseLostEvents: events lost beyond replay, under each gap
// policy: keep leaves the worker UNSYNCED (and the blocks after the loss
// orphaned); reset clears it, and the orphans after it make it DEGRADED.
func TestDiagnoseLostEvents(t *testing.T) {
	for _, policy := range []string{"keep", "reset"} {
		t.Run(policy, func(t *testing.T) {
			f := newFleet(t, fleetOptions{configure: func(c *config.Config) { c.Events.GapPolicy = policy }}, podSpec{name: "a", replayFrames: 4})
			f.start()
			f.waitIdle("a", 0)
			var eng engine
			prompt := tokens("lost", 8*blockSize)
			ev1, h1 := eng.store(0, prompt[:3*blockSize])
			ev2, h2 := eng.store(h1[2], prompt[3*blockSize:6*blockSize])
			ev3, _ := eng.store(h2[2], prompt[6*blockSize:])
			f.publish("a", 0, ev1)
			lost := f.lose("a", 0, ev2)
			f.pods["a"].pubs[0].ForgetReplay(lost + 1)
			f.publish("a", 0, ev3)
			d := f.diagnose(&kvindexv1.DiagnoseRequest{TokenIds: prompt, Worker: ref("a")})
			finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_ORPHANS)
			switch policy {
			case "keep":
				if d.GetMatchedBlocks() != 3 || d.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED {
					t.Fatalf("keep: %v", d)
				}
				finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_WORKER_UNSYNCED)
			case "reset":
				if d.GetMatchedBlocks() != 0 || d.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_DEGRADED {
					t.Fatalf("reset: %v", d)
				}
				if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_WORKER_RESET); !strings.Contains(x.GetDetail(), "lost batches 1..1") {
					t.Fatalf("reset finding: %v", x)
				}
				if x := finding(t, d, kvindexv1.DiagnoseReason_DIAGNOSE_REASON_WORKER_UNHEALTHY); !strings.Contains(x.GetDetail(), "DEGRADED") {
					t.Fatalf("unhealthy finding: %v", x)
				}
			}
		})
	}
}
