package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// hybridGroup is one KV-cache group a simulated hybrid engine announces.
type hybridGroup struct {
	kind   string
	window int // tokens; 0: none sent
}

// hybridStore is a store of toks after parent in every group of gs, with
// the same engine hashes in each, as vLLM's groups announce a block.
func hybridStore(eng *engine, parent uint64, toks []uint32, gs []hybridGroup) ([]events.Event, []uint64) {
	ev, hs := eng.store(parent, toks)
	evs := make([]events.Event, len(gs))
	for i, g := range gs {
		evs[i] = ev
		evs[i].GroupIdx, evs[i].HasGroupIdx, evs[i].SpecKind = i, true, g.kind
		evs[i].SlidingWindow, evs[i].HasSlidingWindow = g.window, g.window > 0
	}
	return evs, hs
}

// groupRemoved is a BlockRemoved of group g's blocks.
func groupRemoved(g int, hashes ...uint64) events.Event {
	ev := removed(hashes...)
	ev.GroupIdx, ev.HasGroupIdx = g, true
	return ev
}

// hybridScores is a Score answer as worker -> matched blocks, the prefix
// group's own match, the capping group and media.
func hybridScores(resp *kvindexv1.ScoreResponse) map[string]string {
	out := map[string]string{}
	for _, w := range resp.GetWorkers() {
		s := fmt.Sprintf("matched %d prefix %d", w.GetMatchedBlocks(), w.GetPrefixBlocks())
		if c := w.GetCappedBy(); c != nil {
			s += fmt.Sprintf(" capped by %d (%s)", c.GetIndex(), c.GetKind())
		}
		for _, m := range w.GetByMedium() {
			s += fmt.Sprintf(" %s:%d", m.GetMedium(), m.GetBlocks())
		}
		out[fmt.Sprintf("%s/%d", w.GetWorker().GetPod(), w.GetWorker().GetDpRank())] = s
	}
	return out
}

// sameHybridScores checks that every replica answers each prompt as the
// control does, caps included, and returns how many of the control's
// answers for p0/0 were capped below the prefix group's match by group.
func (r *fleetRig) sameHybridScores(prompts [][]uint32, group uint32) int {
	r.t.Helper()
	capped := 0
	for _, p := range prompts {
		resp := r.direct.score(&kvindexv1.ScoreRequest{TokenIds: p})
		want := hybridScores(resp)
		for i, rep := range r.replicas {
			if got := hybridScores(rep.score(&kvindexv1.ScoreRequest{TokenIds: p})); fmt.Sprint(got) != fmt.Sprint(want) {
				r.t.Fatalf("replica %d scores a %d-token prompt %v, the control %v", i, len(p), got, want)
			}
		}
		for _, w := range resp.GetWorkers() {
			if w.GetMatchedBlocks() < w.GetPrefixBlocks() && w.GetCappedBy().GetIndex() == group {
				capped++
			}
		}
	}
	return capped
}

// groupsOf describes the worker's KV-cache groups as ListWorkers shows them.
func groupsLine(w *kvindexv1.WorkerStatus) string {
	var parts []string
	for _, g := range w.GetGroups() {
		parts = append(parts, fmt.Sprintf("%d %s %s bs %d window %d blocks %d", g.GetIndex(), g.GetKind(), g.GetRole(), g.GetBlockSize(), g.GetSlidingWindow(), g.GetResidentBlocks()))
	}
	return strings.Join(parts, "; ")
}

// sameGroups checks that every replica shows p0/0's groups as the control
// does, and returns the control's.
func (r *fleetRig) sameGroups() string {
	r.t.Helper()
	want := groupsLine(r.direct.status("p0", 0))
	for i, rep := range r.replicas {
		if got := groupsLine(rep.status("p0", 0)); got != want {
			r.t.Fatalf("replica %d's groups: %s\nthe control's: %s", i, got, want)
		}
	}
	return want
}

