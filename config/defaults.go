package config

import (
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/scoring"
)

// Defaults SetDefaults gives fields left at their zero value, each with
// its key; fields whose zero value means something have none. The daemon
// passes them on explicitly. The limits are api's own defaults and the
// scoring values scoring's, so a Server or Policy built without a config
// behaves the same; the events values equal the ZeroMQ transport's
// (which needs cgo; TestEventDefaultsAreTheTransports keeps them equal).
const (
	DefaultGRPCListen    = ":50051" // grpc_listen
	DefaultMetricsListen = ":9400"  // metrics_listen
	// MetricsOff as metrics_listen disables the /metrics listener.
	MetricsOff = "off"

	// DefaultBlockSize is vLLM's default --block-size: models[].block_size,
	// also of models only pods, routes or topics name.
	DefaultBlockSize      = 16
	DefaultDPSize         = 1  // pods[].dp_size, push[].dp_size
	DefaultPushMaxWorkers = 32 // push[].max_workers: a few pods with data parallelism

	DefaultGapPolicy = "reset" // events.gap_policy: forget the blocks and relearn
	// DefaultReplayTimeout is events.replay_timeout: vLLM serves replay
	// between queue reads, up to ~100 ms late.
	DefaultReplayTimeout        = 3 * time.Second
	DefaultReplayConcurrency    = 4               // events.replay_concurrency
	DefaultStaleAfterDisconnect = 5 * time.Second // events.stale_after_disconnect
	// DefaultQueueSize is events.queue_size; a full queue drops the
	// message, which the seq gap then recovers.
	DefaultQueueSize       = 4096
	DefaultQueueBytes      = 64 << 20 // events.queue_bytes
	DefaultMaxMessageBytes = 16 << 20 // events.max_message_bytes

	DefaultScoringPolicy  = "cache_aware"                // scoring.policy
	DefaultGPUWeight      = scoring.DefaultGPUWeight     // scoring.gpu_weight
	DefaultCPUWeight      = scoring.DefaultCPUWeight     // scoring.cpu_weight
	DefaultStorageWeight  = scoring.DefaultStorageWeight // scoring.storage_weight (also disk and external)
	DefaultUnknownTier    = "other"                      // scoring.unknown_tier (weighs 0 unless tier_weights.other says)
	DefaultLoadWeight     = scoring.DefaultLoadWeight    // scoring.load_weight
	DefaultGuard          = "ttft"                       // scoring.guard
	DefaultStaticK        = scoring.DefaultStaticK       // scoring.static_k
	DefaultSpeculativeTTL = scoring.DefaultSpecTTL       // scoring.speculative_ttl
	DefaultInflightTTL    = scoring.DefaultFlightTTL     // scoring.inflight_ttl
	DefaultGroupCaps      = true                         // scoring.group_caps
	DefaultScrapeInterval = time.Second                  // scoring.scrape_interval

	DefaultMaxTokens          = api.DefaultMaxTokens         // limits.max_tokens
	DefaultMaxBlockKeys       = api.DefaultMaxBlockKeys      // limits.max_block_keys
	DefaultMaxCandidates      = api.DefaultMaxCandidates     // limits.max_candidates
	DefaultMaxInflight        = scoring.DefaultMaxFlights    // limits.max_inflight
	DefaultMaxPending         = api.DefaultMaxPending        // limits.max_pending
	DefaultQueueTarget        = api.DefaultQueueTarget       // limits.queue_target
	DefaultMaxQueueDelay      = api.DefaultMaxQueueDelay     // limits.max_queue_delay
	DefaultMaxInspectPending  = api.DefaultMaxInspectPending // limits.max_inspect_pending
	DefaultInspectWait        = api.DefaultInspectWait       // limits.inspect_wait
	DefaultMaxConnections     = 1024                         // limits.max_connections
	DefaultNATSBucket         = "kvindex_agents"             // nats.bucket
	DefaultRegistrationTTL    = 10 * time.Second             // nats.registration_ttl
	DefaultCheckpointInterval = 10 * time.Second             // agent.checkpoint_interval

	DefaultLogLevel        = "info"      // log.level
	DefaultLogFormat       = "text"      // log.format
	DefaultProblemInterval = time.Minute // log.problem_interval: rate-limits repeated per-worker problem logs
)

// The one engine of Default: a local vLLM started with
//
//	--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557"}'
const (
	DefaultModel    = "default"              // the model Default's pod serves
	DefaultPod      = "vllm-0"               // Default's pod
	DefaultEndpoint = "tcp://127.0.0.1:5557" // where Default's pod publishes
)

// Default returns the configuration `kvindex serve` runs without --config:
// one local engine and every other field at its default; fresh on every
// call, for the caller to change.
func Default() *Config {
	c := &Config{
		Models: []Model{{Name: DefaultModel, BlockSize: DefaultBlockSize}},
		Pods:   []Pod{{Name: DefaultPod, Model: DefaultModel, Endpoint: DefaultEndpoint}},
	}
	c.SetDefaults()
	return c
}

