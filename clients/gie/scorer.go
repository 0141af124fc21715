package gie

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Type is the plugin type to name in an EndpointPickerConfig.
const Type = "kvindex-prefix-scorer"

// DefaultTimeout bounds one Score call when Params.Timeout is empty: a
// Score with cached tokens answers in well under a millisecond, a text
// prompt kvindex has not seen waits for one tokenization round trip.
const DefaultTimeout = 100 * time.Millisecond

// Params are the plugin's parameters, as JSON in the EndpointPickerConfig.
type Params struct {
	// Target is kvindex's gRPC address ("host:port" or any gRPC target);
	// required.
	Target string `json:"target"`
	// Model is the model name kvindex indexes the engines under; empty
	// uses each request's target model.
	Model string `json:"model,omitempty"`
	// Timeout bounds each Score call, a Go duration ("100ms"); empty means
	// DefaultTimeout.
	Timeout string `json:"timeout,omitempty"`
	// TokenFile holds a bearer token for a kvindex that requires one
	// (Score needs the read scope), read once when the plugin is made.
	TokenFile string `json:"tokenFile,omitempty"`
	// TLS, when set (even empty: the system's roots), connects over TLS.
	TLS *TLSParams `json:"tls,omitempty"`
	// Endpoints maps endpoint addresses to kvindex workers; an endpoint
	// not listed is found by its pod name (see the package doc).
	Endpoints []EndpointWorker `json:"endpoints,omitempty"`
}

// TLSParams are the client's TLS settings (see api.ClientTLS).
type TLSParams struct {
	// CAFile is the PEM bundle that signs kvindex's certificate; empty
	// uses the system's roots.
	CAFile string `json:"caFile,omitempty"`
	// CertFile and KeyFile are a client certificate and key, for a
	// kvindex that requires one (mTLS).
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// ServerName overrides the name checked against the certificate.
	ServerName string `json:"serverName,omitempty"`
}

// EndpointWorker names the kvindex worker behind an endpoint address.
type EndpointWorker struct {
	// Address is the endpoint's ip:port as the EPP knows it.
	Address string `json:"address"`
	// Pod and DPRank are the worker, as kvindex names it.
	Pod    string `json:"pod"`
	DPRank uint32 `json:"dpRank,omitempty"`
}

// Options are what the host gives a Scorer beside its parameters.
type Options struct {
	// Registerer receives the plugin's metrics, labelled with its name;
	// nil registers none.
	Registerer prometheus.Registerer
	// Logger receives kvindex becoming unreachable and answering again;
	// nil discards.
	Logger *slog.Logger
}

// Scorer is the kvindex prefix scorer: a fwksched.Scorer over kvindex's
// gRPC Score.
type Scorer struct {
	name    fwkplugin.TypedName
	model   string
	timeout time.Duration
	byAddr  map[string]*kvindexv1.WorkerRef // read-only after New
	client  *api.Client
	log     *slog.Logger
	m       *metrics
	failing atomic.Bool // the last call failed; logs only transitions
}

var _ fwksched.Scorer = (*Scorer)(nil)

// Register adds the plugin's factory to the framework's registry, under
// Type. Call it once, before the EPP loads its configuration.
func Register() { fwkplugin.Register(Type, Factory) }

// Factory is the plugin's fwkplugin.FactoryFunc: it decodes the JSON
// parameters (unknown fields refused), registers the metrics in
// controller-runtime's registry (the one the EPP serves) and logs
// through the EPP's logger. The connection closes when the handle's
// context ends.
func Factory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	p, err := DecodeParams(raw)
	if err != nil {
		return nil, fmt.Errorf("%s plugin %q: %w", Type, name, err)
	}
	ctx := handle.Context()
	log := slog.New(logr.ToSlogHandler(ctrllog.FromContext(ctx)))
	s, err := New(ctx, name, p, Options{Registerer: ctrlmetrics.Registry, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("%s plugin %q: %w", Type, name, err)
	}
	return s, nil
}

// DecodeParams decodes the plugin's JSON parameters, refusing unknown
// fields; nil or empty raw gives zero Params (which New refuses: target
// is required).
func DecodeParams(raw json.RawMessage) (Params, error) {
	var p Params
	if len(raw) == 0 {
		return p, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("parameters: %w", err)
	}
	return p, nil
}