// TestFleetHybridGroups: a hybrid model's worker (gpt-oss's layout: a
// full-attention group and a sliding-window group announcing the same
// hashes) reaches replicas whole over NATS: the window group's keys and
// the layout travel in the deltas, so each replica's digest equals the
// agent's and the control's, and its Score answers are capped as the
// control's are (matched below the prefix group's match, capped by group
// 1). The same after the replica resyncs from a snapshot (a lost delta),
// for a replica that joins late, and after the engine restarts with
// another layout (a wider window and a mamba group).
func TestFleetHybridGroups(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0"})
	var eng engine
	gptOSS := []hybridGroup{{kind: "full_attention"}, {kind: "sliding_window", window: 2 * blockSize}}
	var prompts [][]uint32
	store := func(gs []hybridGroup, parent uint64, toks []uint32) []uint64 {
		evs, hs := hybridStore(&eng, parent, toks, gs)
		rig.direct.publish("p0", 0, evs...)
		return hs
	}

	// Three prompts in both groups, one extending another; then the
	// window group evicts blocks of two (a hit of a's 6 blocks, at most 5
	// as the last token is always computed, needs its blocks 3 and 4 in
	// the window: it falls to 3; b's to 3), and the full group the tail
	// of the third.
	a := tokens("hybrid a", 6*blockSize)
	ha := store(gptOSS, 0, a)
	b := tokens("hybrid b", 5*blockSize)
	hb := store(gptOSS, 0, b)
	c := concat(a[:2*blockSize], tokens("hybrid c", 3*blockSize))
	hc := store(gptOSS, ha[1], c[2*blockSize:])
	prompts = append(prompts, a, b, c)
	rig.direct.publish("p0", 0, groupRemoved(1, ha[3:5]...), groupRemoved(1, hb[3]), groupRemoved(0, hc[2]))
	rig.waitConverged(10 * time.Second)
	if n := rig.sameHybridScores(prompts, 1); n != 2 {
		t.Fatalf("%d answers capped by the window group, want a's and b's", n)
	}
	if got, want := rig.sameGroups(), "0 full_attention prefix bs 16 window 0 blocks 13; 1 sliding_window cap bs 16 window 32 blocks 11"; got != want {
		t.Fatalf("groups %s, want %s", got, want)
	}

	// A lost delta: the replica resyncs from the agent's snapshot, which
	// brings the window group's keys and the layout, and follows again.
	subject := natsbus.DeltaSubject(model, events.WorkerRef{Pod: "p0"})
	nc, err := nats.Connect(rig.nats.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var last *nats.Msg
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) { mu.Lock(); last = m; mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d := tokens("hybrid d", 4*blockSize)
	hd := store(gptOSS, 0, d)
	prompts = append(prompts, d)
	rig.replicas[0].waitFor(func() bool { mu.Lock(); defer mu.Unlock(); return last != nil }, "a delta of p0/0")
	resets := rig.replicas[0].status("p0", 0).GetResets()
	mu.Lock()
	forgeGap(t, nc, subject, last, 3)
	mu.Unlock()
	rig.replicas[0].waitFor(func() bool { return rig.replicas[0].status("p0", 0).GetResets() > resets }, "the replica to resync")
	rig.waitConverged(10 * time.Second)
	if st := rig.replicas[0].status("p0", 0); !strings.HasPrefix(st.GetLastReset(), "fleet resync: deltas") {
		t.Fatalf("last reset %q, want the resync", st.GetLastReset())
	}
	rig.direct.publish("p0", 0, groupRemoved(1, hd[2]))
	rig.waitConverged(10 * time.Second)
	if n := rig.sameHybridScores(prompts, 1); n != 3 {
		t.Fatalf("after the resync: %d answers capped by the window group, want a's, b's and d's", n)
	}

	// A replica that joins now restores the same from a snapshot.
	rig.replicas = append(rig.replicas, startReplica(t, rig.nats.url()))
	rig.waitConverged(10 * time.Second)
	rig.sameHybridScores(prompts, 1)
	rig.sameGroups()

	// The engine restarts as another layout: a wider window, and a mamba
	// group. The agent and the control clear the worker, relearn the
	// window group (empty, so described anew) and learn the mamba group;
	// the layout travels with the first delta of the new engine.
	rig.direct.pods["p0"].pubs[0].SetSeq(0)
	qwen := []hybridGroup{{kind: "full_attention"}, {kind: "sliding_window", window: 4 * blockSize}, {kind: "mamba"}}
	prompts = prompts[:0]
	e := tokens("hybrid e", 8*blockSize)
	he := store(qwen, 0, e)
	f := tokens("hybrid f", 6*blockSize)
	hf := store(qwen, 0, f)
	prompts = append(prompts, e, f, a)
	rig.direct.publish("p0", 0, groupRemoved(1, he[5]), groupRemoved(2, hf[4]))
	rig.waitConverged(10 * time.Second)
	if got, want := rig.sameGroups(), "0 full_attention prefix bs 16 window 0 blocks 14; 1 sliding_window cap bs 16 window 64 blocks 13; 2 mamba cap bs 16 window 0 blocks 13"; got != want {
		t.Fatalf("after the restart, groups %s, want %s", got, want)
	}
	if n := rig.sameHybridScores(prompts, 1); n != 1 {
		t.Fatalf("after the restart, %d answers capped by the window group, want e's", n)
	}
	if n := rig.sameHybridScores(prompts, 2); n != 1 {
		t.Fatalf("after the restart, %d answers capped by the mamba group, want f's", n)
	}
}
