package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/ctl"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	kvfleet "github.com/kvindex/kvindex/fleet"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// These tests run fleet mode with every part real: simulated engines
// speaking vLLM's ZeroMQ wire format (with replay), one kvindex agent per
// pod subscribed to them, a NATS server in process with JetStream on
// (nats-server/v2, the server a deployment runs), and kvindex serve
// replicas following the agents over NATS. A daemon subscribed to the
// same engines directly is the control: a replica must answer as it does.

// natsServer is an in-process NATS server with JetStream; its store dir
// survives Restart.
type natsServer struct {
	t    *testing.T
	dir  string
	port int
	s    *server.Server
}

func startNATS(t *testing.T) *natsServer {
	t.Helper()
	n := &natsServer{t: t, dir: t.TempDir(), port: freePorts(t, 1)}
	n.start()
	t.Cleanup(func() { n.s.Shutdown() })
	return n
}

func (n *natsServer) start() {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: n.port, JetStream: true, StoreDir: n.dir, NoLog: true, NoSigs: true})
	if err != nil {
		n.t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("nats server not ready")
	}
	n.s = s
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// agentProc is one running kvindex agent.
type agentProc struct {
	a      *kvfleet.Agent
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

// startAgent runs the agent of pod podName of base's configuration.
func startAgent(t *testing.T, base *config.Config, podName, natsURL string) *agentProc {
	t.Helper()
	return startAgentNATS(t, base, podName, config.NATS{URL: natsURL})
}

// startAgentNATS runs the agent of pod podName of base's configuration on
// NATS as n says (its registration TTL set to 3s).
func startAgentNATS(t *testing.T, base *config.Config, podName string, n config.NATS) *agentProc {
	t.Helper()
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "off", Models: base.Models, Events: base.Events}
	for _, p := range base.Pods {
		if p.Name == podName {
			cfg.Pods = append(cfg.Pods, p)
		}
	}
	n.RegistrationTTL = 3 * time.Second
	cfg.NATS = n
	cfg.Agent.Pod = podName
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

// stop ends the agent cleanly (its registrations are deleted).
func (p *agentProc) stop(t *testing.T) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("agent stopped with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("agent did not stop within 10s")
	}
	p.nc.Close()
	p.cancel = nil
}

// startReplica runs kvindex serve in fleet mode, with no engines of its
// own.
func startReplica(t *testing.T, natsURL string) *fleet {
	t.Helper()
	r := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.NATS = config.NATS{URL: natsURL, RegistrationTTL: 3 * time.Second}
	}})
	r.start()
	return r
}

// fleetRig is the whole fleet: engines, agents, replicas and the control.
type fleetRig struct {
	t        *testing.T
	nats     *natsServer
	direct   *fleet // the control, subscribed to the engines directly
	agents   map[string]*agentProc
	replicas []*fleet
}

func startFleetRig(t *testing.T, replicas int, specs ...podSpec) *fleetRig {
	t.Helper()
	for i := range specs {
		if specs[i].replayFrames == 0 {
			specs[i].replayFrames = 4
		}
	}
	rig := &fleetRig{t: t, nats: startNATS(t), agents: map[string]*agentProc{}}
	rig.direct = newFleet(t, fleetOptions{}, specs...)
	rig.direct.cfg.SetDefaults()
	for _, s := range specs {
		rig.agents[s.name] = startAgent(t, rig.direct.cfg, s.name, rig.nats.url())
	}
	rig.direct.start()
	rig.waitSubscribers(2)
	for range replicas {
		rig.replicas = append(rig.replicas, startReplica(t, rig.nats.url()))
	}
	return rig
}

// waitSubscribers waits until every engine has n subscribers (the control
// and the pod's agent).
func (r *fleetRig) waitSubscribers(n int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, p := range r.direct.pods {
		for _, pub := range p.pubs {
			if err := pub.WaitForSubscribers(ctx, n); err != nil {
				r.t.Fatalf("pod %s: %v", name, err)
			}
		}
	}
}

