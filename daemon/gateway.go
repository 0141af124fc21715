package daemon

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/picker"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
	"github.com/kvindex/kvindex/tokenize"
)

// coldEndpoint is the WorkerInfo.Endpoint of a worker added only because
// a gateway endpoint names it: routable, cold. A push-mode, discovered or
// fleet worker of the same name takes its place when it appears.
const coldEndpoint = "gateway (cold)"

// newTokenizer returns the tokenizer of the models' tokenizer_urls, nil
// when no model has any.
func newTokenizer(cfg *config.Config, d *Daemon) (api.Tokenizer, error) {
	eps := map[string][]string{}
	for _, m := range cfg.Models {
		if len(m.TokenizerURLs) > 0 {
			eps[m.Name] = m.TokenizerURLs
		}
	}
	if len(eps) == 0 {
		return nil, nil
	}
	tk, err := tokenize.New(tokenize.Options{
		Endpoints:      eps,
		Timeout:        cfg.Tokenize.Timeout,
		CacheEntries:   cfg.Tokenize.CacheEntries,
		MaxConcurrent:  cfg.Tokenize.MaxConcurrent,
		MaxPromptBytes: cfg.Tokenize.MaxPromptBytes,
		MaxTokens:      cfg.Limits.MaxTokens,
		Registerer:     d.registry,
		Logger:         d.log,
	})
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return tk, nil
}

// poolSource is discovery.InferencePool.
type poolSource interface {
	Run(ctx context.Context, apply func([]discovery.Endpoint)) error
}

// gatewayPool is the endpoint picker's pool as it changes: fixed
// endpoints, an InferencePool's, or discovery's pods. Workers the index
// lacks are added cold and removed when their endpoint leaves; a worker
// kvindex hears from takes its cold worker's place, and gives it back when
// it goes while its endpoint stays.
//
// mu serializes updates and is held across the index changes and
// SetEndpoints, so the picker and the index change in the same order.
// Lock order: mu, then the index's own locks.
type gatewayPool struct {
	d    *Daemon
	port int // gateway.discovered_port; 0 unless discovery's pods are the pool

	mu         sync.Mutex
	models     map[events.WorkerRef]string  // every endpoint's worker, to its model
	discovered map[string][]picker.Endpoint // discovered_port: each discovered pod's endpoints
}

// set makes eps the picker's pool: workers the index lacks are added
// cold first, the picker switches, then cold workers whose endpoint left
// are removed.
func (g *gatewayPool) set(eps []picker.Endpoint) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.setLocked(eps)
}

func (g *gatewayPool) setLocked(eps []picker.Endpoint) error {
	d := g.d
	models := make(map[events.WorkerRef]string, len(eps))
	for _, e := range eps {
		models[e.Worker] = e.Model
	}
	var added []events.WorkerRef // cold workers of this call, undone if it fails
	undo := func() {
		for _, ref := range added {
			_ = d.ix.RemoveWorker(ref)
		}
	}
	for _, e := range eps {
		if d.ix.LookupWorker(e.Worker) != nil {
			continue
		}
		if err := d.ensureModel(e.Model); err != nil {
			undo()
			return fmt.Errorf("daemon: gateway endpoint %s: %w", e.Address, err)
		}
		if _, err := d.ix.AddWorker(indexer.WorkerInfo{Ref: e.Worker, Model: e.Model, Endpoint: coldEndpoint}); err != nil {
			undo()
			return fmt.Errorf("daemon: gateway endpoint %s: %w", e.Address, err)
		}
		added = append(added, e.Worker)
	}
	if d.picker != nil {
		if err := d.picker.SetEndpoints(eps); err != nil {
			undo()
			return fmt.Errorf("daemon: gateway endpoints: %w", err)
		}
	}
	for ref := range g.models {
		if _, ok := models[ref]; !ok {
			if w := d.ix.LookupWorker(ref); w != nil && w.Info().Endpoint == coldEndpoint {
				if err := d.ix.RemoveWorker(ref); err != nil {
					d.log.Warn("cold gateway worker not removed", "worker", ref.String(), "err", err)
				}
			}
		}
	}
	g.models = models
	return nil
}

