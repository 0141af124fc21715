package config

import (
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/scoring"
)

// Defaults SetDefaults gives fields left at their zero value. Fields whose
// zero value has a meaning of its own (index.worker_capacity 0 learns the
// capacity, events.stale_after_silence 0 is off, a pod's topic "" takes
// every topic, ...) have no default here.
//
// The daemon passes these values on explicitly, so they, not the fallbacks
// of the packages it configures, are what it runs with. The limits are
// the api package's own defaults and the scoring values scoring's, so that
// a Server, Policy or Tracker built without a config behaves the same; the
// events values equal the ZeroMQ transport's defaults (config does not
// import the transport, which needs cgo; TestEventDefaultsAreTheTransports
// keeps them equal).
const (
	// DefaultGRPCListen is the gRPC listen address (grpc_listen).
	DefaultGRPCListen = ":50051"
	// DefaultMetricsListen is the Prometheus /metrics listen address
	// (metrics_listen).
	DefaultMetricsListen = ":9400"
	// MetricsOff as metrics_listen disables the /metrics listener.
	MetricsOff = "off"

	// DefaultBlockSize is vLLM's default --block-size, the tokens per KV
	// block (models[].block_size, and the block size of models that only
	// pods, routes or push-mode topics name).
	DefaultBlockSize = 16
	// DefaultDPSize is a pod's data-parallel size (pods[].dp_size).
	DefaultDPSize = 1
	// DefaultPushMaxWorkers bounds the workers one push listener creates
	// (push[].max_workers): a few pods with data parallelism.
	DefaultPushMaxWorkers = 32

	// DefaultGapPolicy is what lost events replay cannot recover do to a
	// worker (events.gap_policy): forget its blocks and relearn.
	DefaultGapPolicy = "reset"
	// DefaultReplayTimeout bounds one replay (events.replay_timeout); vLLM
	// serves replay between queue reads, up to ~100 ms late.
	DefaultReplayTimeout = 3 * time.Second
	// DefaultReplayConcurrency bounds replays in flight
	// (events.replay_concurrency).
	DefaultReplayConcurrency = 4
	// DefaultStaleAfterDisconnect marks a pull-mode worker stale once its
	// endpoint has been unreachable this long
	// (events.stale_after_disconnect).
	DefaultStaleAfterDisconnect = 5 * time.Second
	// DefaultQueueSize is each worker's queue of batches waiting to be
	// applied (events.queue_size); a full queue drops the message, which
	// the seq gap then recovers.
	DefaultQueueSize = 4096
	// DefaultQueueBytes bounds the payload bytes of a worker's queue
	// (events.queue_bytes).
	DefaultQueueBytes = 64 << 20
	// DefaultMaxMessageBytes is the largest event message accepted
	// (events.max_message_bytes).
	DefaultMaxMessageBytes = 16 << 20

	// DefaultScoringPolicy is the ranking policy answers use unless a
	// request names another (scoring.policy).
	DefaultScoringPolicy = "cache_aware"
	// DefaultGPUWeight, DefaultCPUWeight and DefaultStorageWeight weigh a
	// cached block by tier (scoring.gpu_weight, cpu_weight,
	// storage_weight; storage_weight also weighs disk and external).
	DefaultGPUWeight     = scoring.DefaultGPUWeight
	DefaultCPUWeight     = scoring.DefaultCPUWeight
	DefaultStorageWeight = scoring.DefaultStorageWeight
	// DefaultLoadWeight weighs a queued prefill token against an uncached
	// one (scoring.load_weight).
	DefaultLoadWeight = scoring.DefaultLoadWeight
	// DefaultGuard is cache_aware's hotspot guard (scoring.guard).
	DefaultGuard = "ttft"
	// DefaultStaticK is the static guard's multiple of the median in-flight
	// count (scoring.static_k).
	DefaultStaticK = scoring.DefaultStaticK
	// DefaultSpeculativeTTL is how long a routed request's blocks count as
	// cached before events confirm them (scoring.speculative_ttl).
	DefaultSpeculativeTTL = scoring.DefaultSpecTTL
	// DefaultInflightTTL is how long a routed request counts as load
	// without a Release (scoring.inflight_ttl).
	DefaultInflightTTL = scoring.DefaultFlightTTL
	// DefaultScrapeInterval is how often pods' metrics_url are read
	// (scoring.scrape_interval).
	DefaultScrapeInterval = time.Second

	// DefaultMaxTokens is the most token ids one Score request may carry
	// (limits.max_tokens).
	DefaultMaxTokens = api.DefaultMaxTokens
	// DefaultMaxBlockKeys is the most block keys one Score request may
	// carry (limits.max_block_keys).
	DefaultMaxBlockKeys = api.DefaultMaxBlockKeys
	// DefaultMaxCandidates is the most candidate workers one Score request
	// may name (limits.max_candidates).
	DefaultMaxCandidates = api.DefaultMaxCandidates
	// DefaultMaxInflight is the most routed requests tracked at once
	// (limits.max_inflight).
	DefaultMaxInflight = scoring.DefaultMaxFlights
	// DefaultMaxPending bounds Score and Route calls received and not
	// finished (limits.max_pending).
	DefaultMaxPending = api.DefaultMaxPending
	// DefaultQueueTarget is admission control's queueing target
	// (limits.queue_target).
	DefaultQueueTarget = api.DefaultQueueTarget
	// DefaultMaxQueueDelay refuses calls that queued longer
	// (limits.max_queue_delay).
	DefaultMaxQueueDelay = api.DefaultMaxQueueDelay
	// DefaultMaxInspectPending bounds Lookup, Dump and Diagnose calls
	// waiting for a slot (limits.max_inspect_pending).
	DefaultMaxInspectPending = api.DefaultMaxInspectPending
	// DefaultInspectWait is the longest an inspection call waits for a
	// slot (limits.inspect_wait).
	DefaultInspectWait = api.DefaultInspectWait
	// DefaultNATSBucket is the agents' key-value bucket (nats.bucket).
	DefaultNATSBucket = "kvindex_agents"
	// DefaultRegistrationTTL is nats.registration_ttl's default.
	DefaultRegistrationTTL = 10 * time.Second
	// DefaultCheckpointInterval is agent.checkpoint_interval's default.
	DefaultCheckpointInterval = 10 * time.Second
	// DefaultMaxConnections bounds open gRPC connections
	// (limits.max_connections).
	DefaultMaxConnections = 1024

	// DefaultLogLevel is the log level (log.level).
	DefaultLogLevel = "info"
	// DefaultLogFormat is the log format (log.format).
	DefaultLogFormat = "text"
	// DefaultProblemInterval rate-limits repeated per-worker problem logs
	// (log.problem_interval).
	DefaultProblemInterval = time.Minute
)