// refs lists every worker of the engines.
func (r *fleetRig) refs() []events.WorkerRef {
	var out []events.WorkerRef
	for name, p := range r.direct.pods {
		for rank := range p.pubs {
			out = append(out, events.WorkerRef{Pod: name, DPRank: rank})
		}
	}
	return out
}

// converged reports whether every replica holds, for every worker, what
// the worker's agent and the control hold (equal digests), and says what
// differs when not.
func (r *fleetRig) converged(replicas []*fleet) (bool, string) {
	for _, ref := range r.refs() {
		dw := r.direct.d.Index().LookupWorker(ref)
		aw := r.agents[ref.Pod].a.Index().LookupWorker(ref)
		if dw == nil || aw == nil {
			return false, fmt.Sprintf("%s missing in the control or the agent", ref)
		}
		want := dw.Digest()
		if got := aw.Digest(); got != want {
			return false, fmt.Sprintf("%s: agent digest %x, control %x", ref, got, want)
		}
		for i, rep := range replicas {
			rw := rep.d.Index().LookupWorker(ref)
			if rw == nil {
				return false, fmt.Sprintf("replica %d has no %s", i, ref)
			}
			if got := rw.Digest(); got != want {
				return false, fmt.Sprintf("replica %d: %s digest %x, control %x", i, ref, got, want)
			}
		}
	}
	return true, ""
}

// waitConverged waits up to within for every replica to converge.
func (r *fleetRig) waitConverged(within time.Duration, replicas ...*fleet) time.Duration {
	r.t.Helper()
	if len(replicas) == 0 {
		replicas = r.replicas
	}
	start := time.Now()
	var why string
	for time.Since(start) < within {
		var ok bool
		if ok, why = r.converged(replicas); ok {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("replicas did not converge within %v: %s", within, why)
	return 0
}

// sameScores checks that every replica answers Score for each prompt as
// the control does: the same workers with the same matched blocks and
// media.
func (r *fleetRig) sameScores(prompts [][]uint32) {
	r.t.Helper()
	for _, p := range prompts {
		want := scoreMap(r.direct.score(&kvindexv1.ScoreRequest{TokenIds: p}))
		for i, rep := range r.replicas {
			got := scoreMap(rep.score(&kvindexv1.ScoreRequest{TokenIds: p}))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				r.t.Fatalf("replica %d scores a %d-token prompt %v, the control %v", i, len(p), got, want)
			}
		}
	}
}

// scoreMap is a Score answer as worker -> matched blocks and media.
func scoreMap(resp *kvindexv1.ScoreResponse) map[string]string {
	out := map[string]string{}
	for _, w := range resp.GetWorkers() {
		var media string
		for _, m := range w.GetByMedium() {
			media += fmt.Sprintf(" %s:%d", m.GetMedium(), m.GetBlocks())
		}
		out[fmt.Sprintf("%s/%d", w.GetWorker().GetPod(), w.GetWorker().GetDpRank())] = fmt.Sprintf("%d%s", w.GetMatchedBlocks(), media)
	}
	return out
}

// workload drives the engines with a random but realistic stream: prompts
// sharing a few system prefixes, extended turn by turn (children of a
// stored block), offloaded to CPU, evicted block by block, and now and
// then cleared.
type workload struct {
	rig     *fleetRig
	rng     *rand.Rand
	engines map[events.WorkerRef]*engine
	// held is each worker's stored chains: block hashes and their tokens.
	held    map[events.WorkerRef][]chain
	prompts [][]uint32
}

type chain struct {
	hashes []uint64
	toks   []uint32
	medium string
}

func newWorkload(rig *fleetRig, seed uint64) *workload {
	w := &workload{rig: rig, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), engines: map[events.WorkerRef]*engine{}, held: map[events.WorkerRef][]chain{}}
	for i, ref := range rig.refs() {
		w.engines[ref] = &engine{next: uint64(i) << 32}
	}
	return w
}

