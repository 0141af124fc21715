package config

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/defaults"
)

// Defaults of the tokenize and gateway sections.
const (
	DefaultTokenizeTimeout        = 2 * time.Second
	DefaultTokenizeCacheEntries   = 4096
	DefaultTokenizeMaxConcurrent  = 64
	DefaultTokenizeMaxPromptBytes = 4 << 20
	DefaultGatewayBodyMode        = BodyModeFullDuplex
	DefaultGatewayMaxBodyBytes    = 8 << 20
	DefaultGatewayFallbacks       = 2
	DefaultGatewayMaxRequests     = 4096
)

// The gateway's body modes: the ext_proc filter's
// processing_mode.request_body_mode.
const (
	// BodyModeBuffered: BUFFERED requests, STREAMED responses.
	BodyModeBuffered = "buffered"
	// BodyModeFullDuplex: FULL_DUPLEX_STREAMED both ways, as the Gateway
	// API Inference Extension configures it.
	BodyModeFullDuplex = "full_duplex"
)

// Tokenize bounds the tokenization of text prompts (Score's prompt and
// messages, the gateway's OpenAI bodies) by the models' tokenizer_urls.
type Tokenize struct {
	// Timeout bounds one tokenization, every URL tried included.
	Timeout time.Duration `yaml:"timeout,omitempty"`
	// CacheEntries bounds the cache of answers, 4 bytes a token each
	// (negative: no cache).
	CacheEntries int `yaml:"cache_entries,omitempty"`
	// MaxConcurrent bounds tokenizer round trips in flight; more are
	// refused and counted.
	MaxConcurrent int `yaml:"max_concurrent,omitempty"`
	// MaxPromptBytes bounds one prompt's text.
	MaxPromptBytes int `yaml:"max_prompt_bytes,omitempty"`
}

// Validate checks the tokenize section.
func (t *Tokenize) Validate() error {
	switch {
	case t.Timeout < 0:
		return invalid("tokenize.timeout", "%v must not be negative", t.Timeout)
	case t.MaxConcurrent < 0:
		return invalid("tokenize.max_concurrent", "%d must not be negative", t.MaxConcurrent)
	case t.MaxPromptBytes < 0:
		return invalid("tokenize.max_prompt_bytes", "%d must not be negative", t.MaxPromptBytes)
	}
	return nil
}

// Gateway serves the Gateway API Inference Extension's endpoint picker:
// an Envoy ext_proc service a gateway asks which model server each OpenAI
// request goes to. Exactly one of Endpoints, InferencePool and
// DiscoveredPort is where the pool's endpoints come from.
type Gateway struct {
	// Listen is the ext_proc gRPC address; "" turns the picker off.
	Listen string `yaml:"listen,omitempty"`
	// BodyMode is full_duplex or buffered.
	BodyMode string `yaml:"body_mode,omitempty"`
	// MaxBodyBytes bounds a request body (larger: 413, counted). Bodies are
	// held until their destination is sent: at most max_requests x
	// max_body_bytes in all.
	MaxBodyBytes int64 `yaml:"max_body_bytes,omitempty"`
	// Fallbacks is how many endpoints after the chosen one are offered for
	// retries (negative: none).
	Fallbacks int `yaml:"fallbacks,omitempty"`
	// MaxRequests bounds the requests followed at once (more: 429, counted).
	MaxRequests int `yaml:"max_requests,omitempty"`
	// Endpoints are fixed model servers and the kvindex workers behind them.
	Endpoints []Endpoint `yaml:"endpoints,omitempty"`
	// InferencePool makes the Ready pods an InferencePool selects the
	// endpoints, at its target ports, as they come and go.
	InferencePool *InferencePool `yaml:"inference_pool,omitempty"`
	// DiscoveredPort makes discovery's pods the endpoints, each at its
	// address and this port (vLLM's API port).
	DiscoveredPort int `yaml:"discovered_port,omitempty"`
}

// The InferencePool API versions the gateway section can watch.
const (
	// InferencePoolV1 is GIE's v1 API (selector.matchLabels, targetPorts).
	InferencePoolV1 = "inference.networking.k8s.io/v1"
	// InferencePoolV1Alpha2 is GIE's earlier API (a selector map,
	// targetPortNumber).
	InferencePoolV1Alpha2 = "inference.networking.x-k8s.io/v1alpha2"
)