// setPool is the InferencePool source's callback. A set the picker
// refuses is logged, and the pool stays as it was.
func (g *gatewayPool) setPool(eps []discovery.Endpoint) {
	var out []picker.Endpoint
	for _, e := range eps {
		out = append(out, pickerEndpoints(e.Address, e.Pod, e.Model, e.DPRank, e.AllRanks, e.DPSize)...)
	}
	if err := g.set(out); err != nil {
		g.d.log.Error("inference pool's endpoints not applied", "endpoints", len(out), "err", err)
		return
	}
	g.d.log.Info("inference pool's endpoints changed", "endpoints", len(out))
}

// podJoined makes a discovered pod's ranks endpoints at its address and
// gateway.discovered_port, if discovery's pods are the pool.
func (g *gatewayPool) podJoined(p config.Pod) {
	if g == nil || g.port == 0 {
		return
	}
	host, _, err := net.SplitHostPort(strings.TrimPrefix(p.Endpoint, "tcp://"))
	if err != nil {
		g.d.log.Warn("discovered pod not in the gateway's pool: its address is not host:port", "pod", p.Name, "endpoint", p.Endpoint)
		return
	}
	addr := net.JoinHostPort(host, strconv.Itoa(g.port))
	g.mu.Lock()
	defer g.mu.Unlock()
	g.discovered[p.Name] = pickerEndpoints(addr, p.Name, p.Model, 0, p.DPSize > 1, p.DPSize)
	if err := g.setLocked(g.discoveredLocked()); err != nil {
		g.d.log.Error("discovered pod not in the gateway's pool", "pod", p.Name, "err", err)
		delete(g.discovered, p.Name)
	}
}

// podLeft takes a discovered pod's endpoints out of the pool.
func (g *gatewayPool) podLeft(name string) {
	if g == nil || g.port == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.discovered[name]; !ok {
		return
	}
	delete(g.discovered, name)
	if err := g.setLocked(g.discoveredLocked()); err != nil {
		g.d.log.Error("discovered pod left, but the gateway's pool did not change", "pod", name, "err", err)
	}
}

func (g *gatewayPool) discoveredLocked() []picker.Endpoint {
	var out []picker.Endpoint
	for _, name := range slices.Sorted(maps.Keys(g.discovered)) {
		out = append(out, g.discovered[name]...)
	}
	return out
}

// keepRoutable adds ref back as a cold worker when its own worker left the
// index while an endpoint still serves it.
func (g *gatewayPool) keepRoutable(ref events.WorkerRef) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	model, ok := g.models[ref]
	if !ok || g.d.ix.LookupWorker(ref) != nil {
		return
	}
	if _, err := g.d.ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model, Endpoint: coldEndpoint}); err != nil {
		g.d.log.Warn("gateway endpoint's worker not kept routable", "worker", ref.String(), "err", err)
	}
}

// pickerEndpoints are the endpoints of one address: of its rank, or with
// allRanks one per rank of dpSize, naming the rank in a header.
func pickerEndpoints(addr, pod, model string, rank int, allRanks bool, dpSize int) []picker.Endpoint {
	if !allRanks {
		return []picker.Endpoint{{Address: addr, Worker: events.WorkerRef{Pod: pod, DPRank: rank}, Model: model}}
	}
	out := make([]picker.Endpoint, 0, dpSize)
	for r := range dpSize {
		out = append(out, picker.Endpoint{Address: addr, Worker: events.WorkerRef{Pod: pod, DPRank: r}, Model: model, RankHeader: true})
	}
	return out
}

// ensureModel adds a model the index lacks, with its configured (or the
// default) block size.
func (d *Daemon) ensureModel(model string) error {
	if _, ok := d.ix.Model(model); ok {
		return nil
	}
	bs := config.DefaultBlockSize
	for _, m := range d.cfg.Models {
		if m.Name == model {
			bs = m.BlockSize
		}
	}
	if _, err := d.ix.AddModel(model, bs); err != nil {
		return fmt.Errorf("model %q: %w", model, err)
	}
	return nil
}

