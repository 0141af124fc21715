package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/soak"

	"google.golang.org/protobuf/encoding/protojson"
)

// differences compares every replica and every agent with the engines'
// truth once: each must list each of its workers in sync (synced),
// holding the engine's blocks with the engine's digest. It returns what
// differs, with the worker's health and why.
func (r *run) differences(ctx context.Context) []string {
	type truth struct {
		resident int
		digest   uint64
	}
	truths := make([]truth, len(r.engines))
	var out []string
	for i, e := range r.engines {
		res, d, err := e.Truth()
		if err != nil {
			return []string{err.Error()}
		}
		truths[i] = truth{res, d}
	}
	compare := func(who string, client *api.Client, engines []int) {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		resp, err := client.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{Model: Model, Digests: true})
		if err != nil {
			out = append(out, fmt.Sprintf("%s: ListWorkers: %v", who, err))
			return
		}
		got := map[string]*kvindexv1.WorkerStatus{}
		for _, w := range resp.GetWorkers() {
			got[w.GetWorker().GetPod()] = w
		}
		for _, i := range engines {
			w, t := got[PodName(i)], truths[i]
			switch {
			case w == nil:
				out = append(out, fmt.Sprintf("%s does not list %s", who, PodName(i)))
			case w.GetDigest() != t.digest || w.GetResidentBlocks() != uint64(t.resident) || !synced(w.GetHealth()):
				out = append(out, fmt.Sprintf("%s: %s holds %d blocks (digest %#x), health %s %q, last reset %q, last error %q; its engine holds %d (digest %#x)",
					who, PodName(i), w.GetResidentBlocks(), w.GetDigest(), w.GetHealth(), w.GetHealthReason(), w.GetLastReset(), w.GetLastError(), t.resident, t.digest))
			}
		}
	}
	all := make([]int, len(r.engines))
	for i := range all {
		all[i] = i
	}
	for j := range r.replicas {
		compare(ReplicaName(j), r.rclients[j], all)
	}
	for i := range r.agents {
		compare(AgentName(i), r.aclients[i], []int{i})
	}
	sort.Strings(out)
	return out
}

// synced says whether a worker's health lets it count as converged: in
// sync with its engine. DEGRADED (an event failed to apply within the
// last minute) is, once its digest is right.
func synced(h kvindexv1.WorkerHealth) bool {
	return h == kvindexv1.WorkerHealth_WORKER_HEALTH_OK || h == kvindexv1.WorkerHealth_WORKER_HEALTH_DEGRADED
}

// converge waits up to within for every replica and agent to equal the
// engines' truth (differences), and returns how long it took; past
// within it records a violation of invariant b naming what differs.
func (r *run) converge(ctx context.Context, within time.Duration, what string) (time.Duration, bool) {
	t0 := time.Now()
	for {
		diff := r.differences(ctx)
		if len(diff) == 0 {
			return time.Since(t0), true
		}
		if ctx.Err() != nil {
			return time.Since(t0), false
		}
		if time.Since(t0) > within {
			r.violate("b", "not_converged", "%s: not equal to the engines' caches within %v: %s", what, within, strings.Join(diff, "; "))
			return time.Since(t0), false
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// checkResumed checks that an agent started again resumed from its
// checkpoint: once it answers, its metrics count the checkpoint restored
// (when one was on disk) and, within a few seconds, no worker partial.
func (r *run) checkResumed(ctx context.Context, c *child, hadCheckpoint bool) {
	i := r.indexOf(c.name)
	if err := c.waitReady(ctx, 30*time.Second); err != nil {
		if ctx.Err() == nil {
			live, _, _, _ := c.state()
			if live {
				r.violate("d", "not_ready", "%s did not answer within 30 s of its restart: %v", c.name, err)
			}
		}
		return
	}
	_, instance, _, _ := c.state()
	var restored, partial float64
	var reasons []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ms, err := soak.Scrape(cctx, r.http, hostPort(r.lay.Agents[i].Metrics))
		cancel()
		if err == nil {
			restored, _ = soak.Metric(ms, "kvindex_agent_checkpoint_loads_total", map[string]string{"result": "restored"})
			partial, _ = soak.Metric(ms, "kvindex_agent_partial_workers", nil)
			reasons = reasons[:0]
			ms.Each("kvindex_agent_partial_total", func(l map[string]string, v float64) {
				if v > 0 {
					reasons = append(reasons, fmt.Sprintf("%s %g", l["reason"], v))
				}
			})
			if partial == 0 && (restored > 0 || !hadCheckpoint) {
				break
			}
		}
		if time.Now().After(deadline) || !sleep(ctx, 250*time.Millisecond) {
			break
		}
	}
	if ctx.Err() != nil {
		return
	}
	if live, now, _, _ := c.state(); !live || now != instance {
		return // stopped again meanwhile: the next restart is checked
	}
	r.count("agent_restarts_checked")
	switch {
	case hadCheckpoint && restored == 0:
		r.violate("b", "checkpoint_not_restored", "%s (instance %d) restarted beside its checkpoint %s but did not restore it", c.name, instance, r.lay.Checkpoint(i))
	case partial > 0:
		r.violate("b", "restarted_partial", "%s (instance %d) restarted from its checkpoint (restored %g) with %g partial workers (partial by reason: %s)", c.name, instance, restored, partial, strings.Join(reasons, ", "))
	case hadCheckpoint:
		r.count("agent_restarts_resumed")
	}
}

// endState returns every agent's and replica's view of each worker at the
// end (ListWorkers' nonzero fields), for the summary: the counters say
// what each went through (restarts, gaps, replays, resets, errors).
func (r *run) endState(ctx context.Context) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	get := func(who string, client *api.Client) {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		resp, err := client.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{Model: Model})
		if err != nil {
			out[who] = json.RawMessage(fmt.Sprintf("%q", err.Error()))
			return
		}
		for _, w := range resp.GetWorkers() {
			if b, err := protojson.Marshal(w); err == nil {
				out[who+"/"+w.GetWorker().GetPod()] = b
			}
		}
	}
	for i, c := range r.aclients {
		get(AgentName(i), c)
	}
	for j, c := range r.rclients {
		get(ReplicaName(j), c)
	}
	return out
}