// DefaultInferencePoolResync is gateway.inference_pool.resync.
const DefaultInferencePoolResync = 5 * time.Minute

// InferencePool names a Gateway API Inference Extension InferencePool and
// what its pods serve unless their annotations say otherwise.
type InferencePool struct {
	// Name is the InferencePool's name (required).
	Name string `yaml:"name,omitempty"`
	// Namespace is its and its pods' ("": kvindex's own).
	Namespace string `yaml:"namespace,omitempty"`
	// APIVersion is InferencePoolV1 (default) or InferencePoolV1Alpha2.
	APIVersion string `yaml:"api_version,omitempty"`
	// Kubeconfig is for running outside the cluster ("": in-cluster).
	Kubeconfig string `yaml:"kubeconfig,omitempty"`
	// Resync is the informers' full resync period.
	Resync time.Duration `yaml:"resync,omitempty"`
	// Model is the model the pods serve (annotation kvindex.io/model;
	// default the only configured model).
	Model string `yaml:"model,omitempty"`
	// DPSize is the pods' data-parallel size with one target port (default
	// 1; annotation kvindex.io/dp-size): every rank behind the one address,
	// named in the x-data-parallel-rank header. With several target ports,
	// port i serves rank i.
	DPSize int `yaml:"dp_size,omitempty"`
}

// Enabled reports whether the endpoint picker is configured.
func (g *Gateway) Enabled() bool { return g.Listen != "" }

// Endpoint is one model server of the pool as the gateway addresses it,
// and the kvindex worker (or workers) it serves.
type Endpoint struct {
	// Address is the server's ip:port.
	Address string `yaml:"address,omitempty"`
	// Pod is the kvindex pod it serves (default: the address); one kvindex
	// hears nothing from is still routable, cold.
	Pod string `yaml:"pod,omitempty"`
	// DPRank is the rank this address serves (vLLM's external DP load
	// balancing).
	DPRank int `yaml:"dp_rank,omitempty"`
	// AllRanks says the address serves every rank (vLLM's internal DP load
	// balancing): the picker names the rank in the X-data-parallel-rank
	// header.
	AllRanks bool `yaml:"all_ranks,omitempty"`
	// Model is the model served; default the pod's, or the only model.
	Model string `yaml:"model,omitempty"`
}

// setDefaults gives the zero fields of the gateway section their
// defaults; an endpoint's pod and model come from the pods.
func (g *Gateway) setDefaults(c *Config) {
	if !g.Enabled() {
		return
	}
	defaults.Zero(&g.BodyMode, DefaultGatewayBodyMode)
	defaults.Zero(&g.MaxBodyBytes, DefaultGatewayMaxBodyBytes)
	defaults.Zero(&g.Fallbacks, DefaultGatewayFallbacks)
	defaults.Zero(&g.MaxRequests, DefaultGatewayMaxRequests)
	if ip := g.InferencePool; ip != nil {
		defaults.Zero(&ip.APIVersion, InferencePoolV1)
		defaults.Zero(&ip.Resync, DefaultInferencePoolResync)
		defaults.Zero(&ip.DPSize, 1)
		if ip.Model == "" && len(c.Models) == 1 {
			ip.Model = c.Models[0].Name
		}
	}
	for i := range g.Endpoints {
		e := &g.Endpoints[i]
		defaults.Zero(&e.Pod, e.Address)
		if p := c.FindPod(e.Pod); e.Model == "" && p != nil {
			e.Model = p.Model
		}
		if e.Model == "" && len(c.Models) == 1 {
			e.Model = c.Models[0].Name
		}
	}
}

