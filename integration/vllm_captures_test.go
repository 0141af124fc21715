package integration

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// vllmCapture is one events/testdata/vllm-*.json file: the payloads vLLM's
// own publisher sent on topic "kv-events", in seq order, and their
// decodings (for prompts of the captured tokens).
type vllmCapture struct {
	payloads [][]byte
	batches  []*events.Batch
}

func loadVLLMCapture(t *testing.T, name string) *vllmCapture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "events", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Messages []struct {
			Topic      string `json:"topic"`
			Seq        uint64 `json:"seq"`
			PayloadHex string `json:"payload_hex"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := &vllmCapture{}
	for i, m := range doc.Messages {
		p, err := hex.DecodeString(m.PayloadHex)
		if err != nil || m.Topic != "kv-events" || m.Seq != uint64(i) {
			t.Fatalf("%s message %d: topic %q seq %d: %v", name, i, m.Topic, m.Seq, err)
		}
		b, err := events.Decode(p)
		if err != nil {
			t.Fatalf("%s seq %d: %v", name, i, err)
		}
		c.payloads, c.batches = append(c.payloads, p), append(c.batches, b)
	}
	return c
}

func (c *vllmCapture) tokens(seq, i int) []uint32 { return c.batches[seq].Events[i].TokenIDs }

// capturePrompt is the first blocks*bs tokens of parts and one more token,
// so that vLLM could hit every one of the blocks (it computes at least
// the prompt's last token).
func capturePrompt(bs, blocks int, parts ...[]uint32) []uint32 {
	all := slices.Concat(parts...)
	return append(slices.Clone(all[:blocks*bs]), 1)
}

// replayCapture sends messages [from, to) of c from pod's rank as the
// engine sent them, with seqs from the publisher (the capture's own when
// sent in order), waiting until the daemon processed each.
func (f *fleet) replayCapture(podName string, rank int, c *vllmCapture, from, to int) {
	f.t.Helper()
	for seq := from; seq < to; seq++ {
		f.send(podName, rank, func(pub *enginepub.Publisher) (uint64, error) { return pub.PublishRaw(c.payloads[seq]) })
	}
}

// captureHit is a worker's Score answer, "matched/prefix" and the
// capping group as "index:kind:role:window:block size" ("" when none), or
// "absent".
func captureHit(resp *kvindexv1.ScoreResponse, pod string, rank int) (string, *kvindexv1.WorkerScore) {
	for _, w := range resp.GetWorkers() {
		if w.GetWorker().GetPod() != pod || int(w.GetWorker().GetDpRank()) != rank {
			continue
		}
		s := fmt.Sprintf("%d/%d", w.GetMatchedBlocks(), w.GetPrefixBlocks())
		if g := w.GetCappedBy(); g != nil {
			s += fmt.Sprintf(" %d:%s:%s:%d:%d", g.GetIndex(), g.GetKind(), g.GetRole(), g.GetSlidingWindow(), g.GetBlockSize())
		}
		if w.GetMatchedTokens() != w.GetMatchedBlocks()*resp.GetBlockSize() {
			return fmt.Sprintf("%s, %d tokens at %d", s, w.GetMatchedTokens(), resp.GetBlockSize()), w
		}
		return s, w
	}
	return "absent", nil
}

// groupsOf describes a ListWorkers entry's groups as
// "index:kind:role:window:block size:blocks".
func groupsOf(w *kvindexv1.WorkerStatus) string {
	var parts []string
	for _, g := range w.GetGroups() {
		parts = append(parts, fmt.Sprintf("%d:%s:%s:%d:%d:%d", g.GetIndex(), g.GetKind(), g.GetRole(), g.GetSlidingWindow(), g.GetBlockSize(), g.GetResidentBlocks()))
	}
	return strings.Join(parts, " ")
}

func mediaOf(byMedium []*kvindexv1.MediumMatch) string {
	var parts []string
	for _, m := range byMedium {
		parts = append(parts, fmt.Sprintf("%s=%d", m.GetMedium(), m.GetBlocks()))
	}
	return strings.Join(parts, " ")
}

func residentOf(w *kvindexv1.WorkerStatus) string {
	var parts []string
	for _, m := range w.GetResidentByMedium() {
		parts = append(parts, fmt.Sprintf("%s=%d", m.GetMedium(), m.GetBlocks()))
	}
	return strings.Join(parts, " ")
}

// TestVLLMCapturesOverZMQ replays the payloads vLLM's own publisher sent
// (events/testdata/vllm-*.json), byte for byte on its topic "kv-events",
// to a running daemon: one pod per capture, each of its own model
// configured at 16-token blocks, and rank 2 of a data-parallel engine
// connecting to a push listener of dp_size 3. Score and ListWorkers answer
// over gRPC what vLLM realizes: the learned block sizes, hybrid hits
// capped by the window or mamba group (without the cap they would answer
// 6, 8, 2 and 1 blocks where 0 is expected), offloaded tiers with REMOTE
// held as EXTERNAL, and a late joiner's removals of a group it never saw
// counted and applied to nothing.
func TestVLLMCapturesOverZMQ(t *testing.T) {
	pods := []struct{ pod, file string }{
		{"mla", "vllm-mla.json"}, {"mla256", "vllm-mla-256.json"}, {"sink", "vllm-sink.json"},
		{"gptoss", "vllm-hybrid-window.json"}, {"gptoss-late", "vllm-hybrid-window.json"},
		{"qwen", "vllm-hybrid-mamba.json"}, {"tiers", "vllm-tiers.json"}, {"locality", "vllm-locality.json"},
		{"dp", "vllm-dp-push.json"},
	}
	k := &captureCheck{caps: map[string]*vllmCapture{}}
	var specs []podSpec
	for _, p := range pods {
		k.caps[p.pod] = loadVLLMCapture(t, p.file)
		spec := podSpec{name: p.pod, model: "vllm/" + p.pod, topic: "kv-events"}
		if p.pod == "dp" {
			spec.push, spec.dpSize = true, 3
		}
		specs = append(specs, spec)
	}
	k.f = newFleet(t, fleetOptions{
		routes: []config.Route{{Topic: "kv-events", Pod: "dp", Model: "vllm/dp"}},
		configure: func(c *config.Config) {
			for _, p := range pods {
				c.Models = append(c.Models, config.Model{Name: "vllm/" + p.pod, BlockSize: blockSize})
			}
		},
	}, specs...)
	k.f.start()
	k.singleGroup()
	k.gptOSS()
	k.qwen3Next()
	k.tiers()
	k.dpPush()
}

// captureCheck replays captures to a fleet and checks its answers; each
// pod's model is "vllm/<pod>".
type captureCheck struct {
	f    *fleet
	caps map[string]*vllmCapture
}

// score returns captureHit of pod/rank for a prompt of tokens.
func (k *captureCheck) score(pod string, rank int, toks []uint32) (string, *kvindexv1.WorkerScore) {
	k.f.t.Helper()
	return captureHit(k.f.score(&kvindexv1.ScoreRequest{Model: "vllm/" + pod, TokenIds: toks}), pod, rank)
}

func (k *captureCheck) want(what, got, want string) {
	k.f.t.Helper()
	if got != want {
		k.f.t.Fatalf("%s: %q, want %q", what, got, want)
	}
}

// sizes is pod/rank's ListWorkers "block_size/model_block_size".
func (k *captureCheck) sizes(pod string, rank int) string {
	w := k.f.status(pod, rank)
	return fmt.Sprintf("%d/%d", w.GetBlockSize(), w.GetModelBlockSize())
}

// singleGroup: MLA at 64 and 256-token blocks, and sink full attention.
func (k *captureCheck) singleGroup() {
	f := k.f
	for _, tc := range []struct {
		pod string
		bs  int
	}{{"mla", 64}, {"mla256", 256}} {
		c := k.caps[tc.pod]
		a := capturePrompt(tc.bs, 4, c.tokens(0, 0), c.tokens(1, 0))
		f.replayCapture(tc.pod, 0, c, 0, 2)
		k.want(tc.pod+" sizes", k.sizes(tc.pod, 0), fmt.Sprintf("%d/%d", tc.bs, tc.bs))
		got, w := k.score(tc.pod, 0, a)
		k.want(tc.pod+" A after seq 1", got, "4/0")
		k.want(tc.pod+" A's media", mediaOf(w.GetByMedium()), "GPU=4")
		f.replayCapture(tc.pod, 0, c, 2, 3) // A's blocks 3 and 2 evicted, B's 2 cached
		got, _ = k.score(tc.pod, 0, a)
		k.want(tc.pod+" A after seq 2", got, "2/0")
		got, _ = k.score(tc.pod, 0, capturePrompt(tc.bs, 2, c.tokens(2, 2)))
		k.want(tc.pod+" B after seq 2", got, "2/0")
		f.replayCapture(tc.pod, 0, c, 3, 4) // cleared
		got, _ = k.score(tc.pod, 0, a)
		k.want(tc.pod+" A after the clear", got, "absent")
		k.want(tc.pod+" groups", groupsOf(f.status(tc.pod, 0)), fmt.Sprintf("0:mla_attention:prefix:0:%d:0", tc.bs))
	}
	c := k.caps["sink"]
	f.replayCapture("sink", 0, c, 0, 4)
	got, _ := k.score("sink", 0, capturePrompt(16, 5, c.tokens(0, 0), c.tokens(1, 0), c.tokens(2, 0)))
	k.want("sink A", got, "3/0") // blocks 4 and 3 evicted
	got, _ = k.score("sink", 0, capturePrompt(16, 2, c.tokens(3, 2)))
	k.want("sink B", got, "2/0")
	k.want("sink groups", groupsOf(f.status("sink", 0)), "0:sink_full_attention:prefix:0:16:5")
}

// gptOSS: group 0 a window of 128 tokens (the 8 blocks before the cut),
// group 1 full attention. A's blocks 0-10 are stored in seq 0-5, D's 4 in
// seq 7. Then a late joiner from seq 6: its first events are window
// removals, for a group it never saw stored (3 blocks), then seq 7's of
// blocks it never saw (6 window, 3 full attention).
func (k *captureCheck) gptOSS() {
	f := k.f
	c := k.caps["gptoss"]
	a := slices.Concat(c.tokens(0, 1), c.tokens(1, 1), c.tokens(2, 1), c.tokens(3, 1), c.tokens(4, 1), c.tokens(5, 1))
	d := capturePrompt(16, 4, c.tokens(7, 10))
	f.replayCapture("gptoss", 0, c, 0, 5) // the window group lost a0 and a1
	got, _ := k.score("gptoss", 0, capturePrompt(16, 10, a))
	k.want("gpt-oss A10 after seq 4 (a2-a9 in the window)", got, "10/0")
	got, _ = k.score("gptoss", 0, capturePrompt(16, 6, a))
	k.want("gpt-oss A6 after seq 4 (needs a0-a5)", got, "0/6 0:sliding_window:cap:128:16")
	f.replayCapture("gptoss", 0, c, 5, 8)
	got, _ = k.score("gptoss", 0, capturePrompt(16, 11, a))
	k.want("gpt-oss A11 at the end (a0-a7 in full attention, none in the window)", got, "0/8 0:sliding_window:cap:128:16")
	got, _ = k.score("gptoss", 0, d)
	k.want("gpt-oss D at the end", got, "4/0")
	w := f.status("gptoss", 0)
	k.want("gpt-oss groups", groupsOf(w), "0:sliding_window:cap:128:16:6 1:full_attention:prefix:0:16:14")
	k.want("gpt-oss sizes", k.sizes("gptoss", 0), "16/16")
	if w.GetSideBlocks() != 6 || w.GetResidentBlocks() != 14 || w.GetUnknownBlocks()+w.GetUnknownGroupBlocks()+w.GetOrphans() != 0 {
		f.t.Fatalf("gpt-oss status %v", w)
	}

	f.pods["gptoss-late"].pubs[0].SetSeq(6)
	f.replayCapture("gptoss-late", 0, c, 6, 8)
	w = f.status("gptoss-late", 0)
	k.want("late joiner groups", groupsOf(w), "0:sliding_window:cap:128:16:5 1:full_attention:prefix:0:16:5")
	if w.GetJoinedAtSeq() != 6 || w.GetUnknownGroupBlocks() != 3 || w.GetUnknownBlocks() != 9 || w.GetOrphans() != 2 || w.GetBlocksRemoved() != 0 {
		f.t.Fatalf("late joiner status %v", w)
	}
	got, _ = k.score("gptoss-late", 0, d)
	k.want("late joiner D", got, "4/0")
}

// qwen3Next: mamba groups 0-2, full attention 3, 544-token blocks.
func (k *captureCheck) qwen3Next() {
	f := k.f
	c := k.caps["qwen"]
	a := slices.Concat(c.tokens(0, 3), c.tokens(1, 3))
	f.replayCapture("qwen", 0, c, 0, 2)
	k.want("qwen3-next sizes", k.sizes("qwen", 0), "544/544")
	got, _ := k.score("qwen", 0, capturePrompt(544, 2, a))
	k.want("qwen3-next A2 after seq 1 (a1's state)", got, "2/0")
	f.replayCapture("qwen", 0, c, 2, 3) // a1's state evicted
	got, _ = k.score("qwen", 0, capturePrompt(544, 2, a))
	k.want("qwen3-next A2 after seq 2", got, "0/2 0:mamba:cap:0:544")
	got, _ = k.score("qwen", 0, capturePrompt(544, 3, a))
	k.want("qwen3-next A3 after seq 2 (a2's state)", got, "3/0")
	f.replayCapture("qwen", 0, c, 3, 4)
	got, _ = k.score("qwen", 0, capturePrompt(544, 3, a))
	k.want("qwen3-next A3 at the end (full attention holds a0 only)", got, "0/1 0:mamba:cap:0:544")
	w := f.status("qwen", 0)
	k.want("qwen3-next groups", groupsOf(w), "0:mamba:cap:0:544:1 1:mamba:cap:0:544:1 2:mamba:cap:0:544:1 3:full_attention:prefix:0:544:2")
	if w.GetInvalidEvents()+w.GetUnknownBlocks() != 0 || w.GetSideBlocks() != 3 {
		f.t.Fatalf("qwen3-next status %v", w)
	}
}

// tiers: placeholders name each chunk's last block only, so no tier
// prefix of A is credited; self-describing events name every block, and
// each tier is credited the whole prefix, the shared (REMOTE) tier's as
// EXTERNAL.
func (k *captureCheck) tiers() {
	f := k.f
	c := k.caps["tiers"]
	f.replayCapture("tiers", 0, c, 0, 3)
	got, w := k.score("tiers", 0, capturePrompt(16, 8, c.tokens(0, 0)))
	k.want("tiers A after seq 2", got, "8/0")
	k.want("tiers A's media", mediaOf(w.GetByMedium()), "GPU=8")
	st := f.status("tiers", 0)
	k.want("tiers resident", residentOf(st), "GPU=8 CPU=2 STORAGE=2 EXTERNAL=1")
	k.want("tiers groups", groupsOf(st), "0:full_attention:prefix:0:16:8")

	c = k.caps["locality"]
	a := capturePrompt(16, 4, c.tokens(0, 0))
	f.replayCapture("locality", 0, c, 0, 4)
	got, w = k.score("locality", 0, a)
	k.want("locality A after seq 3", got, "4/0")
	k.want("locality A's media", mediaOf(w.GetByMedium()), "GPU=4 CPU=4 STORAGE=4 EXTERNAL=4")
	f.replayCapture("locality", 0, c, 4, 6)
	_, w = k.score("locality", 0, a)
	k.want("locality A's media at the end", mediaOf(w.GetByMedium()), "GPU=4")
}

// dpPush: rank 2 connects to the listener's port + 2 (vLLM's offset), its
// payloads stamped with data_parallel_rank 2: they land on dp/2 and no
// other rank.
func (k *captureCheck) dpPush() {
	f := k.f
	c := k.caps["dp"]
	f.replayCapture("dp", 2, c, 0, 2)
	got, _ := k.score("dp", 2, capturePrompt(64, 3, c.tokens(0, 0), c.tokens(1, 0)))
	k.want("dp/2 A after seq 1", got, "3/0")
	f.replayCapture("dp", 2, c, 2, 3)
	rank2, err := events.OffsetEndpoint(f.pushAddr, 2)
	if err != nil {
		f.t.Fatal(err)
	}
	w := f.status("dp", 2)
	if w.GetEndpoint() != rank2 || w.GetResidentBlocks() != 1 || w.GetBatches() != 3 || w.GetModel() != "vllm/dp" || w.GetBlockSize() != 64 {
		f.t.Fatalf("dp/2: %v, want endpoint %s", w, rank2)
	}
	if strings.Contains(f.metrics(), `kvindex_push_refused_total{`) {
		f.t.Fatal("a push message was refused")
	}
	resp, err := f.client.ListWorkers(f.t.Context(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, w := range resp.GetWorkers() {
		if w.GetWorker().GetPod() == "dp" && w.GetWorker().GetDpRank() != 2 {
			f.t.Fatalf("rank 2's messages reached %v", w.GetWorker())
		}
	}
}
