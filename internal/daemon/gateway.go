package daemon

import (
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvindex/kvindex/events"
	kvnats "github.com/kvindex/kvindex/events/nats"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/picker"
	"github.com/kvindex/kvindex/internal/tokenize"
	fleetv1 "github.com/kvindex/kvindex/proto/kvindex/fleet/v1"
)

// coldEndpoint is the WorkerInfo.Endpoint of a worker added only because
// a gateway endpoint names it: kvindex hears nothing from it (yet), and it
// is routable, cold. A push-mode or fleet worker of the same name takes
// its place when it appears.
const coldEndpoint = "gateway (cold)"

// newTokenizer returns the tokenizer of the models' tokenizer_urls, nil
// when no model has any.
func newTokenizer(cfg *config.Config, d *Daemon) (*tokenize.Client, error) {
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

// gatewayEndpoints expands the gateway's endpoints to one per worker: an
// address serving all of a pod's ranks is one endpoint per rank, naming
// the rank in a header.
func gatewayEndpoints(cfg *config.Config) []picker.Endpoint {
	var out []picker.Endpoint
	for _, e := range cfg.Gateway.Endpoints {
		if !e.AllRanks {
			out = append(out, picker.Endpoint{Address: e.Address, Worker: events.WorkerRef{Pod: e.Pod, DPRank: e.DPRank}, Model: e.Model})
			continue
		}
		dp := 1
		for _, p := range cfg.Pods {
			if p.Name == e.Pod {
				dp = p.DPSize
			}
		}
		for r := range dp {
			out = append(out, picker.Endpoint{Address: e.Address, Worker: events.WorkerRef{Pod: e.Pod, DPRank: r}, Model: e.Model, RankHeader: true})
		}
	}
	return out
}

// newGateway builds the endpoint picker and its gRPC server and listener;
// workers the index lacks are added cold.
func (d *Daemon) newGateway(cfg *config.Config) error {
	eps := gatewayEndpoints(cfg)
	d.gwModels = map[events.WorkerRef]string{}
	for _, e := range eps {
		d.gwModels[e.Worker] = e.Model
		if d.ix.LookupWorker(e.Worker) != nil {
			continue
		}
		if _, err := d.ix.AddWorker(indexer.WorkerInfo{Ref: e.Worker, Model: e.Model, Endpoint: coldEndpoint}); err != nil {
			return fmt.Errorf("daemon: gateway endpoint %s: %w", e.Address, err)
		}
	}
	mode := picker.FullDuplex
	if cfg.Gateway.BodyMode == config.BodyModeBuffered {
		mode = picker.Buffered
	}
	p, err := picker.New(d.api, picker.Options{
		Endpoints:    eps,
		Health:       d.srcs,
		BodyMode:     mode,
		MaxBodyBytes: cfg.Gateway.MaxBodyBytes,
		Fallbacks:    max(0, cfg.Gateway.Fallbacks),
		MaxRequests:  cfg.Gateway.MaxRequests,
		Logger:       d.log.With("component", "picker"),
	})
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.picker = p
	d.registry.MustRegister(p.Collector())
	var opts []grpc.ServerOption
	if d.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(d.tls.Config())))
	}
	d.gwGRPC = grpc.NewServer(opts...)
	p.Register(d.gwGRPC)
	if d.gwLis, err = net.Listen("tcp", cfg.Gateway.Listen); err != nil {
		return fmt.Errorf("daemon: gateway listen on %s: %w", cfg.Gateway.Listen, err)
	}
	return nil
}

// takeCold removes ref's cold worker, if it has one, so that a worker
// kvindex hears from can take its name.
func (d *Daemon) takeCold(ref events.WorkerRef) {
	if w := d.ix.LookupWorker(ref); w != nil && w.Info().Endpoint == coldEndpoint {
		if err := d.ix.RemoveWorker(ref); err != nil {
			d.log.Warn("cold gateway worker not replaced", "worker", ref.String(), "err", err)
		}
	}
}

// coldAware is the fleet's worker set, replacing cold gateway workers by
// the agents' workers of the same name, and a gateway endpoint's worker
// by a cold one when its agent's registration is gone (so the endpoint
// stays routable).
type coldAware struct {
	kvnats.WorkerSet
	d *Daemon
}

// AddWorker implements kvnats.WorkerSet.
func (c coldAware) AddWorker(ref events.WorkerRef, reg *fleetv1.Registration) (kvnats.KeyedSink, error) {
	c.d.takeCold(ref)
	return c.WorkerSet.AddWorker(ref, reg)
}

// RemoveWorker implements kvnats.WorkerSet.
func (c coldAware) RemoveWorker(ref events.WorkerRef) {
	c.WorkerSet.RemoveWorker(ref)
	model, ok := c.d.gwModels[ref]
	if !ok || c.d.ix.LookupWorker(ref) != nil {
		return
	}
	if _, err := c.d.ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model, Endpoint: coldEndpoint}); err != nil {
		c.d.log.Warn("gateway endpoint's worker not kept routable", "worker", ref.String(), "err", err)
	}
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

// closeGateway closes the picker's listener of a daemon that failed to
// build.
func (d *Daemon) closeGateway() {
	if d.gwLis != nil {
		d.gwLis.Close()
	}
}
