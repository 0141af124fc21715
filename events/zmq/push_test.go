package zmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// pushRig is a subscriber with one pull-mode worker "a" (model m) and one
// push listener, over a real index.
type pushRig struct {
	t        *testing.T
	ix       *indexer.Index
	sub      *zmq.Subscriber
	pull     *enginepub.Publisher
	pushAddr string
	mu       sync.Mutex
	created  []string
}

func newPushRig(t *testing.T, pl zmq.PushListener) *pushRig {
	t.Helper()
	return newPushRigWith(t, pl, nil)
}

func newPushRigWith(t *testing.T, pl zmq.PushListener, tune func(*zmq.SubscriberOptions)) *pushRig {
	t.Helper()
	r := &pushRig{t: t, ix: indexer.New(indexer.Config{})}
	for _, m := range []string{"m", "m2"} {
		if _, err := r.ix.AddModel(m, 16); err != nil {
			t.Fatal(err)
		}
	}
	pullEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	var err error
	if r.pull, err = enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: pullEP, Bind: true, Topic: "kv@a@m"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.pull.Close() })
	a, err := r.ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: "a"}, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	base, err := netutil.FreePorts(max(pl.DPSize, 1)) // a port per DP rank
	if err != nil {
		t.Fatal(err)
	}
	r.pushAddr = fmt.Sprintf("tcp://127.0.0.1:%d", base)
	pl.Address = r.pushAddr
	opts := zmq.SubscriberOptions{
		Push: []zmq.PushListener{pl},
		NewWorker: func(ref events.WorkerRef, model, _ string) (events.Sink, error) {
			r.mu.Lock()
			r.created = append(r.created, ref.String()+"@"+model)
			r.mu.Unlock()
			return r.ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model, Endpoint: "push"})
		},
	}
	if tune != nil {
		tune(&opts)
	}
	if r.sub, err = zmq.NewSubscriber(opts, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: pullEP, Sink: a}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	if err := r.pull.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return r
}

// engine connects a push-mode engine with the given topic.
func (r *pushRig) engine(topic string) *enginepub.Publisher {
	r.t.Helper()
	p, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: r.pushAddr, Topic: topic})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { p.Close() })
	if err := p.WaitForSubscribers(context.Background(), 1); err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *pushRig) refused(reason string) int64 { return r.refusedOn(r.pushAddr, reason) }

// refusedOn is the listener at addr's count of refusals for reason.
func (r *pushRig) refusedOn(addr, reason string) int64 {
	for _, x := range r.sub.Refusals() {
		if x.Source == addr && x.Reason == reason {
			return x.Count
		}
	}
	return 0
}

// engineOn connects a push-mode engine with the given topic to the
// listener at addr.
func (r *pushRig) engineOn(addr, topic string) *enginepub.Publisher {
	r.t.Helper()
	p, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: addr, Topic: topic})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { p.Close() })
	if err := p.WaitForSubscribers(context.Background(), 1); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// createdWorkers returns the push workers created so far, as pod/rank@model.
func (r *pushRig) createdWorkers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.created...)
}

func storeBatch(rank int, hashes ...uint64) *events.Batch {
	toks := make([]uint32, 16*len(hashes))
	for i := range toks {
		toks[i] = uint32(hashes[0]) + uint32(i)
	}
	return &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: 16}}, DPRank: rank, HasDPRank: true}
}