// Validate checks the gateway section against the pods: each address
// once, a model for each, ranks within the pod's, no worker behind two
// addresses.
func (g *Gateway) Validate(c *Config) error {
	if !g.Enabled() {
		if len(g.Endpoints) > 0 || g.InferencePool != nil || g.DiscoveredPort != 0 {
			return invalid("gateway.listen", "required with endpoints, inference_pool or discovered_port")
		}
		return nil
	}
	if err := hostPort("gateway.listen", g.Listen, ""); err != nil {
		return err
	}
	switch {
	case g.BodyMode != BodyModeBuffered && g.BodyMode != BodyModeFullDuplex:
		return invalid("gateway.body_mode", "%q is not %s or %s", g.BodyMode, BodyModeFullDuplex, BodyModeBuffered)
	case g.MaxBodyBytes <= 0:
		return invalid("gateway.max_body_bytes", "%d must be positive", g.MaxBodyBytes)
	case g.Fallbacks > 16:
		return invalid("gateway.fallbacks", "%d is more than 16", g.Fallbacks)
	case g.MaxRequests <= 0:
		return invalid("gateway.max_requests", "%d must be positive", g.MaxRequests)
	}
	sources := 0
	for _, on := range []bool{len(g.Endpoints) > 0, g.InferencePool != nil, g.DiscoveredPort != 0} {
		if on {
			sources++
		}
	}
	switch {
	case sources == 0:
		return invalid("gateway.endpoints", "required (or inference_pool, or discovered_port): the pool's model servers")
	case sources > 1:
		return invalid("gateway.endpoints", "endpoints, inference_pool and discovered_port are alternatives; %d are set", sources)
	case g.InferencePool != nil:
		return g.InferencePool.validate(c)
	case g.DiscoveredPort != 0:
		switch {
		case g.DiscoveredPort < 0 || g.DiscoveredPort > 65535:
			return invalid("gateway.discovered_port", "%d is not a port", g.DiscoveredPort)
		case !c.Discovery.Enabled():
			return invalid("gateway.discovered_port", "requires discovery.kubernetes or discovery.dns")
		}
		return nil
	}
	addrs := map[string]bool{}
	workers := map[string]string{}
	for i, e := range g.Endpoints {
		f := fmt.Sprintf("gateway.endpoints[%d]", i)
		if _, port, err := net.SplitHostPort(e.Address); err != nil || port == "" || strings.Contains(e.Address, "://") {
			return invalid(f+".address", "%q is not ip:port", e.Address)
		}
		if addrs[e.Address] {
			return invalid(f+".address", "%q listed twice", e.Address)
		}
		addrs[e.Address] = true
		if e.Model == "" {
			return invalid(f+".model", "required: pod %q is not in pods and more than one model is configured", e.Pod)
		}
		if c.model(e.Model) == nil {
			return invalid(f+".model", "%q is not in models", e.Model)
		}
		dp := 1
		if p := c.FindPod(e.Pod); p != nil {
			dp = p.DPSize
			if p.Model != e.Model {
				return invalid(f+".model", "%q, but pod %q serves %q", e.Model, e.Pod, p.Model)
			}
		}
		switch {
		case e.DPRank < 0 || e.DPRank >= dp:
			return invalid(f+".dp_rank", "%d is not a rank of pod %q (dp_size %d)", e.DPRank, e.Pod, dp)
		case e.AllRanks && e.DPRank != 0:
			return invalid(f+".all_ranks", "not with dp_rank")
		}
		from, to := e.DPRank, e.DPRank+1
		if e.AllRanks {
			from, to = 0, dp
		}
		for r := from; r < to; r++ {
			w := fmt.Sprintf("%s/%d", e.Pod, r)
			if prev, ok := workers[w]; ok {
				return invalid(f+".pod", "worker %s is already behind %s", w, prev)
			}
			workers[w] = e.Address
		}
	}
	return nil
}

// validate checks the inference_pool section.
func (ip *InferencePool) validate(c *Config) error {
	switch {
	case ip.Name == "":
		return invalid("gateway.inference_pool.name", "required")
	case ip.APIVersion != InferencePoolV1 && ip.APIVersion != InferencePoolV1Alpha2:
		return invalid("gateway.inference_pool.api_version", "%q is not %s or %s", ip.APIVersion, InferencePoolV1, InferencePoolV1Alpha2)
	case ip.Resync < 0:
		return invalid("gateway.inference_pool.resync", "%v must not be negative", ip.Resync)
	case ip.DPSize < 1:
		return invalid("gateway.inference_pool.dp_size", "%d must be positive", ip.DPSize)
	case ip.Model == "":
		return invalid("gateway.inference_pool.model", "required: more than one model is configured")
	case c.model(ip.Model) == nil:
		return invalid("gateway.inference_pool.model", "%q is not in models", ip.Model)
	}
	return nil
}
