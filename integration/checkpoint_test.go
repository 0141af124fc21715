package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	kvfleet "github.com/kvindex/kvindex/fleet"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// These tests restart fleet agents whose engines keep running, with the
// engines' replay buffers made small (bufferSteps), so that a replay from
// the engine's start cannot rebuild a worker: the agent's checkpoint
// (agent.checkpoint) must, with a replay from its seq; and where neither
// can, the worker must be flagged partial (registration, metric, the
// replica's ListWorkers) rather than served as whole, until its engine
// clears.

// buffer is the simulated engines' replay buffer in these tests, in
// batches (vLLM's buffer_steps, 10,000 by default).
const buffer = 50

// startCheckpointAgent runs the agent of pod podName of base's
// configuration, as startAgent does, with its checkpoint at path written
// every interval.
func startCheckpointAgent(t *testing.T, base *config.Config, podName, natsURL, path string, interval time.Duration) *agentProc {
	t.Helper()
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off", Models: base.Models, Events: base.Events}
	for _, p := range base.Pods {
		if p.Name == podName {
			cfg.Pods = append(cfg.Pods, p)
		}
	}
	cfg.NATS = config.NATS{URL: natsURL, RegistrationTTL: 3 * time.Second}
	cfg.Agent = config.Agent{Pod: podName, Checkpoint: path, CheckpointInterval: interval}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	nc, err := kvfleet.Connect(cfg.NATS, "test agent "+podName, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := kvfleet.NewAgent(ctx, cfg, nc, nil)
	if err != nil {
		cancel()
		nc.Close()
		t.Fatal(err)
	}
	p := &agentProc{a: a, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- a.Run(ctx) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// startRig starts the engines, the control and the replicas of a fleet
// rig, without agents: each test starts its own (startAgent,
// startCheckpointAgent) and then waits for their subscriptions.
func startRig(t *testing.T, replicas int, specs ...podSpec) *fleetRig {
	t.Helper()
	for i := range specs {
		if specs[i].replayFrames == 0 {
			specs[i].replayFrames = 4
		}
	}
	rig := &fleetRig{t: t, nats: startNATS(t), agents: map[string]*agentProc{}}
	rig.direct = newFleet(t, fleetOptions{}, specs...)
	rig.direct.start()
	for range replicas {
		rig.replicas = append(rig.replicas, startReplica(t, rig.nats.url()))
	}
	return rig
}

// podRefs lists the workers of one pod.
func (r *fleetRig) podRefs(podName string) []events.WorkerRef {
	var out []events.WorkerRef
	for rank := range r.direct.pods[podName].pubs {
		out = append(out, events.WorkerRef{Pod: podName, DPRank: rank})
	}
	return out
}

// lastSeq is the last seq the engine of ref sent (as the control, which
// receives everything, applied it).
func (r *fleetRig) lastSeq(ref events.WorkerRef) uint64 {
	_, last, _ := r.direct.receivedSeq(ref)
	return last
}

// waitAgentCaughtUp waits until pod's agent has applied (and published)
// every batch its engines sent.
func (r *fleetRig) waitAgentCaughtUp(podName string) {
	r.t.Helper()
	a := r.agents[podName].a
	r.direct.waitFor(func() bool {
		for _, ref := range r.podRefs(podName) {
			if seq, ok := a.NATS().EngineSeq(ref.DPRank); !ok || seq != r.lastSeq(ref) {
				return false
			}
		}
		return true
	}, "agent "+podName+" to catch up with its engines")
}

// waitPeriodicCheckpoint waits until pod's agent has written a
// checkpoint, on its own timer, that started after it caught up.
func (r *fleetRig) waitPeriodicCheckpoint(podName string) {
	r.t.Helper()
	r.waitAgentCaughtUp(podName)
	a := r.agents[podName].a
	n := a.CheckpointStats().Writes
	// The write in flight now may have started before: the one after it.
	r.direct.waitFor(func() bool { return a.CheckpointStats().Writes >= n+2 }, "a periodic checkpoint")
}

// registration reads worker ref's registration from the agents' bucket.
func (r *fleetRig) registration(ref events.WorkerRef) *fleetv1.Registration {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := nats.Connect(r.nats.url())
	if err != nil {
		r.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		r.t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, natsbus.DefaultBucket)
	if err != nil {
		r.t.Fatal(err)
	}
	e, err := kv.Get(ctx, natsbus.WorkerKey(model, ref))
	if err != nil {
		r.t.Fatalf("registration of %s: %v", ref, err)
	}
	reg := &fleetv1.Registration{}
	if err := proto.Unmarshal(e.Value(), reg); err != nil {
		r.t.Fatal(err)
	}
	return reg
}

// agentMetric returns the value of the agent's metric name with the
// given label pairs (name, value, ...): a histogram's sample count.
func agentMetric(t *testing.T, a *kvfleet.Agent, name string, labels ...string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("agent metric %s%v not found", name, labels)
	return 0
}

// partialTotals returns kvindex_agent_partial_total by reason.
func partialTotals(t *testing.T, a *kvfleet.Agent) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, r := range []string{"no_checkpoint", "checkpoint_gap", "gap", "checkpoint"} {
		out[r] = agentMetric(t, a, "kvindex_agent_partial_total", "reason", r)
	}
	return out
}

// checkWhole checks that pod's agent holds every worker whole: not
// partial in the agent, nor in its registration, nor counted, and OK in
// every replica's ListWorkers.
func (r *fleetRig) checkWhole(podName string) {
	r.t.Helper()
	a := r.agents[podName].a
	for _, ref := range r.podRefs(podName) {
		if p, why := a.Partial(ref.DPRank); p {
			r.t.Fatalf("%s is partial: %s", ref, why)
		}
		if r.registration(ref).GetPartial() {
			r.t.Fatalf("%s is registered partial", ref)
		}
		for i, rep := range r.replicas {
			rep.waitFor(func() bool {
				return rep.status(ref.Pod, ref.DPRank).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_OK
			},
				fmt.Sprintf("replica %d to show %s OK", i, ref))
		}
	}
	if n := agentMetric(r.t, a, "kvindex_agent_partial_workers"); n != 0 {
		r.t.Fatalf("%v partial workers", n)
	}
}

// waitPartial waits until every worker of pod is partial in its agent, in
// its registration and in every replica's ListWorkers (not OK, and the
// reason saying so and containing why), and checks that each replica
// holds what the agent holds (a partial state is replicated as it is).
func (r *fleetRig) waitPartial(podName, why string) {
	r.t.Helper()
	a := r.agents[podName].a
	refs := r.podRefs(podName)
	r.direct.waitFor(func() bool { return a.PartialWorkers() == len(refs) }, "the agent to mark its workers partial")
	for _, ref := range refs {
		if _, got := a.Partial(ref.DPRank); !strings.Contains(got, why) {
			r.t.Fatalf("%s is partial because %q, want %q in it", ref, got, why)
		}
		r.direct.waitFor(func() bool { return r.registration(ref).GetPartial() }, fmt.Sprintf("%s registered partial", ref))
		for i, rep := range r.replicas {
			rep.waitFor(func() bool {
				st := rep.status(ref.Pod, ref.DPRank)
				return st.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_OK && st.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_RECOVERING &&
					strings.Contains(st.GetHealthReason(), "lacks part of the engine's history") && strings.Contains(st.GetHealthReason(), why)
			}, fmt.Sprintf("replica %d to flag %s partial", i, ref))
			rep.waitFor(func() bool {
				rw := rep.d.Index().LookupWorker(ref)
				return rw != nil && rw.Digest() == a.Index().LookupWorker(ref).Digest()
			}, fmt.Sprintf("replica %d to hold what the agent holds of %s", i, ref))
		}
	}
	if n := agentMetric(r.t, a, "kvindex_agent_partial_workers"); n != float64(len(refs)) {
		r.t.Fatalf("%v partial workers, want %d", n, len(refs))
	}
}

// clearEngines has every engine of pod clear its cache (AllBlocksCleared),
// as vLLM does on reset_prefix_cache.
func (w *workload) clearEngines(podName string) {
	for _, ref := range w.rig.podRefs(podName) {
		w.rig.direct.publish(ref.Pod, ref.DPRank, cleared)
		w.held[ref] = nil
	}
}

// newRequests sends n batches to each worker of pod, each a new request
// (a system prompt and text of its own), as workload.step's commonest
// case does but never a clear: a test whose engines' replay buffers must
// not hold a clear (which would make a partial state whole) ends its
// history with them.
func (w *workload) newRequests(podName string, n int) {
	for range n {
		for _, ref := range w.rig.podRefs(podName) {
			sys := tokens(fmt.Sprintf("system %d", w.rng.IntN(5)), 4*blockSize)
			toks := concat(sys, tokens(fmt.Sprintf("user %d", w.rng.Uint64()), (1+w.rng.IntN(6))*blockSize))
			ev, hs := w.engines[ref].store(0, toks)
			w.held[ref] = append(w.held[ref], chain{hashes: hs, toks: toks, medium: "GPU"})
			w.prompts = append(w.prompts, toks)
			w.rig.direct.publish(ref.Pod, ref.DPRank, ev)
		}
	}
}

// TestAgentRestartsFromCheckpoint: an agent killed while its engines run
// (its NATS connection dropped first, and its final checkpoint lost: the
// volume holds its last periodic one) and restarted with the same
// checkpoint file recovers the exact state, although each engine's
// history is several times its replay buffer (a replay from the start
// could not rebuild it): it restores the checkpoint and replays only what
// came after the checkpoint's seq (fewer batches than the buffer holds).
// The replicas converge to the control's digests and answer Score as it
// does, nothing is partial, and the restore is counted.
func TestAgentRestartsFromCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p0.ckpt")
	rig := startRig(t, 1, podSpec{name: "p0", dpSize: 2, bufferSteps: buffer})
	rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, 50*time.Millisecond)
	rig.waitSubscribers(2)
	w := newWorkload(rig, 21)
	for range 300 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	for _, ref := range rig.refs() {
		if last := rig.lastSeq(ref); last < 2*buffer {
			t.Fatalf("setup: %s's history is %d batches, want over twice the buffer", ref, last+1)
		}
	}
	rig.waitPeriodicCheckpoint("p0")
	saved, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		w.step() // after the checkpoint: the agent indexes them, its checkpoint does not
	}
	rig.waitAgentCaughtUp("p0")
	rig.agents["p0"].crash(t)
	if err := os.WriteFile(path, saved, 0o600); err != nil { // the kill lost the final checkpoint
		t.Fatal(err)
	}
	for range 25 {
		w.step() // while the agent is down; 35 in all since the checkpoint, under the buffer
	}
	rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, 50*time.Millisecond)
	a := rig.agents["p0"].a
	took := rig.waitConverged(15 * time.Second)
	t.Logf("the restarted agent's replicas converged %v after it started", took)
	rig.sameScores(w.samplePrompts(30))
	rig.checkWhole("p0")
	if n := agentMetric(t, a, "kvindex_agent_checkpoint_loads_total", "result", "restored"); n != 1 {
		t.Fatalf("%v restores counted, want 1", n)
	}
	for reason, n := range partialTotals(t, a) {
		if n != 0 {
			t.Fatalf("%v workers counted partial (%s)", n, reason)
		}
	}
	replayed := int64(0)
	for _, st := range a.Subscriber().WorkerStats() {
		if st.UnrecoveredGaps != 0 {
			t.Fatalf("%s: %d unrecovered gaps", st.Worker, st.UnrecoveredGaps)
		}
		replayed += st.ReplayedBatches
	}
	if replayed == 0 || replayed > 35 {
		t.Fatalf("the restored agent replayed %d batches, want the 1 to 35 since its checkpoint", replayed)
	}
	for range 30 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.waitPeriodicCheckpoint("p0")
	if age := agentMetric(t, a, "kvindex_agent_checkpoint_age_seconds"); age < 0 || age > 5 {
		t.Fatalf("checkpoint age %vs", age)
	}
	if n := agentMetric(t, a, "kvindex_agent_checkpoint_writes_total"); n < 2 {
		t.Fatalf("%v checkpoint writes", n)
	}
}

