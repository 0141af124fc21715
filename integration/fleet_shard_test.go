package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestFleetReplicaModelShards: two models, each with its engines and
// agents, and two replicas sharing one models: list but each restricted
// to one model (nats.models). Each replica holds exactly its model's
// workers, as the control holds them, and answers Score for its model as
// the control does; for the other model it answers InvalidArgument
// "model: unknown model ..." (not an empty answer), and it never holds
// the other model's workers, even once the other replica has them and
// has followed a later batch of theirs.
func TestFleetReplicaModelShards(t *testing.T) {
	const other = "other/model"
	rig := startFleetRig(t, 0, podSpec{name: "a0", dpSize: 2}, podSpec{name: "a1"}, podSpec{name: "b0", model: other})
	shard := func(m string) *fleet {
		r := newFleet(t, fleetOptions{configure: func(c *config.Config) {
			c.NATS = config.NATS{URL: rig.nats.url(), RegistrationTTL: 3 * time.Second, Models: []string{m}}
		}})
		r.start()
		if len(r.cfg.Models) != 2 {
			t.Fatalf("the shard's models: list %v, want both models", r.cfg.Models)
		}
		return r
	}
	ra, rb := shard(model), shard(other)
	shardOf := map[string]*fleet{"a0": ra, "a1": ra, "b0": rb}

	// The same prompt stored on a worker of each model: the models are
	// separate namespaces.
	prompt := tokens("shared system prompt", 6*blockSize)
	stored := map[events.WorkerRef]int{}
	for i, ref := range []events.WorkerRef{{Pod: "a0", DPRank: 1}, {Pod: "a1"}, {Pod: "b0"}} {
		eng := &engine{next: uint64(i+1) << 40}
		ev, hs := eng.store(0, prompt[:(i+3)*blockSize])
		rig.direct.publish(ref.Pod, ref.DPRank, ev)
		stored[ref] = len(hs)
	}
	waitShards(t, rig, shardOf)

	for _, tc := range []struct {
		rep         *fleet
		model, away string
		workers     string
	}{
		{ra, model, other, "[a0/0 test/model a0/1 test/model a1/0 test/model]"},
		{rb, other, model, "[b0/0 other/model]"},
	} {
		// Exactly its model's workers.
		if got := listWorkers(t, tc.rep, ""); got != tc.workers {
			t.Errorf("shard %s lists %s, want %s", tc.model, got, tc.workers)
		}
		// Its model answered as the control answers.
		want := scoreMap(rig.direct.score(&kvindexv1.ScoreRequest{Model: tc.model, TokenIds: prompt}))
		if got := scoreMap(tc.rep.score(&kvindexv1.ScoreRequest{Model: tc.model, TokenIds: prompt})); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("shard %s scores %v, the control %v", tc.model, got, want)
		}
		// The other model is unknown, to Score and to ListWorkers.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := tc.rep.client.Score(ctx, &kvindexv1.ScoreRequest{Model: tc.away, TokenIds: prompt})
		cancel()
		wantMsg := fmt.Sprintf("model: unknown model %q; known: %s", tc.away, tc.model)
		if st, _ := api.ServerStatus(err); status.Code(err) != codes.InvalidArgument || st.Message() != wantMsg {
			t.Errorf("shard %s, Score of %s: %v, want InvalidArgument %q", tc.model, tc.away, err, wantMsg)
		}
		_, err = tc.rep.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{Model: tc.away})
		if st, _ := api.ServerStatus(err); status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "model: unknown model") {
			t.Errorf("shard %s, ListWorkers of %s: %v, want InvalidArgument unknown model", tc.model, tc.away, err)
		}
	}
	// Matched blocks are the engines' own.
	if n, _ := matched(ra.score(&kvindexv1.ScoreRequest{Model: model, TokenIds: prompt}), "a1", 0); n != stored[events.WorkerRef{Pod: "a1"}] {
		t.Errorf("shard %s matches %d blocks on a1/0, want %d", model, n, stored[events.WorkerRef{Pod: "a1"}])
	}
	if n, _ := matched(rb.score(&kvindexv1.ScoreRequest{Model: other, TokenIds: prompt}), "b0", 0); n != stored[events.WorkerRef{Pod: "b0"}] {
		t.Errorf("shard %s matches %d blocks on b0/0, want %d", other, n, stored[events.WorkerRef{Pod: "b0"}])
	}

	// A later batch on each model reaches its shard (the positive signal)
	// and nothing of it the other.
	for i, ref := range []events.WorkerRef{{Pod: "a0"}, {Pod: "b0"}} {
		eng := &engine{next: uint64(i+10) << 40}
		ev, _ := eng.store(0, tokens(fmt.Sprintf("later %d", i), 2*blockSize))
		rig.direct.publish(ref.Pod, ref.DPRank, ev)
	}
	waitShards(t, rig, shardOf)
	if got := listWorkers(t, ra, ""); got != "[a0/0 test/model a0/1 test/model a1/0 test/model]" {
		t.Errorf("after the later batches, shard %s lists %s", model, got)
	}
	if got := listWorkers(t, rb, ""); got != "[b0/0 other/model]" {
		t.Errorf("after the later batches, shard %s lists %s", other, got)
	}
}

// waitShards waits until every worker of the rig is on its shard (by
// pod) with the control's digest.
func waitShards(t *testing.T, rig *fleetRig, shardOf map[string]*fleet) {
	t.Helper()
	var why string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		why = ""
		for _, ref := range rig.refs() {
			want := rig.direct.d.Index().LookupWorker(ref)
			got := shardOf[ref.Pod].d.Index().LookupWorker(ref)
			switch {
			case want == nil:
				why = fmt.Sprintf("the control has no %s", ref)
			case got == nil:
				why = fmt.Sprintf("its shard has no %s", ref)
			case got.Digest() != want.Digest():
				why = fmt.Sprintf("%s: shard digest %x, control %x", ref, got.Digest(), want.Digest())
			}
			if why != "" {
				break
			}
		}
		if why == "" {
			return
		}
	}
	t.Fatalf("shards did not converge within 10s: %s", why)
}

// listWorkers returns a replica's ListWorkers (of model, "" for all) as
// sorted "pod/rank model" entries.
func listWorkers(t *testing.T, f *fleet, model string) string {
	t.Helper()
	resp, err := f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range resp.GetWorkers() {
		out = append(out, fmt.Sprintf("%s/%d %s", w.GetWorker().GetPod(), w.GetWorker().GetDpRank(), w.GetModel()))
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}