// step sends one batch to a random worker.
func (w *workload) step() {
	refs := w.rig.refs()
	ref := refs[w.rng.IntN(len(refs))]
	eng := w.engines[ref]
	var evs []events.Event
	switch op := w.rng.IntN(100); {
	case op < 1:
		evs = append(evs, cleared)
		w.held[ref] = nil
	case op < 35 && len(w.held[ref]) > 0:
		// Evict a few blocks of one chain, from its tail (as vLLM's LRU
		// does) or anywhere.
		cs := w.held[ref]
		i := w.rng.IntN(len(cs))
		c := cs[i]
		n := 1 + w.rng.IntN(len(c.hashes))
		ev := removed(c.hashes[len(c.hashes)-n:]...)
		ev.MediumName = c.medium
		evs = append(evs, ev)
		if c.hashes = c.hashes[:len(c.hashes)-n]; len(c.hashes) == 0 {
			cs[i] = cs[len(cs)-1]
			w.held[ref] = cs[:len(cs)-1]
		} else {
			c.toks = c.toks[:len(c.hashes)*blockSize]
			cs[i] = c
		}
	case op < 60 && len(w.held[ref]) > 0:
		// The next turn of a conversation: a child of a stored block.
		cs := w.held[ref]
		i := w.rng.IntN(len(cs))
		c := cs[i]
		more := tokens(fmt.Sprintf("turn %d", w.rng.Uint64()), (1+w.rng.IntN(4))*blockSize)
		ev, hs := eng.store(c.hashes[len(c.hashes)-1], more)
		ev.MediumName = c.medium
		evs = append(evs, ev)
		c.hashes = append(c.hashes[:len(c.hashes):len(c.hashes)], hs...)
		c.toks = append(c.toks[:len(c.toks):len(c.toks)], more...)
		cs[i] = c
		w.prompts = append(w.prompts, c.toks)
	default:
		// A new request: one of five system prompts, then its own text.
		sys := tokens(fmt.Sprintf("system %d", w.rng.IntN(5)), 4*blockSize)
		toks := concat(sys, tokens(fmt.Sprintf("user %d", w.rng.Uint64()), (1+w.rng.IntN(6))*blockSize))
		ev, hs := eng.store(0, toks)
		medium := "GPU"
		if w.rng.IntN(5) == 0 {
			medium = "CPU"
		}
		ev.MediumName = medium
		evs = append(evs, ev)
		w.held[ref] = append(w.held[ref], chain{hashes: hs, toks: toks, medium: medium})
		w.prompts = append(w.prompts, toks)
	}
	w.rig.direct.publish(ref.Pod, ref.DPRank, evs...)
}

// samplePrompts returns up to n prompts seen, the latest first.
func (w *workload) samplePrompts(n int) [][]uint32 {
	var out [][]uint32
	for i := len(w.prompts) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, w.prompts[i])
	}
	return out
}

