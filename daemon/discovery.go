package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/scoring/scrape"
)

// discoverySource is discovery's Kubernetes or DNS.
type discoverySource interface {
	Run(ctx context.Context, r *discovery.Reconciler) error
}

// discovered is the daemon's discovery.Fleet: discovered pods join and
// leave the index and the subscriber as configured ones do, and their
// metrics_url is scraped. The reconciler calls AddPod and RemovePod from
// one goroutine; mu guards pods and runCtx against Run.
type discovered struct {
	d *Daemon

	mu     sync.Mutex
	runCtx context.Context // the daemon's run context; nil before Run
	pods   map[string]*discoveredPod
}

// discoveredPod is what AddPod made for one pod.
type discoveredPod struct {
	ranks      int
	stopScrape func() // nil without metrics_url
}

// AddPod implements discovery.Fleet.
func (f *discovered) AddPod(p config.Pod) error {
	d := f.d
	if err := d.ensureModel(p.Model); err != nil {
		return fmt.Errorf("discovered pod %s: %w", p.Name, err)
	}
	cfg := config.Config{Pods: []config.Pod{p}}
	var added []events.WorkerRef
	undo := func() {
		for _, ref := range added {
			_ = d.sub.RemoveEndpoint(ref)
			_ = d.ix.RemoveWorker(ref)
			d.gw.keepRoutable(ref)
		}
	}
	for _, we := range cfg.Workers() {
		d.takeCold(we.Worker) // a gateway endpoint's worker, routable until now
		ep, err := d.addWorker(we)
		if err != nil {
			undo()
			return fmt.Errorf("discovered pod %s: %w", p.Name, err)
		}
		if err := d.sub.AddEndpoint(ep); err != nil {
			_ = d.ix.RemoveWorker(we.Worker)
			d.gw.keepRoutable(we.Worker)
			undo()
			return fmt.Errorf("discovered pod %s: %w", p.Name, err)
		}
		added = append(added, we.Worker)
	}
	dp := &discoveredPod{ranks: p.DPSize}
	f.mu.Lock()
	if p.MetricsURL != "" && f.runCtx != nil {
		dp.stopScrape = d.scraper.Start(f.runCtx, scrape.Target{Pod: p.Name, DPSize: p.DPSize, URL: p.MetricsURL})
	}
	f.pods[p.Name] = dp
	f.mu.Unlock()
	d.gw.podJoined(p) // gateway.discovered_port: the pod is an endpoint now
	return nil
}

// RemovePod implements discovery.Fleet.
func (f *discovered) RemovePod(name string) error {
	f.mu.Lock()
	dp := f.pods[name]
	delete(f.pods, name)
	f.mu.Unlock()
	if dp == nil {
		return fmt.Errorf("discovered pod %s: not added", name)
	}
	f.d.gw.podLeft(name) // gateway.discovered_port: no longer picked

	if dp.stopScrape != nil {
		dp.stopScrape()
	}
	var errs []error
	for r := range dp.ranks {
		ref := events.WorkerRef{Pod: name, DPRank: r}
		if err := f.d.sub.RemoveEndpoint(ref); err != nil {
			errs = append(errs, err)
		}
		if err := f.d.ix.RemoveWorker(ref); err != nil {
			errs = append(errs, err)
		}
		f.d.gw.keepRoutable(ref) // an InferencePool may still list it
	}
	return errors.Join(errs...)
}

// addWorker adds a configured or discovered worker to the index, and
// returns its endpoint for the subscriber.
func (d *Daemon) addWorker(we config.WorkerEndpoint) (zmq.Endpoint, error) {
	w, err := d.ix.AddWorker(indexer.WorkerInfo{Ref: we.Worker, Model: we.Model, Endpoint: we.Endpoint})
	if err != nil {
		return zmq.Endpoint{}, fmt.Errorf("worker %s: %w", we.Worker, err)
	}
	if we.CapacityBlocks > 0 {
		w.SetCapacity(we.CapacityBlocks)
	}
	return zmq.Endpoint{Worker: we.Worker, Address: we.Endpoint, Topic: we.Topic, ReplayEndpoint: we.ReplayEndpoint, Sink: w}, nil
}