// A push message can never reach a pull-mode worker, whatever model its
// topic names, nor a worker of another model; topics that name no pod,
// out-of-range ranks and undecodable messages create nothing.
func TestPushIsFenced(t *testing.T) {
	r := newPushRig(t, zmq.PushListener{})
	if _, err := r.pull.Publish(storeBatch(0, 1, 2)); err != nil {
		t.Fatal(err)
	}
	a := r.ix.LookupWorker(events.WorkerRef{Pod: "a"})
	waitFor(t, "the pull worker's blocks", func() bool { return a.Stats().ResidentBlocks == 2 })

	// The pull worker's pod, under its own model and another one.
	for i, topic := range []string{"kv@a@m", "kv@a@m2"} {
		p := r.engine(topic)
		p.SetSeq(0) // a seq that would read as a restart of "a"
		if _, err := p.Publish(storeBatch(0, 100)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the refusal of "+topic, func() bool { return r.refused("pull_worker") == int64(i+1) })
	}
	if st := a.Stats(); st.ResidentBlocks != 2 || st.Resets != 0 {
		t.Fatalf("push messages touched the pull worker: %+v", st)
	}
	if st := statsOf(r.sub, "a"); st.Restarts != 0 || st.Batches != 1 {
		t.Fatalf("pull stream saw push messages: %+v", st)
	}

	// A push worker of model m, then the same pod under model m2.
	p := r.engine("kv@p@m")
	if _, err := p.Publish(storeBatch(0, 7)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "push worker p", func() bool {
		w := r.ix.LookupWorker(events.WorkerRef{Pod: "p"})
		return w != nil && w.Stats().ResidentBlocks == 1
	})
	q := r.engine("kv@p@m2")
	if _, err := q.Publish(storeBatch(0, 8)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other-model refusal", func() bool { return r.refused("other_model") == 1 })

	// Unknown topic, bad ranks, garbage.
	u := r.engine("no-convention")
	if _, err := u.Publish(storeBatch(0, 9)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unknown-topic refusal", func() bool { return r.refused("unknown_topic") == 1 })
	g := r.engine("kv@g@m")
	for _, rank := range []int{-5, 1 << 20} {
		if _, err := g.Publish(storeBatch(rank, 10)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the rank refusals", func() bool { return r.refused("dp_rank") == 2 })
	if _, err := g.PublishRaw([]byte{0x93, 0xc1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the undecodable refusal", func() bool { return r.refused("undecodable") == 1 })
	r.mu.Lock()
	created := append([]string(nil), r.created...)
	r.mu.Unlock()
	if len(created) != 1 || created[0] != "p/0@m" {
		t.Fatalf("push workers created: %v, want only p/0@m", created)
	}
}

// A listener creates at most MaxWorkers workers.
func TestPushMaxWorkers(t *testing.T) {
	r := newPushRig(t, zmq.PushListener{MaxWorkers: 2})
	for i := range 3 {
		p := r.engine(fmt.Sprintf("kv@p%d@m", i))
		if _, err := p.Publish(storeBatch(0, uint64(10+i))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the third worker's refusal", func() bool { return r.refused("max_workers") == 1 })
	if n := len(r.ix.Workers()); n != 3 { // a (pull) and two push workers
		t.Fatalf("%d workers in the index, want 3", n)
	}
}

// With an allowlist, an engine connecting from another address is refused
// at the handshake and counted; one from an allowed address is served, on
// every DP rank's port.
func TestPushAllowlist(t *testing.T) {
	r := newPushRig(t, zmq.PushListener{Allow: []string{"10.255.255.1"}, DPSize: 2})
	rank1 := func(r *pushRig) string {
		ep, err := events.OffsetEndpoint(r.pushAddr, 1)
		if err != nil {
			t.Fatal(err)
		}
		return ep
	}
	for i, ep := range []string{r.pushAddr, rank1(r)} {
		before := r.refused("address")
		p, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: ep, Topic: "kv@p@m"})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the refused connection to "+ep, func() bool { return r.refused("address") > before })
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		if err := p.WaitForSubscribers(ctx, 1); err == nil {
			t.Fatalf("an engine from a refused address subscribed at %s", ep)
		}
		cancel()
		if _, err := p.Publish(storeBatch(i, 5)); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	if ws := r.ix.Workers(); len(ws) != 1 {
		t.Fatalf("engines from a refused address created workers: %d in the index, want only the pull worker", len(ws))
	}

	ok := newPushRig(t, zmq.PushListener{Allow: []string{"127.0.0.0/8"}, DPSize: 2})
	for i, ep := range []string{ok.pushAddr, rank1(ok)} {
		e := ok.engineOn(ep, "kv@p@m")
		if _, err := e.Publish(storeBatch(i, 5)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the allowed engine's worker at "+ep, func() bool {
			w := ok.ix.LookupWorker(events.WorkerRef{Pod: "p", DPRank: i})
			return w != nil && w.Stats().ResidentBlocks == 1
		})
	}
}

// A push message creates no worker under a pull-mode pod's name at any
// rank, not only at the ranks the pod is configured with: pull pod "a"
// has rank 0 only, and ranks 1 and 7 under its model or another one are
// refused (pull_worker), not created as push workers a/1 and a/7.
func TestPushFencesPullPodsAtEveryRank(t *testing.T) {
	r := newPushRig(t, zmq.PushListener{})
	for i, c := range []struct {
		topic string
		rank  int
	}{{"kv@a@m", 1}, {"kv@a@m", 7}, {"kv@a@m2", 1}} {
		p := r.engine(c.topic)
		if _, err := p.Publish(storeBatch(c.rank, uint64(100+i))); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("the refusal of %s at rank %d", c.topic, c.rank), func() bool { return r.refused("pull_worker") == int64(i+1) })
	}
	if got := r.createdWorkers(); len(got) != 0 {
		t.Fatalf("push workers created under pull pod a: %v", got)
	}
	var refs []string
	for _, w := range r.ix.Workers() {
		refs = append(refs, w.Info().Ref.String())
	}
	if len(refs) != 1 || refs[0] != "a/0" {
		t.Fatalf("index workers %v, want only the pull worker a/0", refs)
	}
	if st := statsOf(r.sub, "a"); st.Batches != 0 || st.Restarts != 0 || len(r.sub.WorkerStats()) != 1 {
		t.Fatalf("the pull stream saw push messages or a stream was added: %+v (%d streams)", st, len(r.sub.WorkerStats()))
	}
}

// A pod routed on one listener is claimable only there, and only through
// its route: a process on another listener that names it first (before
// its engine has sent anything) is refused (other_listener), and so is a
// kv@ topic naming it on its own listener (routed_pod); the routed engine
// then creates and feeds its worker. A dynamic name is owned by the
// listener that heard it first, at every rank and for one model.
func TestPushRoutedPodOnlyOnItsListener(t *testing.T) {
	routedAddr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	r := newPushRigWith(t, zmq.PushListener{}, func(o *zmq.SubscriberOptions) {
		o.Push = append(o.Push, zmq.PushListener{Address: routedAddr, Routes: map[string]events.TopicRoute{"engine-p": {Pod: "p", Model: "m"}}})
	})
	open := r.pushAddr

	// The squatters, before the routed engine: on the open listener at
	// ranks 0 and 1, and under the convention on the routed listener.
	sq := r.engineOn(open, "kv@p@m")
	for i, rank := range []int{0, 1} {
		if _, err := sq.Publish(storeBatch(rank, uint64(50+i))); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("the open listener's refusal of p at rank %d", rank), func() bool { return r.refusedOn(open, "other_listener") == int64(i+1) })
	}
	conv := r.engineOn(routedAddr, "kv@p@m")
	if _, err := conv.Publish(storeBatch(0, 60)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the routed listener's refusal of kv@p@m", func() bool { return r.refusedOn(routedAddr, "routed_pod") == 1 })
	if got := r.createdWorkers(); len(got) != 0 {
		t.Fatalf("squatters created %v", got)
	}

	// The routed engine owns its name.
	e := r.engineOn(routedAddr, "engine-p")
	if _, err := e.Publish(storeBatch(0, 7, 8)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "routed worker p", func() bool {
		w := r.ix.LookupWorker(events.WorkerRef{Pod: "p"})
		return w != nil && w.Stats().ResidentBlocks == 2
	})
	if st := statsOf(r.sub, "p"); st.Endpoint != routedAddr || st.Topic != "engine-p" || st.Batches != 1 {
		t.Fatalf("worker p: endpoint %q, topic %q, %d batches; want %q, engine-p, 1", st.Endpoint, st.Topic, st.Batches, routedAddr)
	}
	if _, err := sq.Publish(storeBatch(0, 51)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the open listener's refusal after the engine", func() bool { return r.refusedOn(open, "other_listener") == 3 })
	if st := r.ix.LookupWorker(events.WorkerRef{Pod: "p"}).Stats(); st.ResidentBlocks != 2 || st.Resets != 0 {
		t.Fatalf("the squatter touched worker p: %+v", st)
	}

	// A dynamic name: the open listener hears q first, so the routed
	// listener may not create q at any rank.
	q := r.engineOn(open, "kv@q@m")
	if _, err := q.Publish(storeBatch(0, 9)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "dynamic worker q", func() bool { return r.ix.LookupWorker(events.WorkerRef{Pod: "q"}) != nil })
	q2 := r.engineOn(routedAddr, "kv@q@m")
	if _, err := q2.Publish(storeBatch(1, 10)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the routed listener's refusal of q/1", func() bool { return r.refusedOn(routedAddr, "other_listener") == 1 })
	// Nor may another model take q at another rank.
	q3 := r.engineOn(open, "kv@q@m2")
	if _, err := q3.Publish(storeBatch(2, 11)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the open listener's refusal of q/2 for m2", func() bool { return r.refusedOn(open, "other_model") == 1 })
	got := r.createdWorkers()
	slices.Sort(got)
	if want := []string{"p/0@m", "q/0@m"}; !slices.Equal(got, want) {
		t.Fatalf("push workers created: %v, want %v", got, want)
	}
	for _, reason := range []string{"pull_worker", "max_workers", "no_worker"} {
		if n := r.refusedOn(open, reason) + r.refusedOn(routedAddr, reason); n != 0 {
			t.Errorf("%d refusals for %s, want 0", n, reason)
		}
	}
}

// A configuration that routes one pod on two listeners, or routes a
// pull-mode pod, is refused: it would leave the pod's owner undecided.
func TestNewSubscriberRefusesConflictingRoutes(t *testing.T) {
	nop := func(events.WorkerRef, string, string) (events.Sink, error) { return nil, errors.New("unused") }
	route := func(pod string) map[string]events.TopicRoute {
		return map[string]events.TopicRoute{"t-" + pod: {Pod: pod, Model: "m"}}
	}
	ix := indexer.New(indexer.Config{})
	a := newWorker(t, ix, "a")
	for _, c := range []struct {
		name string
		push []zmq.PushListener
		want string
	}{
		{"two listeners", []zmq.PushListener{{Address: "tcp://127.0.0.1:1", Routes: route("p")}, {Address: "tcp://127.0.0.1:2", Routes: route("p")}},
			`events: push listener tcp://127.0.0.1:2: route "t-p": pod "p" is routed on push listener tcp://127.0.0.1:1 too`},
		{"pull pod", []zmq.PushListener{{Address: "tcp://127.0.0.1:1", Routes: route("a")}},
			`events: push listener tcp://127.0.0.1:1: route "t-a": pod "a" is a pull-mode pod`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := zmq.NewSubscriber(zmq.SubscriberOptions{Push: c.push, NewWorker: nop}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: "tcp://127.0.0.1:3", Sink: a})
			if err == nil || err.Error() != c.want {
				t.Fatalf("NewSubscriber: %v, want %s", err, c.want)
			}
		})
	}
	// Two routes of one pod on one listener are one owner.
	two := map[string]events.TopicRoute{"t1": {Pod: "p", Model: "m"}, "t2": {Pod: "p", Model: "m"}}
	if _, err := zmq.NewSubscriber(zmq.SubscriberOptions{Push: []zmq.PushListener{{Address: "tcp://127.0.0.1:1", Routes: two}}, NewWorker: nop}); err != nil {
		t.Fatalf("two routes of one pod on one listener: %v", err)
	}
}

// statsOfRef is worker ref's transport stats (zero if it has none).
func statsOfRef(s *zmq.Subscriber, ref events.WorkerRef) events.WorkerStats {
	for _, st := range s.WorkerStats() {
		if st.Worker == ref {
			return st
		}
	}
	return events.WorkerStats{}
}

// vLLM offsets a connecting endpoint's port by the DP rank, as it does a
// bound one: rank r of an engine told the listener's address publishes to
// base+r. A listener of DPSize 4 binds the four ports and attributes by
// port: ranks 0-3 of pod p reach p/0-p/3 with their own blocks (rank 3 an
// older vLLM with no rank in its payload), an undecodable message reaches
// its port's rank, and a message whose payload rank disagrees with its
// port is refused (dp_rank_mismatch) and reaches no worker. A listener of
// DPSize 1 still takes every rank at one address by the payload's rank.
func TestPushDPRanksByPort(t *testing.T) {
	legacy := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	r := newPushRigWith(t, zmq.PushListener{DPSize: 4}, func(o *zmq.SubscriberOptions) {
		o.Push = append(o.Push, zmq.PushListener{Address: legacy})
	})
	portOf := func(rank int) string {
		ep, err := events.OffsetEndpoint(r.pushAddr, rank)
		if err != nil {
			t.Fatal(err)
		}
		return ep
	}
	hashes := func(rank int) []uint64 { // rank r holds r+1 blocks of its own
		var hs []uint64
		for i := range rank + 1 {
			hs = append(hs, uint64(1000*(rank+1)+i))
		}
		return hs
	}
	var all []uint64
	engines := make([]*enginepub.Publisher, 4)
	for rank := range 4 {
		engines[rank] = r.engineOn(portOf(rank), "kv@p@m")
		b := storeBatch(rank, hashes(rank)...)
		if rank == 3 {
			b.HasDPRank, b.DPRank = false, 0 // vLLM 0.9: no rank in the payload
		}
		if _, err := engines[rank].Publish(b); err != nil {
			t.Fatal(err)
		}
		all = append(all, hashes(rank)...)
	}
	for rank := range 4 {
		ref := events.WorkerRef{Pod: "p", DPRank: rank}
		waitFor(t, "worker "+ref.String(), func() bool {
			w := r.ix.LookupWorker(ref)
			return w != nil && w.Stats().ResidentBlocks == int64(rank+1)
		})
		blocks, err := r.ix.LookupWorker(ref).EngineBlocks(all, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if own := slices.Contains(hashes(rank), b.Hash); b.Found != own {
				t.Errorf("%s holds block %d: %v, want %v", ref, b.Hash, b.Found, own)
			}
		}
		if st := statsOfRef(r.sub, ref); st.Endpoint != portOf(rank) || st.Batches != 1 {
			t.Errorf("%s: endpoint %q, %d batches; want %q, 1", ref, st.Endpoint, st.Batches, portOf(rank))
		}
	}

	// An undecodable message is its port's rank's decode error.
	if _, err := engines[2].PublishRaw([]byte{0x93, 0xc1}); err != nil {
		t.Fatal(err)
	}
	p2 := events.WorkerRef{Pod: "p", DPRank: 2}
	waitFor(t, "p/2's decode error", func() bool { return statsOfRef(r.sub, p2).DecodeErrors == 1 })

	// Payload ranks that disagree with the port: rank 0 and rank 2 on rank
	// 1's port, for p and for a pod not seen yet.
	stray := r.engineOn(portOf(1), "kv@p@m")
	if _, err := stray.Publish(storeBatch(0, 77)); err != nil {
		t.Fatal(err)
	}
	strayQ := r.engineOn(portOf(1), "kv@q@m")
	if _, err := strayQ.Publish(storeBatch(2, 78)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the mismatch refusals", func() bool { return r.refused("dp_rank_mismatch") == 2 })
	for rank := range 4 {
		ref := events.WorkerRef{Pod: "p", DPRank: rank}
		st, ws := statsOfRef(r.sub, ref), r.ix.LookupWorker(ref).Stats()
		if ws.ResidentBlocks != int64(rank+1) || ws.Resets != 0 || st.Restarts != 0 || st.Batches != 1 || (st.DecodeErrors == 1) != (rank == 2) {
			t.Errorf("%s after the refusals: %+v, index %+v", ref, st, ws)
		}
	}

	// One address for every rank, by the payload's rank.
	for rank := range 2 {
		e := r.engineOn(legacy, "kv@old@m")
		if _, err := e.Publish(storeBatch(rank, hashes(rank)...)); err != nil {
			t.Fatal(err)
		}
		ref := events.WorkerRef{Pod: "old", DPRank: rank}
		waitFor(t, "worker "+ref.String(), func() bool {
			w := r.ix.LookupWorker(ref)
			return w != nil && w.Stats().ResidentBlocks == int64(rank+1)
		})
	}
	got := r.createdWorkers()
	slices.Sort(got)
	if want := []string{"old/0@m", "old/1@m", "p/0@m", "p/1@m", "p/2@m", "p/3@m"}; !slices.Equal(got, want) {
		t.Fatalf("push workers created: %v, want %v", got, want)
	}
	for _, x := range r.sub.Refusals() {
		if x.Reason != "dp_rank_mismatch" || x.Source != r.pushAddr {
			t.Errorf("unexpected refusal %+v", x)
		}
	}
}

// A listener's DPSize is at most MaxDPRank, and its last rank's port must
// exist.
func TestNewSubscriberRefusesBadDPSize(t *testing.T) {
	nop := func(events.WorkerRef, string, string) (events.Sink, error) { return nil, errors.New("unused") }
	for _, c := range []struct {
		pl   zmq.PushListener
		want string
	}{
		{zmq.PushListener{Address: "tcp://127.0.0.1:1", DPSize: -1}, "events: push listener tcp://127.0.0.1:1: DPSize -1 outside [0, 1024]"},
		{zmq.PushListener{Address: "tcp://127.0.0.1:1", DPSize: 1025}, "events: push listener tcp://127.0.0.1:1: DPSize 1025 outside [0, 1024]"},
		{zmq.PushListener{Address: "tcp://127.0.0.1:65535", DPSize: 2}, `events: push listener tcp://127.0.0.1:65535: DPSize 2: events: endpoint "tcp://127.0.0.1:65535": port "65535" cannot be offset by rank 1`},
	} {
		_, err := zmq.NewSubscriber(zmq.SubscriberOptions{Push: []zmq.PushListener{c.pl}, NewWorker: nop})
		if err == nil || err.Error() != c.want {
			t.Errorf("DPSize %d at %s: %v, want %s", c.pl.DPSize, c.pl.Address, err, c.want)
		}
	}
}