// TestFleetReplicasMatchControl: two replicas follow three workers (a
// pod with DP=2 and a single-rank pod) through a random stream of
// stores, extensions, offloads, evictions and clears; after every 25
// batches each replica holds exactly what the control holds (digests)
// and answers Score as it does.
func TestFleetReplicasMatchControl(t *testing.T) {
	rig := startFleetRig(t, 2, podSpec{name: "p0", dpSize: 2}, podSpec{name: "p1"})
	w := newWorkload(rig, 1)
	for i := 1; i <= 300; i++ {
		w.step()
		if i%25 == 0 {
			rig.waitConverged(10 * time.Second)
			rig.sameScores(w.samplePrompts(20))
		}
	}
	// ListWorkers shows the digests (when asked): equal on the control and
	// both replicas, and not computed unless asked.
	digests := func(f *fleet, ask bool) map[string]string {
		resp, err := f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{Digests: ask})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, ws := range resp.GetWorkers() {
			out[fmt.Sprintf("%s/%d", ws.GetWorker().GetPod(), ws.GetWorker().GetDpRank())] = fmt.Sprintf("%v:%x", ws.GetHasDigest(), ws.GetDigest())
		}
		return out
	}
	want := digests(rig.direct, true)
	if len(want) != 3 || want["p0/0"] == "true:0" || want["p0/0"] == want["p0/1"] {
		t.Fatalf("control's digests %v: want three distinct non-empty workers", want)
	}
	for i, rep := range rig.replicas {
		if got := digests(rep, true); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("replica %d's ListWorkers digests %v, the control's %v", i, got, want)
		}
	}
	if got := digests(rig.replicas[0], false); got["p0/0"] != "false:0" {
		t.Fatalf("digest without asking: %v", got)
	}
	// The replicas' worker list names the fleet as their source.
	st := rig.replicas[0].status("p0", 1)
	if st.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
		t.Fatalf("replica's p0/1 health %v (%s), want OK", st.GetHealth(), st.GetHealthReason())
	}
	if got := st.GetEndpoint(); got == "" || got[:5] != "nats:" {
		t.Fatalf("replica's p0/1 endpoint %q, want nats:<subject>", got)
	}
	// The event lag: the control timed every live batch from the engines
	// (ZeroMQ), each replica every delta it applied (NATS), all well under
	// a second on one host.
	lag := func(f *fleet, source string) (count, sum float64) {
		m := f.metrics()
		return labelled(m, `kvindex_event_lag_seconds_count{source="`+source+`"}`), labelled(m, `kvindex_event_lag_seconds_sum{source="`+source+`"}`)
	}
	if n, sum := lag(rig.direct, "zmq"); n < 250 || n > 300 || sum/n > 1 {
		t.Fatalf("control's lag: %v batches timed (300 sent), mean %v s", n, sum/n)
	}
	agents := 0.0
	for _, a := range rig.agents {
		agents += agentMetric(t, a.a, "kvindex_event_lag_seconds", "source", "zmq")
	}
	if agents < 250 || agents > 300 {
		t.Fatalf("the agents timed %v batches (300 sent)", agents)
	}
	for i, rep := range rig.replicas {
		if n, sum := lag(rep, "nats"); n < 200 || n > 300 || sum/n > 1 {
			t.Fatalf("replica %d's lag: %v deltas timed (of 300 batches), mean %v s", i, n, sum/n)
		}
	}
}

// TestFleetReplicaJoinsLate: a replica started after the engines have
// state loads it by snapshot and then follows.
func TestFleetReplicaJoinsLate(t *testing.T) {
	rig := startFleetRig(t, 0, podSpec{name: "p0", dpSize: 2})
	w := newWorkload(rig, 2)
	for range 150 {
		w.step()
	}
	rig.replicas = append(rig.replicas, startReplica(t, rig.nats.url()))
	rig.waitConverged(10 * time.Second)
	rig.sameScores(w.samplePrompts(30))
	for range 50 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.sameScores(w.samplePrompts(30))
}

// crash ends the agent as a killed process would: its NATS connection
// drops first, so its registrations stay until their TTL.
func (p *agentProc) crash(t *testing.T) {
	p.nc.Close()
	p.stop(t)
}

// TestFleetReplicaRestart: a replica stopped and replaced by a new one
// (a pod rescheduled) converges from snapshots while the engines keep
// going.
func TestFleetReplicaRestart(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 2}, podSpec{name: "p1"})
	w := newWorkload(rig, 3)
	for range 100 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.replicas[0].stop()
	for range 50 {
		w.step()
	}
	rig.replicas[0] = startReplica(t, rig.nats.url())
	took := rig.waitConverged(10 * time.Second)
	t.Logf("replacement replica converged %v after it started", took)
	rig.sameScores(w.samplePrompts(30))
}

// TestFleetAgentRestart: an agent that stops cleanly (its workers leave
// the replicas at once) or is killed (its registrations outlive it until
// their TTL) comes back with a new epoch, rebuilds its pod from the
// engines' replay buffers, and the replicas resync from it.
func TestFleetAgentRestart(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "clean", true: "killed"}[kill], func(t *testing.T) {
			rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 2}, podSpec{name: "p1"})
			w := newWorkload(rig, 4)
			for range 100 {
				w.step()
			}
			rig.waitConverged(10 * time.Second)
			epoch := rig.agents["p0"].a.NATS().Epoch()
			if kill {
				rig.agents["p0"].crash(t)
			} else {
				rig.agents["p0"].stop(t)
				// A clean stop deletes the registrations: the replica
				// drops p0's workers rather than serve a frozen copy.
				rig.replicas[0].waitFor(func() bool {
					return rig.replicas[0].d.Index().LookupWorker(events.WorkerRef{Pod: "p0", DPRank: 1}) == nil
				}, "the replica to drop p0's workers")
			}
			for range 30 {
				w.step() // p0's events reach only the control meanwhile
			}
			rig.agents["p0"] = startAgent(t, rig.direct.cfg, "p0", rig.nats.url())
			if rig.agents["p0"].a.NATS().Epoch() == epoch {
				t.Fatal("the restarted agent kept its epoch")
			}
			rig.waitConverged(15 * time.Second)
			rig.sameScores(w.samplePrompts(30))
			for range 30 {
				w.step()
			}
			rig.waitConverged(10 * time.Second)
		})
	}
}