// New returns a Scorer named name with parameters p. It dials kvindex
// lazily (the first Score connects) and closes the connection when ctx
// ends; Close closes it sooner.
func New(ctx context.Context, name string, p Params, o Options) (*Scorer, error) {
	if name == "" {
		name = Type
	}
	timeout, err := p.timeout()
	if err != nil {
		return nil, err
	}
	byAddr, err := p.workersByAddress()
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(p.Target) == "" {
		return nil, errors.New("target: required (kvindex's gRPC host:port)")
	}
	opts, err := p.dialOptions()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(o.Registerer, name)
	if err != nil {
		return nil, err
	}
	c, err := api.Dial(ctx, p.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", p.Target, err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Scorer{
		name:    fwkplugin.TypedName{Type: Type, Name: name},
		model:   p.Model,
		timeout: timeout,
		byAddr:  byAddr,
		client:  c,
		log:     log.With("plugin", name, "target", p.Target),
		m:       m,
	}
	context.AfterFunc(ctx, func() { _ = s.Close() })
	return s, nil
}

func (p *Params) timeout() (time.Duration, error) {
	if p.Timeout == "" {
		return DefaultTimeout, nil
	}
	d, err := time.ParseDuration(p.Timeout)
	if err != nil {
		return 0, fmt.Errorf("timeout: %w", err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("timeout: %s is not positive", p.Timeout)
	}
	return d, nil
}

func (p *Params) workersByAddress() (map[string]*kvindexv1.WorkerRef, error) {
	out := make(map[string]*kvindexv1.WorkerRef, len(p.Endpoints))
	for i, e := range p.Endpoints {
		switch {
		case e.Address == "":
			return nil, fmt.Errorf("endpoints[%d].address: required", i)
		case e.Pod == "":
			return nil, fmt.Errorf("endpoints[%d].pod: required", i)
		}
		if _, dup := out[e.Address]; dup {
			return nil, fmt.Errorf("endpoints[%d].address: %s is listed twice", i, e.Address)
		}
		out[e.Address] = &kvindexv1.WorkerRef{Pod: e.Pod, DpRank: e.DPRank}
	}
	return out, nil
}

func (p *Params) dialOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if p.TLS != nil {
		t := api.ClientTLS{CAFile: p.TLS.CAFile, CertFile: p.TLS.CertFile, KeyFile: p.TLS.KeyFile, ServerName: p.TLS.ServerName}
		o, err := t.DialOption()
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		opts = append(opts, o)
	}
	if p.TokenFile != "" {
		b, err := os.ReadFile(p.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("tokenFile: %w", err)
		}
		tok := strings.TrimRight(string(b), "\r\n")
		if tok == "" {
			return nil, fmt.Errorf("tokenFile: %s is empty", p.TokenFile)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(api.NewBearerToken(tok, p.TLS != nil)))
	}
	return opts, nil
}

// TypedName returns the plugin's type and name.
func (s *Scorer) TypedName() fwkplugin.TypedName { return s.name }

// Category says the scorer prefers endpoints by what they hold.
func (s *Scorer) Category() fwksched.ScorerCategory { return fwksched.Affinity }

// Close closes the connection to kvindex; later Scores fail, counted.
func (s *Scorer) Close() error { return s.client.Close() }

// Score returns each endpoint's cached fraction of the request's prompt,
// 0..1, every endpoint present: 0 for one kvindex does not know, that maps
// to no worker, or when kvindex cannot answer (counted, see the package
// doc). The Score names no candidates: kvindex refuses a call naming a
// worker it does not know (a pod not yet discovered would fail the whole
// cycle), and its answer lists every worker holding the prompt's first
// block, all that can score above 0. Cost: one Score round trip under
// Params.Timeout, O(endpoints + workers holding the first block).
func (s *Scorer) Score(ctx context.Context, _ *fwksched.CycleState, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	out := make(map[fwksched.Endpoint]float64, len(endpoints))
	refs := make([]*kvindexv1.WorkerRef, len(endpoints))
	for i, ep := range endpoints {
		out[ep] = 0
		refs[i] = s.worker(ep)
		if refs[i] == nil {
			s.m.unmapped.Inc()
		}
	}
	sreq, ok := s.scoreRequest(req)
	if !ok {
		s.m.noPrompt.Inc()
		return out
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.client.Score(cctx, sreq)
	if err != nil {
		s.m.failed.Inc()
		if !s.failing.Swap(true) {
			s.log.Warn("kvindex does not answer: every endpoint scores 0 until it does", "err", err)
		}
		return out
	}
	s.m.ok.Inc()
	if s.failing.Swap(false) {
		s.log.Info("kvindex answers again")
	}
	overlap := make(map[workerKey]float64, len(resp.GetWorkers()))
	for _, w := range resp.GetWorkers() {
		overlap[keyOf(w.GetWorker())] = w.GetOverlap()
	}
	for i, ep := range endpoints {
		if refs[i] != nil {
			out[ep] = clamp01(overlap[keyOf(refs[i])])
		}
	}
	return out
}

// workerKey is a WorkerRef as a map key.
type workerKey struct {
	pod  string
	rank uint32
}

func keyOf(r *kvindexv1.WorkerRef) workerKey {
	return workerKey{pod: r.GetPod(), rank: r.GetDpRank()}
}

func clamp01(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return min(v, 1)
}
