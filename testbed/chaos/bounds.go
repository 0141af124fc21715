package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/proc"
	"github.com/kvindex/kvindex/testbed/soak"
)

// usage is what one process used: the largest of each sample, its first
// and last goroutine counts in one instance (for the leak check).
type usage struct {
	MaxRSS        int64 `json:"max_rss_bytes"`
	MaxGoroutines int   `json:"max_goroutines"`
	MaxBacklog    int64 `json:"max_backlog"`
	Samples       int   `json:"samples"`
	instance      int
	first, last   int
}

// usages are the fleet's usage by process; mu guards the map.
type usages struct {
	mu sync.Mutex
	by map[string]*usage
}

func (u *usages) get(name string) *usage {
	if u.by == nil {
		u.by = map[string]*usage{}
	}
	if u.by[name] == nil {
		u.by[name] = &usage{}
	}
	return u.by[name]
}

// runSampler samples every process every second (invariant c): its RSS,
// its goroutines and the batches queued for each of its workers, each
// under its bound; a replica's lag histogram goes to the checker every
// half second. A process whose first and last samples are of one
// instance is checked for leaked goroutines at the end (checkLeaks).
func (r *run) runSampler(ctx context.Context) {
	tick := 0
	r.every(ctx, "sampler", 500*time.Millisecond, func() {
		tick++
		r.sampleAll(ctx, tick%2 == 0)
		if tick%2 != 0 {
			return
		}
		r.check.resolve(time.Now(), false)
		for _, e := range r.engines {
			e.Forget(time.Now().Add(-time.Minute))
		}
	})
}

// sampleAll scrapes every replica's lag and, with full, samples every
// process's usage.
func (r *run) sampleAll(ctx context.Context, full bool) {
	for j, c := range r.replicas {
		r.sample(ctx, c, r.lay.Replicas[j].Metrics, r.rclients[j], r.bounds.ReplicaBacklog, func(ms soak.Metrics, instance int) {
			if fam := ms["kvindex_event_lag_seconds"]; fam != nil {
				r.check.observeLag(j, instance, fam, time.Now())
			}
		}, full)
	}
	if !full {
		return
	}
	for i, c := range r.agents {
		r.sample(ctx, c, r.lay.Agents[i].Metrics, r.aclients[i], r.bounds.AgentBacklog, nil, true)
	}
	r.sampleNATS(ctx)
}

// sample scrapes one kvindex process's /metrics (passing them to also)
// and, with full, records its RSS, goroutines and worker backlogs
// against their bounds.
func (r *run) sample(ctx context.Context, c *child, metricsPort int, client *api.Client, maxBacklog int, also func(soak.Metrics, int), full bool) {
	live, instance, pid, _ := c.state()
	if !live {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ms, err := soak.Scrape(cctx, r.http, hostPort(metricsPort))
	if err != nil {
		return // down, starting or slow: the watchdog judges liveness
	}
	if also != nil {
		also(ms, instance)
	}
	if !full {
		return
	}
	g, _ := soak.Metric(ms, "go_goroutines", nil)
	var backlog int64
	if resp, err := client.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{}); err == nil {
		for _, w := range resp.GetWorkers() {
			backlog = max(backlog, int64(w.GetBacklog()))
		}
	}
	mem, _ := proc.Mem(pid)
	r.record(c.name, instance, mem.RSS, int(g), backlog)
	switch {
	case mem.RSS > r.bounds.RSS:
		r.violate("c", "memory", "%s (instance %d) uses %d MiB, over the bound of %d MiB", c.name, instance, mem.RSS>>20, r.bounds.RSS>>20)
	case int(g) > r.bounds.Goroutines:
		r.violate("c", "goroutines", "%s (instance %d) runs %d goroutines, over the bound of %d", c.name, instance, int(g), r.bounds.Goroutines)
	case backlog > int64(maxBacklog):
		r.violate("c", "backlog", "%s (instance %d) has %d batches queued for a worker, over its queue's bound of %d", c.name, instance, backlog, maxBacklog)
	}
}

// record notes one sample of process name.
func (r *run) record(name string, instance int, rss int64, goroutines int, backlog int64) {
	r.usage.mu.Lock()
	defer r.usage.mu.Unlock()
	u := r.usage.get(name)
	u.MaxRSS, u.MaxGoroutines, u.MaxBacklog = max(u.MaxRSS, rss), max(u.MaxGoroutines, goroutines), max(u.MaxBacklog, backlog)
	u.Samples++
	if u.instance != instance {
		u.instance, u.first = instance, goroutines
	}
	u.last = goroutines
}

// sampleNATS records nats-server's RSS and its count of slow consumers.
func (r *run) sampleNATS(ctx context.Context) {
	live, instance, pid, _ := r.nats.state()
	if !live {
		return
	}
	mem, err := proc.Mem(pid)
	if err != nil {
		return
	}
	r.record(NATS, instance, mem.RSS, 0, 0)
	if mem.RSS > r.bounds.RSSNATS {
		r.violate("c", "memory", "nats-server (instance %d) uses %d MiB, over the bound of %d MiB", instance, mem.RSS>>20, r.bounds.RSSNATS>>20)
	}
	var v struct {
		SlowConsumers int64 `json:"slow_consumers"`
	}
	if err := r.getJSON(ctx, fmt.Sprintf("http://%s/varz", hostPort(r.lay.NATSMonitor)), &v); err == nil {
		r.mu.Lock()
		r.slowConsumers = max(r.slowConsumers, v.SlowConsumers)
		r.mu.Unlock()
	}
}

// getJSON fetches url and decodes its JSON body into v.
func (r *run) getJSON(ctx context.Context, url string, v any) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// checkLeaks checks, once the fleet has converged, that no kvindex
// process sampled in one instance from start to end gained more than
// Bounds.Leak goroutines.
func (r *run) checkLeaks() {
	var leaks []string
	r.usage.mu.Lock()
	for name, u := range r.usage.by {
		if name != NATS && u.instance == 1 && u.last > u.first+r.bounds.Leak {
			leaks = append(leaks, fmt.Sprintf("%s ran %d goroutines after the faults, %d when they began (bound: %d more)", name, u.last, u.first, r.bounds.Leak))
		}
	}
	r.usage.mu.Unlock()
	for _, l := range leaks {
		r.violate("c", "goroutine_leak", "%s", l)
	}
}