// TestAgentDownLongerThanReplay: an agent stopped (its checkpoint written
// at shutdown) while its engines send more batches than their replay
// buffers keep comes back with the checkpoint's state and the buffers'
// batches, knowing that the batches between them are lost: every worker
// is partial in the agent, its registration and the replica's ListWorkers
// (with why), counted under checkpoint_gap, and the replica holds what
// the agent holds, not more. Once the engines clear their caches, the
// workers are whole again and every digest converges with the control's.
func TestAgentDownLongerThanReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p0.ckpt")
	rig := startRig(t, 1, podSpec{name: "p0", dpSize: 2, bufferSteps: buffer})
	rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, time.Hour)
	rig.waitSubscribers(2)
	w := newWorkload(rig, 22)
	for range 100 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.agents["p0"].stop(t) // writes the checkpoint
	at := map[events.WorkerRef]uint64{}
	for _, ref := range rig.refs() {
		at[ref] = rig.lastSeq(ref)
	}
	for range 200 {
		w.step()
	}
	w.newRequests("p0", buffer+5) // the buffers hold no clear
	for _, ref := range rig.refs() {
		if n := rig.lastSeq(ref) - at[ref]; n <= buffer {
			t.Fatalf("setup: %s sent %d batches while the agent was down, want more than the buffer's %d", ref, n, buffer)
		}
	}
	rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, time.Hour)
	a := rig.agents["p0"].a
	rig.waitPartial("p0", "after the checkpoint's seq")
	if n := agentMetric(t, a, "kvindex_agent_checkpoint_loads_total", "result", "restored"); n != 1 {
		t.Fatalf("%v restores counted, want 1", n)
	}
	if got := partialTotals(t, a); got["checkpoint_gap"] != 2 || got["no_checkpoint"]+got["gap"]+got["checkpoint"] != 0 {
		t.Fatalf("partial workers counted %v, want 2 checkpoint_gap", got)
	}
	if ok, _ := rig.converged(rig.replicas); ok {
		t.Fatal("the partial agent holds what the control holds: the test lost nothing")
	}
	w.clearEngines("p0")
	rig.direct.waitFor(func() bool { return a.PartialWorkers() == 0 }, "the workers whole after the clear")
	for range 30 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.sameScores(w.samplePrompts(30))
	rig.checkWhole("p0")
}