// TestFleetNATSRestart: the NATS server goes away for a second (a
// restart, or a partition between it and everyone); the engines keep
// producing, the agents keep indexing, and once NATS is back every
// replica resyncs and converges. While it is down the replica's workers
// say why they may be behind.
func TestFleetNATSRestart(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 2})
	w := newWorkload(rig, 5)
	for range 80 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.nats.s.Shutdown()
	rig.nats.s.WaitForShutdown()
	rig.replicas[0].waitFor(func() bool {
		return rig.replicas[0].status("p0", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_RECOVERING
	}, "the replica to flag its fleet workers while NATS is down")
	for range 60 {
		w.step()
	}
	time.Sleep(time.Second)
	rig.nats.start()
	took := rig.waitConverged(20 * time.Second)
	t.Logf("converged %v after NATS came back", took)
	rig.sameScores(w.samplePrompts(30))
	if n := rig.replicas[0].d.Fleet().Reconnects(); n < 1 {
		t.Fatalf("replica counted %d reconnections, want >= 1", n)
	}
	for range 30 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	if h := rig.replicas[0].status("p0", 1).GetHealth(); h != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
		t.Fatalf("after NATS is back, p0/1 health %v, want OK", h)
	}
}

// TestFleetEngineRestart: the engine restarts under a running agent (its
// seq returns to 0, its cache is empty); the agent clears the worker and
// publishes the clear, and the replicas follow the new process.
func TestFleetEngineRestart(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 2})
	w := newWorkload(rig, 6)
	for range 80 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	ref := events.WorkerRef{Pod: "p0", DPRank: 1}
	if rig.replicas[0].d.Index().LookupWorker(ref).Stats().ResidentBlocks == 0 {
		t.Fatal("p0/1 holds nothing before the restart; the test needs state to lose")
	}
	rig.direct.pods["p0"].pubs[1].SetSeq(0) // a new engine process
	w.held[ref] = nil
	w.step() // the restart shows with the next batch
	for range 40 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.sameScores(w.samplePrompts(30))
	if st := rig.agents["p0"].a.Subscriber().WorkerStats(); len(st) == 0 {
		t.Fatal("agent has no stream stats")
	}
	var restarts int64
	for _, st := range rig.agents["p0"].a.Subscriber().WorkerStats() {
		if st.Worker == ref {
			restarts = st.Restarts
		}
	}
	if restarts == 0 {
		t.Fatal("the agent did not see the engine restart")
	}
}

// forge publishes a delta message for ref on its subject, as copied from
// the agent's last one with another seq (a stand-in for messages the
// replica never got: it sees the seq jump).
func forgeGap(t *testing.T, nc *nats.Conn, subject string, last *nats.Msg, skip uint64) {
	t.Helper()
	var d fleetv1.Delta
	if err := proto.Unmarshal(last.Data, &d); err != nil {
		t.Fatal(err)
	}
	d.Seq += skip
	b, err := proto.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subject, b); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestFleetDuplicatedAndDroppedDeltas: every delta of a worker arrives