// newGateway builds the endpoint picker, its gRPC server and listener,
// and the source of its pool, when gateway.listen is set.
func (d *Daemon) newGateway() error {
	cfg := d.cfg
	if !cfg.Gateway.Enabled() {
		return nil
	}
	gc := &cfg.Gateway
	d.gw = &gatewayPool{d: d, port: gc.DiscoveredPort, models: map[events.WorkerRef]string{}, discovered: map[string][]picker.Endpoint{}}
	mode := picker.FullDuplex
	if gc.BodyMode == config.BodyModeBuffered {
		mode = picker.Buffered
	}
	p, err := picker.New(d.api, picker.Options{
		Health:       d.srcs,
		BodyMode:     mode,
		MaxBodyBytes: gc.MaxBodyBytes,
		Fallbacks:    max(0, gc.Fallbacks),
		MaxRequests:  gc.MaxRequests,
		Logger:       d.log.With("component", "picker"),
	})
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.picker = p
	var fixed []picker.Endpoint // one per worker
	for _, e := range gc.Endpoints {
		dp := 1
		if p := cfg.FindPod(e.Pod); p != nil {
			dp = p.DPSize
		}
		fixed = append(fixed, pickerEndpoints(e.Address, e.Pod, e.Model, e.DPRank, e.AllRanks, dp)...)
	}
	if err := d.gw.set(fixed); err != nil {
		return err
	}
	if ip := gc.InferencePool; ip != nil {
		client, err := discovery.NewClient(ip.Kubeconfig)
		if err != nil {
			return fmt.Errorf("daemon: gateway.inference_pool: %w", err)
		}
		src, err := discovery.NewInferencePool(client, ip, d.log.With("component", "inferencepool"))
		if err != nil {
			return fmt.Errorf("daemon: gateway.inference_pool: %w", err)
		}
		d.gwSource = src
		d.registry.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_gateway_pool_errors_total", Help: "Failed watches of the gateway's InferencePool or its pods, and a missing or malformed pool (no endpoints then)."},
				func() float64 { return float64(src.Errors()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_gateway_pool_excluded_pods", Help: "Pods the gateway's InferencePool selects that are not endpoints: not Running and Ready, terminating, or with invalid annotations."},
				func() float64 { return float64(src.Excluded()) }),
		)
	}
	d.registry.MustRegister(p.Collector())
	// Envoy sends the token as the ext_proc grpc_service's initial_metadata.
	d.gwGRPC = d.grpcServer(api.ListenerGateway)
	p.Register(d.gwGRPC)
	d.gwLis, err = d.listen("gateway", gc.Listen, 0)
	return err
}

// takeCold removes ref's cold worker, if any, for a live one to take its
// name.
func (d *Daemon) takeCold(ref events.WorkerRef) {
	if w := d.ix.LookupWorker(ref); w != nil && w.Info().Endpoint == coldEndpoint {
		if err := d.ix.RemoveWorker(ref); err != nil {
			d.log.Warn("cold gateway worker not replaced", "worker", ref.String(), "err", err)
		}
	}
}

// coldAware is the fleet's worker set: an agent's worker replaces a cold
// gateway worker of its name, and leaves a cold one behind when it goes
// while a gateway endpoint names it.
type coldAware struct {
	natsbus.WorkerSet
	d *Daemon
}

// AddWorker implements natsbus.WorkerSet.
func (c coldAware) AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (natsbus.KeyedSink, error) {
	c.d.takeCold(ref)
	return c.WorkerSet.AddWorker(ref, reg)
}

// RemoveWorker implements natsbus.WorkerSet.
func (c coldAware) RemoveWorker(ref events.WorkerRef) {
	c.WorkerSet.RemoveWorker(ref)
	c.d.gw.keepRoutable(ref)
}

// GatewayAddr is the endpoint picker's ext_proc address, "" when off.
func (d *Daemon) GatewayAddr() string {
	if d.gwLis == nil {
		return ""
	}
	return d.gwLis.Addr().String()
}

// Picker is the endpoint picker, nil when off.
func (d *Daemon) Picker() *picker.Picker { return d.picker }

// InFlight is the number of routed requests not yet released or expired.
func (d *Daemon) InFlight() int { return d.tracker.InFlight() }