// SetDefaults gives every field left at its zero value its default, and
// lists the models that pods, routes or discovery name but Models does not
// with DefaultBlockSize. It is idempotent. Parse calls it; a Config built
// in Go needs it before Validate.
func (c *Config) SetDefaults() {
	defaults.Zero(&c.GRPCListen, DefaultGRPCListen)
	defaults.Zero(&c.MetricsListen, DefaultMetricsListen)
	e := &c.Events
	defaults.Zero(&e.GapPolicy, DefaultGapPolicy)
	defaults.Zero(&e.ReplayTimeout, DefaultReplayTimeout)
	defaults.Zero(&e.ReplayConcurrency, DefaultReplayConcurrency)
	defaults.Zero(&e.StaleAfterDisconnect, DefaultStaleAfterDisconnect)
	defaults.Zero(&e.QueueSize, DefaultQueueSize)
	defaults.Zero(&e.QueueBytes, DefaultQueueBytes)
	defaults.Zero(&e.MaxMessageBytes, DefaultMaxMessageBytes)
	s := &c.Scoring
	defaults.Zero(&s.Policy, DefaultScoringPolicy)
	defaults.Zero(&s.GPUWeight, DefaultGPUWeight)
	defaults.Zero(&s.CPUWeight, DefaultCPUWeight)
	defaults.Zero(&s.StorageWeight, DefaultStorageWeight)
	defaults.Zero(&s.UnknownTier, DefaultUnknownTier)
	defaults.Zero(&s.LoadWeight, DefaultLoadWeight)
	defaults.Zero(&s.Guard, DefaultGuard)
	defaults.Zero(&s.StaticK, DefaultStaticK)
	defaults.Zero(&s.SpeculativeTTL, DefaultSpeculativeTTL)
	defaults.Zero(&s.InflightTTL, DefaultInflightTTL)
	if s.GroupCaps == nil {
		s.GroupCaps = new(DefaultGroupCaps)
	}
	defaults.Zero(&s.ScrapeInterval, DefaultScrapeInterval)
	l := &c.Limits
	defaults.Zero(&l.MaxTokens, DefaultMaxTokens)
	defaults.Zero(&l.MaxBlockKeys, DefaultMaxBlockKeys)
	defaults.Zero(&l.MaxCandidates, DefaultMaxCandidates)
	defaults.Zero(&l.MaxInflight, DefaultMaxInflight)
	defaults.Zero(&l.MaxPending, DefaultMaxPending)
	defaults.Zero(&l.QueueTarget, DefaultQueueTarget)
	defaults.Zero(&l.MaxQueueDelay, DefaultMaxQueueDelay)
	defaults.Zero(&l.MaxConnections, DefaultMaxConnections)
	defaults.Zero(&l.MaxInspect, api.DefaultMaxInspect())
	defaults.Zero(&l.MaxInspectPending, DefaultMaxInspectPending)
	defaults.Zero(&l.InspectWait, DefaultInspectWait)
	defaults.Zero(&c.Log.Level, DefaultLogLevel)
	defaults.Zero(&c.Log.Format, DefaultLogFormat)
	defaults.Zero(&c.Log.ProblemInterval, DefaultProblemInterval)
	if c.NATS.Enabled() {
		defaults.Zero(&c.NATS.Bucket, DefaultNATSBucket)
		defaults.Zero(&c.NATS.RegistrationTTL, DefaultRegistrationTTL)
	}
	if c.Agent.Checkpoint != "" {
		defaults.Zero(&c.Agent.CheckpointInterval, DefaultCheckpointInterval)
	}
	for _, p := range c.Discovery.pods() {
		defaults.Zero(&p.Port, DefaultDiscoveryPort)
		defaults.Zero(&p.DPSize, DefaultDPSize)
	}
	if k := c.Discovery.Kubernetes; k != nil {
		defaults.Zero(&k.Resync, DefaultKubernetesResync)
	}
	if n := c.Discovery.DNS; n != nil {
		defaults.Zero(&n.Interval, DefaultDNSInterval)
	}
	for i := range c.Models {
		defaults.Zero(&c.Models[i].BlockSize, DefaultBlockSize)
	}
	for i := range c.Pods {
		defaults.Zero(&c.Pods[i].DPSize, DefaultDPSize)
	}
	named := func(m string) {
		if m != "" && c.model(m) == nil {
			c.Models = append(c.Models, Model{Name: m, BlockSize: DefaultBlockSize})
		}
	}
	for _, p := range c.Pods {
		named(p.Model)
	}
	for _, p := range c.Discovery.pods() {
		named(p.Model)
	}
	for i := range c.Push {
		defaults.Zero(&c.Push[i].MaxWorkers, DefaultPushMaxWorkers)
		defaults.Zero(&c.Push[i].DPSize, DefaultDPSize)
		for _, r := range c.Push[i].Routes {
			named(r.Model)
		}
	}
	t := &c.Tokenize
	defaults.Zero(&t.Timeout, DefaultTokenizeTimeout)
	defaults.Zero(&t.CacheEntries, DefaultTokenizeCacheEntries)
	defaults.Zero(&t.MaxConcurrent, DefaultTokenizeMaxConcurrent)
	defaults.Zero(&t.MaxPromptBytes, DefaultTokenizeMaxPromptBytes)
	c.Gateway.setDefaults(c)
}

// Discovery defaults.
const (
	DefaultDiscoveryPort    = 5557             // discovery.*.port: the README's vLLM recipe
	DefaultKubernetesResync = 5 * time.Minute  // discovery.kubernetes.resync
	DefaultDNSInterval      = 10 * time.Second // discovery.dns.interval
)

// pods are the pod defaults of the configured discovery source, if any.
func (d *Discovery) pods() []*DiscoveredPods {
	var out []*DiscoveredPods
	if d.Kubernetes != nil {
		out = append(out, &d.Kubernetes.DiscoveredPods)
	}
	if d.DNS != nil {
		out = append(out, &d.DNS.DiscoveredPods)
	}
	return out
}