// The one engine of Default: a local vLLM started with
//
//	--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557"}'
const (
	// DefaultModel is the model Default's pod serves.
	DefaultModel = "default"
	// DefaultPod is the name of Default's pod.
	DefaultPod = "vllm-0"
	// DefaultEndpoint is where Default's pod publishes its KV events.
	DefaultEndpoint = "tcp://127.0.0.1:5557"
)

// Default returns the configuration `kvindex serve` runs without --config:
// one local engine (DefaultPod serving DefaultModel at DefaultEndpoint,
// DefaultBlockSize-token blocks) and every other field at its default. The
// value is fresh on every call, for the caller to change.
func Default() *Config {
	c := &Config{
		Models: []Model{{Name: DefaultModel, BlockSize: DefaultBlockSize}},
		Pods:   []Pod{{Name: DefaultPod, Model: DefaultModel, Endpoint: DefaultEndpoint}},
	}
	c.SetDefaults()
	return c
}

// SetDefaults gives every field left at its zero value its default (the
// Default* constants), and lists models that pods or push routes name but
// Models does not, with DefaultBlockSize. Fields already set are kept, so
// it is idempotent. Parse calls it; a Config built in Go needs it before
// Validate.
func (c *Config) SetDefaults() {
	set(&c.GRPCListen, DefaultGRPCListen)
	set(&c.MetricsListen, DefaultMetricsListen)
	c.Events.SetDefaults()
	c.Scoring.SetDefaults()
	c.Limits.SetDefaults()
	c.Log.SetDefaults()
	if c.NATS.Enabled() {
		set(&c.NATS.Bucket, DefaultNATSBucket)
		set(&c.NATS.RegistrationTTL, DefaultRegistrationTTL)
	}
	if c.Agent.Checkpoint != "" {
		set(&c.Agent.CheckpointInterval, DefaultCheckpointInterval)
	}
	c.Discovery.SetDefaults()
	for i := range c.Models {
		set(&c.Models[i].BlockSize, DefaultBlockSize)
	}
	for i := range c.Pods {
		set(&c.Pods[i].DPSize, DefaultDPSize)
	}
	named := func(m string) {
		if m != "" && c.model(m) == nil {
			c.Models = append(c.Models, Model{Name: m, BlockSize: DefaultBlockSize})
		}
	}
	for _, p := range c.Pods {
		named(p.Model)
	}
	if k := c.Discovery.Kubernetes; k != nil {
		named(k.Model)
	}
	if d := c.Discovery.DNS; d != nil {
		named(d.Model)
	}
	for i := range c.Push {
		set(&c.Push[i].MaxWorkers, DefaultPushMaxWorkers)
		for _, r := range c.Push[i].Routes {
			named(r.Model)
		}
	}
	c.Tokenize.SetDefaults()
	c.Gateway.SetDefaults(c)
}