// twice (a republisher on its subject), and then the replica misses some
// (a message with a seq past the next); duplicates are counted and
// dropped, the gap resyncs the worker from a snapshot, first clearing
// what it held (answers must not name blocks it may no longer hold while
// the snapshot loads), and the replica converges.
func TestFleetDuplicatedAndDroppedDeltas(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0"})
	w := newWorkload(rig, 7)
	for range 20 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	subject := natsbus.DeltaSubject(model, events.WorkerRef{Pod: "p0"})
	nc, err := nats.Connect(rig.nats.url(), nats.NoEcho()) // not its own republished copies
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var last *nats.Msg
	dup, err := nc.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		last = m
		mu.Unlock()
		_ = nc.Publish(subject, m.Data)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 60 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.sameScores(w.samplePrompts(20))
	st := rig.replicas[0].status("p0", 0)
	if st.GetDuplicates() < 50 || st.GetDuplicates() > 60 {
		t.Fatalf("replica counted %d duplicates of 60 republished deltas (a few may fall within a resync)", st.GetDuplicates())
	}
	_ = dup.Unsubscribe()
	resetsBefore := st.GetResets()

	// A watch of the replica's worker sees the resync: the reset, then
	// the restore from the agent's snapshot.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watch, err := rig.replicas[0].client.Watch(wctx, &kvindexv1.WatchRequest{Workers: []*kvindexv1.WorkerRef{ref("p0")},
		Kinds: []kvindexv1.WatchEventKind{kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESET, kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED}})
	if err != nil {
		t.Fatal(err)
	}
	waitWatchers(t, rig.replicas[0], 1)

	mu.Lock()
	m := last
	mu.Unlock()
	forgeGap(t, nc, subject, m, 3)
	rig.replicas[0].waitFor(func() bool { return rig.replicas[0].status("p0", 0).GetGaps() >= 1 }, "the replica to count the gap")
	for _, want := range []kvindexv1.WatchEventKind{kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESET, kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED} {
		ev, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetKind() != want {
			t.Fatalf("watch: %v, want %v", ev, want)
		}
		if want == kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED {
			if held := rig.replicas[0].status("p0", 0).GetResidentBlocks(); ev.GetReason() != "snapshot" || uint64(ev.GetBlocks()) != held || held == 0 {
				t.Fatalf("restored event %v; the worker holds %d blocks", ev, held)
			}
		}
	}
	wcancel()
	for range 20 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.sameScores(w.samplePrompts(20))
	st = rig.replicas[0].status("p0", 0)
	if st.GetResets() != resetsBefore+1 || !strings.HasPrefix(st.GetLastReset(), "fleet resync: deltas") {
		t.Fatalf("after the gap: resets %d (was %d), last reset %q; want one more, for the resync", st.GetResets(), resetsBefore, st.GetLastReset())
	}
	if st.GetMissedBatches() < 2 {
		t.Fatalf("missed batches %d, want >= 2", st.GetMissedBatches())
	}
}

// TestFleetAgentGoesSilent: a killed agent that does not come back. Its
// registration is not refreshed, so after half its TTL the replica marks
// its workers STALE (left out of answers, saying why), and when the entry
// expires the replica drops them.
func TestFleetAgentGoesSilent(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0"}, podSpec{name: "p1"})
	w := newWorkload(rig, 8)
	for range 40 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.agents["p1"].crash(t)
	killed := time.Now()
	rep := rig.replicas[0]
	rep.waitFor(func() bool {
		return rep.status("p1", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE
	}, "the replica to mark the silent agent's worker STALE")
	if took := time.Since(killed); took > 3*time.Second {
		t.Fatalf("STALE after %v, want within the 3 s TTL", took)
	}
	if r := rep.status("p1", 0).GetHealthReason(); !strings.Contains(r, "has not refreshed its registration") {
		t.Fatalf("STALE reason %q", r)
	}
	if h := rep.status("p0", 0).GetHealth(); h != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
		t.Fatalf("the live agent's worker is %v", h)
	}
	for _, p := range w.samplePrompts(20) {
		if n, _ := matched(rep.score(&kvindexv1.ScoreRequest{TokenIds: p}), "p1", 0); n != 0 {
			t.Fatalf("a STALE worker is named with %d blocks", n)
		}
	}
	rep.waitFor(func() bool {
		return rep.d.Index().LookupWorker(events.WorkerRef{Pod: "p1"}) == nil
	}, "the expired registration to remove the worker")
}