// TestAgentWithoutCheckpointBeyondReplay: an agent started beside an
// engine whose history is longer than its replay buffer, with no
// checkpoint yet (the file is missing), learns what the buffer holds and
// flags the worker partial, counted under no_checkpoint, until the engine
// clears.
func TestAgentWithoutCheckpointBeyondReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p0.ckpt")
	rig := startRig(t, 1, podSpec{name: "p0", bufferSteps: buffer})
	w := newWorkload(rig, 23)
	for range 100 {
		w.step()
	}
	w.newRequests("p0", buffer+5) // the buffer holds no clear
	rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, time.Hour)
	rig.waitSubscribers(2)
	a := rig.agents["p0"].a
	rig.waitPartial("p0", "no checkpoint covers them")
	if n := agentMetric(t, a, "kvindex_agent_checkpoint_loads_total", "result", "missing"); n != 1 {
		t.Fatalf("%v missing checkpoints counted, want 1", n)
	}
	if got := partialTotals(t, a); got["no_checkpoint"] != 1 {
		t.Fatalf("partial workers counted %v, want 1 no_checkpoint", got)
	}
	w.clearEngines("p0")
	for range 20 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.checkWhole("p0")
}

// TestAgentIgnoresBadCheckpoint: a checkpoint file that is truncated,
// damaged, not a checkpoint at all, or another pod's is logged, counted
// (corrupt or foreign) and ignored: the agent learns its workers from the
// engines' replay (which here still reaches back to their start), and the
// replicas converge with the control, nothing partial.
func TestAgentIgnoresBadCheckpoint(t *testing.T) {
	dir := t.TempDir()
	path, other := filepath.Join(dir, "p0.ckpt"), filepath.Join(dir, "p1.ckpt")
	rig := startRig(t, 1, podSpec{name: "p0", dpSize: 2}, podSpec{name: "p1"})
	rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, time.Hour)
	rig.agents["p1"] = startCheckpointAgent(t, rig.direct.cfg, "p1", rig.nats.url(), other, time.Hour)
	rig.waitSubscribers(2)
	w := newWorkload(rig, 24)
	for range 60 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.waitAgentCaughtUp("p1")
	if err := rig.agents["p1"].a.WriteCheckpoint(); err != nil {
		t.Fatal(err)
	}
	foreign, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, result string
		spoil        func(good []byte) []byte
	}{
		{"truncated", "corrupt", func(b []byte) []byte { return b[:len(b)/2] }},
		{"a flipped byte", "corrupt", func(b []byte) []byte { b[len(b)*2/3] ^= 0x10; return b }},
		{"not a checkpoint", "corrupt", func([]byte) []byte { return []byte("model: test/model\n") }},
		{"another pod's", "foreign", func([]byte) []byte { return foreign }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig.agents["p0"].stop(t) // writes a good checkpoint
			good, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.spoil(good), 0o600); err != nil {
				t.Fatal(err)
			}
			for range 15 {
				w.step()
			}
			rig.agents["p0"] = startCheckpointAgent(t, rig.direct.cfg, "p0", rig.nats.url(), path, time.Hour)
			a := rig.agents["p0"].a
			rig.waitConverged(15 * time.Second)
			rig.checkWhole("p0")
			if n := agentMetric(t, a, "kvindex_agent_checkpoint_loads_total", "result", tc.result); n != 1 {
				t.Fatalf("%v %s checkpoints counted, want 1", n, tc.result)
			}
			if n := agentMetric(t, a, "kvindex_agent_checkpoint_loads_total", "result", "restored"); n != 0 {
				t.Fatalf("the bad checkpoint was restored (%v)", n)
			}
			for range 10 {
				w.step()
			}
			rig.waitConverged(10 * time.Second)
		})
	}
}