// SetDefaults gives the zero fields of the events section their defaults.
// StaleAfterSilence has none: 0 is off.
func (e *Events) SetDefaults() {
	set(&e.GapPolicy, DefaultGapPolicy)
	set(&e.ReplayTimeout, DefaultReplayTimeout)
	set(&e.ReplayConcurrency, DefaultReplayConcurrency)
	set(&e.StaleAfterDisconnect, DefaultStaleAfterDisconnect)
	set(&e.QueueSize, DefaultQueueSize)
	set(&e.QueueBytes, DefaultQueueBytes)
	set(&e.MaxMessageBytes, DefaultMaxMessageBytes)
}

// SetDefaults gives the zero fields of the scoring section their defaults.
func (s *Scoring) SetDefaults() {
	set(&s.Policy, DefaultScoringPolicy)
	set(&s.GPUWeight, DefaultGPUWeight)
	set(&s.CPUWeight, DefaultCPUWeight)
	set(&s.StorageWeight, DefaultStorageWeight)
	set(&s.LoadWeight, DefaultLoadWeight)
	set(&s.Guard, DefaultGuard)
	set(&s.StaticK, DefaultStaticK)
	set(&s.SpeculativeTTL, DefaultSpeculativeTTL)
	set(&s.InflightTTL, DefaultInflightTTL)
	set(&s.ScrapeInterval, DefaultScrapeInterval)
}

// SetDefaults gives the zero fields of the limits section their defaults.
func (l *Limits) SetDefaults() {
	set(&l.MaxTokens, DefaultMaxTokens)
	set(&l.MaxBlockKeys, DefaultMaxBlockKeys)
	set(&l.MaxCandidates, DefaultMaxCandidates)
	set(&l.MaxInflight, DefaultMaxInflight)
	set(&l.MaxPending, DefaultMaxPending)
	set(&l.QueueTarget, DefaultQueueTarget)
	set(&l.MaxQueueDelay, DefaultMaxQueueDelay)
	set(&l.MaxConnections, DefaultMaxConnections)
	set(&l.MaxInspect, api.DefaultMaxInspect())
	set(&l.MaxInspectPending, DefaultMaxInspectPending)
	set(&l.InspectWait, DefaultInspectWait)
}

// SetDefaults gives the zero fields of the log section their defaults.
func (l *Log) SetDefaults() {
	set(&l.Level, DefaultLogLevel)
	set(&l.Format, DefaultLogFormat)
	set(&l.ProblemInterval, DefaultProblemInterval)
}

// set stores def in *v when *v is the zero value.
func set[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Discovery defaults.
const (
	// DefaultDiscoveryPort is the KV event port discovered pods publish
	// on (the README's vLLM recipe).
	DefaultDiscoveryPort = 5557
	// DefaultKubernetesResync is the informers' full resync period.
	DefaultKubernetesResync = 5 * time.Minute
	// DefaultDNSInterval is how often a headless service is resolved.
	DefaultDNSInterval = 10 * time.Second
)

// SetDefaults gives the zero fields of the configured discovery source
// their defaults.
func (d *Discovery) SetDefaults() {
	if k := d.Kubernetes; k != nil {
		k.DiscoveredPods.setDefaults()
		set(&k.Resync, DefaultKubernetesResync)
	}
	if n := d.DNS; n != nil {
		n.DiscoveredPods.setDefaults()
		set(&n.Interval, DefaultDNSInterval)
	}
}

func (p *DiscoveredPods) setDefaults() {
	set(&p.Port, DefaultDiscoveryPort)
	set(&p.DPSize, DefaultDPSize)
}