// blackhole is a TCP proxy that can stop passing bytes without closing
// anything, as a network partition does.
type blackhole struct {
	t      *testing.T
	lis    net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{t: t, lis: lis, target: target}
	t.Cleanup(func() { lis.Close(); b.closeAll() })
	go b.accept()
	return b
}

func (b *blackhole) url() string { return "nats://" + b.lis.Addr().String() }

func (b *blackhole) accept() {
	for {
		c, err := b.lis.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		cut := b.cut
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		if cut {
			continue // held open, silent: a connection attempt into the partition
		}
		up, err := net.Dial("tcp", b.target)
		if err != nil {
			c.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, up)
		b.mu.Unlock()
		go b.pipe(c, up)
		go b.pipe(up, c)
	}
}

// pipe copies while the proxy is not cut; once cut, bytes stop (they are
// held, as a partitioned network's are, and then the connection is
// dropped when the partition heals).
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		for {
			b.mu.Lock()
			cut := b.cut
			b.mu.Unlock()
			if !cut {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			src.Close()
			return
		}
	}
}

// partition stops all traffic; heal drops the connections that were open
// across it (the server has long since timed them out) and lets new ones
// through.
func (b *blackhole) partition() { b.mu.Lock(); b.cut = true; b.mu.Unlock() }

func (b *blackhole) heal() {
	b.closeAll()
	b.mu.Lock()
	b.cut = false
	b.mu.Unlock()
}

func (b *blackhole) closeAll() {
	b.mu.Lock()
	cs := b.conns
	b.conns = nil
	b.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// TestFleetReplicaPartitioned: one replica is cut off from NATS for 10 s
// by a partition (no bytes, nothing closed). The other replica is not
// disturbed; the cut one stops trusting its copy (STALE within the
// registration's half-TTL, as no heartbeat reaches it), and once the
// network heals it reconnects, resyncs and converges.
func TestFleetReplicaPartitioned(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10 s partition")
	}
	rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 2})
	bh := newBlackhole(t, fmt.Sprintf("127.0.0.1:%d", rig.nats.port))
	cutRep := startReplica(t, bh.url())
	w := newWorkload(rig, 9)
	for range 60 {
		w.step()
	}
	rig.waitConverged(10*time.Second, rig.replicas[0], cutRep)
	bh.partition()
	start := time.Now()
	cutRep.waitFor(func() bool {
		return cutRep.status("p0", 0).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_STALE
	}, "the partitioned replica to mark its workers STALE")
	t.Logf("partitioned replica STALE after %v (%s)", time.Since(start).Round(time.Millisecond), cutRep.status("p0", 0).GetHealthReason())
	for time.Since(start) < 10*time.Second {
		w.step()
		time.Sleep(50 * time.Millisecond)
	}
	rig.waitConverged(5*time.Second, rig.replicas[0]) // the other replica followed throughout
	bh.heal()
	took := rig.waitConverged(20*time.Second, cutRep)
	t.Logf("converged %v after the partition healed", took)
	rig.replicas = append(rig.replicas, cutRep)
	rig.sameScores(w.samplePrompts(30))
	cutRep.waitFor(func() bool {
		return cutRep.status("p0", 1).GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_OK
	}, "the healed replica's workers to be OK")
}

// proc is a kvindex binary run as a child process.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan error
}

func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(bin, args...), logs: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.kill() })
	return p
}

// kill ends the process with SIGKILL: no cleanup of any kind runs.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("process %s did not die on SIGKILL", p.cmd.Path)
	}
}

// writeConfig writes c as YAML in dir and returns its path.
func writeConfig(t *testing.T, dir, name string, c *config.Config) string {
	t.Helper()
	text, err := config.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// remoteDigests asks a kvindex at addr for its workers' digests.
func remoteDigests(addr string) (map[events.WorkerRef]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := api.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	resp, err := c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Digests: true})
	if err != nil {
		return nil, err
	}
	out := map[events.WorkerRef]uint64{}
	for _, ws := range resp.GetWorkers() {
		if ws.GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
			out[events.WorkerRef{Pod: ws.GetWorker().GetPod(), DPRank: int(ws.GetWorker().GetDpRank())}] = ws.GetDigest()
		}
	}
	return out, nil
}

// waitRemoteConverged waits until the kvindex at addr lists every worker
// OK with the control's digest.
func (r *fleetRig) waitRemoteConverged(addr string, within time.Duration, logs *syncBuffer) time.Duration {
	r.t.Helper()
	start := time.Now()
	var why string
	for time.Since(start) < within {
		got, err := remoteDigests(addr)
		if err != nil {
			why = err.Error()
		} else {
			why = ""
			for _, ref := range r.refs() {
				if want := r.direct.d.Index().LookupWorker(ref).Digest(); got[ref] != want {
					why = fmt.Sprintf("%s: digest %x, control %x (OK workers: %d)", ref, got[ref], want, len(got))
					break
				}
			}
			if why == "" {
				return time.Since(start)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("kvindex at %s did not converge within %v: %s\nits logs:\n%s", addr, within, why, logs.String())
	return 0
}

// TestFleetBinariesKill9 runs the real binaries, kvindex agent beside
// each pod and kvindex serve as a replica, and kills each with SIGKILL:
// the replica comes back empty and converges from the agents' snapshots;
// the agent comes back with a new epoch (its old registration left behind
// until replaced), rebuilds from the engine's replay buffer and the
// replica resyncs from it.
func TestFleetBinariesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvindex")
	if b, err := exec.Command("go", "build", "-o", bin, "../cmd/kvindex").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	rig := &fleetRig{t: t, nats: startNATS(t), agents: map[string]*agentProc{}}
	rig.direct = newFleet(t, fleetOptions{}, podSpec{name: "p0", dpSize: 2, replayFrames: 4})
	rig.direct.cfg.SetDefaults()
	rig.direct.start()
	nats := config.NATS{URL: rig.nats.url(), RegistrationTTL: 3 * time.Second}
	agentAddr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1))
	agentCfg := writeConfig(t, dir, "agent.yaml", &config.Config{MetricsListen: config.MetricsOff, Models: rig.direct.cfg.Models, Pods: rig.direct.cfg.Pods, NATS: nats,
		Agent: config.Agent{GRPCListen: agentAddr}})
	replicaAddr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1))
	replicaCfg := writeConfig(t, dir, "replica.yaml", &config.Config{GRPCListen: replicaAddr, MetricsListen: config.MetricsOff, NATS: nats})

	agent := startProc(t, bin, "agent", "--config", agentCfg, "--log-format", "json")
	rig.waitSubscribers(2)
	replica := startProc(t, bin, "serve", "--config", replicaCfg, "--log-format", "json")
	w := newWorkload(rig, 10)
	for range 80 {
		w.step()
	}
	rig.waitRemoteConverged(replicaAddr, 15*time.Second, replica.logs)
	// The agent binary serves its index (agent.grpc_listen): kvindexctl
	// diff finds the replica equal to it, worker by worker.
	var out bytes.Buffer
	if err := ctl.Diff(context.Background(), ctl.Config{Addr: replicaAddr, Timeout: 5 * time.Second, JSON: true, Out: &out}, ctl.DiffArgs{Other: agentAddr}); err != nil {
		t.Fatalf("diff replica vs agent: %v", err)
	}
	if n := strings.Count(out.String(), `"state": "equal"`); n != 2 {
		t.Fatalf("diff replica vs agent: %d of 2 workers equal:\n%s", n, out.String())
	}

	replica.kill()
	for range 30 {
		w.step()
	}
	replica = startProc(t, bin, "serve", "--config", replicaCfg, "--log-format", "json")
	took := rig.waitRemoteConverged(replicaAddr, 15*time.Second, replica.logs)
	t.Logf("replica restarted after kill -9 converged in %v (process start included)", took)

	agent.kill()
	for range 30 {
		w.step() // within the engines' replay buffers
	}
	agent = startProc(t, bin, "agent", "--config", agentCfg, "--log-format", "json")
	took = rig.waitRemoteConverged(replicaAddr, 15*time.Second, agent.logs)
	t.Logf("after the agent's kill -9 and restart the replica converged in %v", took)
	for range 30 {
		w.step()
	}
	rig.waitRemoteConverged(replicaAddr, 10*time.Second, replica.logs)
}
