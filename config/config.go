package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/scoring"
)

// ErrInvalid reports a configuration that cannot run; it is wrapped with
// the field at fault.
var ErrInvalid = errors.New("config: invalid")

// Config is the daemon's configuration.
type Config struct {
	// GRPCListen is the gRPC listen address (default DefaultGRPCListen).
	GRPCListen string `yaml:"grpc_listen,omitempty"`
	// MetricsListen is the Prometheus /metrics listen address (default
	// DefaultMetricsListen); MetricsOff ("off") disables it.
	MetricsListen string `yaml:"metrics_listen,omitempty"`
	// HTTPListen, when set, serves the API's unary calls as JSON over
	// HTTP (Connect's protocol: POST /kvindex.v1.IndexService/Score) on
	// this address, with the gRPC API's TLS, auth scopes, admission
	// control and limits. Empty (the default) serves none.
	HTTPListen string `yaml:"http_listen,omitempty"`
	// Models lists model namespaces and their block sizes. Models that pods
	// name but that are not listed get DefaultBlockSize.
	Models []Model `yaml:"models,omitempty"`
	// Pods are the vLLM engines to subscribe to.
	Pods []Pod `yaml:"pods,omitempty"`
	// Push lists bound sockets that push-mode engines connect to.
	Push []Push `yaml:"push,omitempty"`
	// Events tunes ingest: replay, gap policy, staleness.
	Events Events `yaml:"events,omitempty"`
	// Score tunes answers.
	Score Score `yaml:"score,omitempty"`
	// Scoring sets the ranking policy and load sources.
	Scoring Scoring `yaml:"scoring,omitempty"`
	// Index bounds the index's memory.
	Index Index `yaml:"index,omitempty"`
	// Limits bound what one Score request may ask.
	Limits Limits `yaml:"limits,omitempty"`
	// Log sets up logging.
	Log Log `yaml:"log,omitempty"`
	// TLS serves gRPC (and optionally /metrics) over TLS, with client
	// certificates (mTLS) when a client CA is given.
	TLS TLS `yaml:"tls,omitempty"`
	// Auth requires bearer tokens on gRPC calls.
	Auth Auth `yaml:"auth,omitempty"`
	// NATS connects fleet mode: kvindex agent publishes on it, kvindex
	// serve discovers agents and follows their deltas on it.
	NATS NATS `yaml:"nats,omitempty"`
	// Agent configures kvindex agent, the sidecar beside one pod.
	Agent Agent `yaml:"agent,omitempty"`
	// Tokenize bounds the tokenization of text prompts (models'
	// tokenizer_urls).
	Tokenize Tokenize `yaml:"tokenize,omitempty"`
	// Gateway serves the Gateway API Inference Extension's endpoint
	// picker (Envoy ext_proc).
	Gateway Gateway `yaml:"gateway,omitempty"`
	// Discovery finds pods to subscribe to directly (besides pods[]):
	// Kubernetes pods by label selector, or the addresses of a headless
	// service in DNS.
	Discovery Discovery `yaml:"discovery,omitempty"`
}

// Discovery finds the pods of direct mode while kvindex serve runs; at
// most one of its sources is set. A pod that appears (Running and Ready,
// or resolved) joins the index; one that goes leaves it.
type Discovery struct {
	// Kubernetes watches pods through the API server.
	Kubernetes *KubernetesDiscovery `yaml:"kubernetes,omitempty"`
	// DNS re-resolves a headless service's name.
	DNS *DNSDiscovery `yaml:"dns,omitempty"`
}

// Enabled reports whether a discovery source is configured.
func (d *Discovery) Enabled() bool { return d.Kubernetes != nil || d.DNS != nil }

// DiscoveredPods is what every discovered pod gets unless its source says
// otherwise (Kubernetes annotations override each field).
type DiscoveredPods struct {
	// Model is the model the pods serve (annotation kvindex.io/model).
	Model string `yaml:"model,omitempty"`
	// Port is the KV event PUB port of DP rank 0 (default 5557;
	// annotation kvindex.io/kv-events-port); rank r publishes on port+r.
	Port int `yaml:"port,omitempty"`
	// ReplayPort is the replay port of rank 0 (0: none; annotation
	// kvindex.io/replay-port).
	ReplayPort int `yaml:"replay_port,omitempty"`
	// MetricsPort is the port of vLLM's /metrics, scraped for load (0:
	// none; annotation kvindex.io/metrics-port).
	MetricsPort int `yaml:"metrics_port,omitempty"`
	// DPSize is the pods' data-parallel size (default 1; annotation
	// kvindex.io/dp-size).
	DPSize int `yaml:"dp_size,omitempty"`
	// CapacityBlocks bounds each worker's blocks, as pods[].capacity_blocks
	// (annotation kvindex.io/capacity-blocks).
	CapacityBlocks int `yaml:"capacity_blocks,omitempty"`
}

// KubernetesDiscovery watches pods with client-go informers: those that
// match Selector in Namespace and are Running and Ready are indexed.
type KubernetesDiscovery struct {
	DiscoveredPods `yaml:",inline"`
	// Namespace is where the pods run ("": the namespace kvindex runs in,
	// read from its service account).
	Namespace string `yaml:"namespace,omitempty"`
	// Selector is a label selector, e.g. "app=vllm" (required).
	Selector string `yaml:"selector,omitempty"`
	// Kubeconfig is a kubeconfig file for running outside the cluster;
	// "" uses the in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig,omitempty"`
	// Resync is the informers' full resync period (default 5m).
	Resync time.Duration `yaml:"resync,omitempty"`
}

// DNSDiscovery resolves Name (a headless service) every Interval: each
// address is a pod, named after the service's first label and its address
// (e.g. vllm-10-0-0-5).
type DNSDiscovery struct {
	DiscoveredPods `yaml:",inline"`
	// Name is the name to resolve, e.g. vllm.inference.svc.cluster.local
	// (required).
	Name string `yaml:"name,omitempty"`
	// Interval is how often it is resolved again (default 10s).
	Interval time.Duration `yaml:"interval,omitempty"`
	// Server is a DNS server host:port to ask instead of the system's
	// resolver ("" for the system's).
	Server string `yaml:"server,omitempty"`
}

// NATS is the fleet's NATS connection (docs/fleet.md).
type NATS struct {
	// URL is the NATS server, e.g. nats://nats:4222 (a comma-separated
	// list for a cluster); "" turns fleet mode off for kvindex serve.
	URL string `yaml:"url,omitempty"`
	// Bucket is the agents' JetStream key-value bucket (default
	// kvindex_agents).
	Bucket string `yaml:"bucket,omitempty"`
	// RegistrationTTL is how long an agent's registration lives without a
	// heartbeat (default 10s): a dead agent's workers leave replicas'
	// answers after it.
	RegistrationTTL time.Duration `yaml:"registration_ttl,omitempty"`
	// Models, for kvindex serve, restricts the replica to these models'
	// workers (a shard); empty: every model.
	Models []string `yaml:"models,omitempty"`
	// CredsFile is a NATS credentials file (JWT and seed); "" for none.
	CredsFile string `yaml:"creds_file,omitempty"`
	// TLS secures the connection to NATS (and presents a client
	// certificate for servers that verify clients).
	TLS NATSTLS `yaml:"tls,omitempty"`
}

// NATSTLS is the client side of TLS to NATS, for the agent and the
// replica alike. Setting any field turns TLS on (as a tls:// URL does).
// The files are read at start, so that a missing or unreadable one stops
// the process at once naming its field, and again at every reconnection:
// a rotated client certificate is presented from the next connection on,
// and an established connection keeps the one it opened with until it
// reconnects or the process restarts.
type NATSTLS struct {
	// CAFile is the PEM bundle of CAs that sign the server's certificate;
	// "" trusts the system's roots.
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile and KeyFile are the client's PEM certificate chain and key,
	// for a server that verifies clients (mTLS); given together.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ServerName is the name the server's certificate must carry; "" for
	// the host of the URL connected to.
	ServerName string `yaml:"server_name,omitempty"`
}

// Enabled reports whether TLS to NATS is configured.
func (t *NATSTLS) Enabled() bool { return *t != NATSTLS{} }

// Enabled reports whether fleet mode is configured.
func (n *NATS) Enabled() bool { return n.URL != "" }

// Agent configures kvindex agent.
type Agent struct {
	// Pod names the pod of pods[] the agent sits beside (default: the
	// only one).
	Pod string `yaml:"pod,omitempty"`
	// Checkpoint is the file the agent writes its state to (atomically),
	// so that a restarted agent recovers without its engine's replay
	// buffer having to reach back to the engine's start; "" for none.
	Checkpoint string `yaml:"checkpoint,omitempty"`
	// CheckpointInterval is how often the checkpoint is written (default
	// 10s).
	CheckpointInterval time.Duration `yaml:"checkpoint_interval,omitempty"`
	// GRPCListen, when set, serves the agent's own index over gRPC for
	// inspection (ListWorkers, Lookup, Dump, Diagnose, Watch, Score; Route
	// and Release are refused), so that kvindexctl diff can compare a
	// replica with the agent it follows. Plaintext: bind it to the pod's
	// loopback (127.0.0.1:50052) and reach it with
	// kubectl port-forward. With auth.tokens it takes the same tokens as
	// kvindex serve. "" (the default) serves nothing.
	GRPCListen string `yaml:"grpc_listen,omitempty"`
}

// TLS configures transport security. The files are re-read when they
// change (checked every second), so certificates rotate without a
// restart.
type TLS struct {
	// CertFile and KeyFile are the server's PEM certificate chain and key;
	// setting them turns TLS on for gRPC.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ClientCAFile, when set, is the PEM bundle of CAs that sign client
	// certificates: clients must present one (mTLS).
	ClientCAFile string `yaml:"client_ca_file,omitempty"`
	// Metrics serves /metrics over the same TLS (with the same client
	// certificate requirement).
	Metrics bool `yaml:"metrics,omitempty"`
}

// Enabled reports whether TLS is configured.
func (t *TLS) Enabled() bool { return t.CertFile != "" }

// Auth configures bearer-token authentication of every listener: the
// gRPC API, the endpoint picker's ext_proc listener (gateway.listen), the
// metrics server (/metrics and /healthz need scope read) and an agent's
// agent.grpc_listen.
type Auth struct {
	// Tokens are the accepted tokens; with none, calls need no token.
	Tokens []Token `yaml:"tokens,omitempty"`
	// OpenHealth lets health checks through without a token: gRPC health
	// on every listener and the metrics server's /healthz (kubelet's
	// probes cannot send one).
	OpenHealth bool `yaml:"open_health,omitempty"`
	// CertIdentity accepts a verified client certificate (tls.client_ca_file)
	// in place of a token, with every scope; the certificate's common name
	// is the client's identity.
	CertIdentity bool `yaml:"cert_identity,omitempty"`
}

// Token is one client's bearer token. Its secret is read from File (its
// contents, trailing newline trimmed; re-read when it changes) or from the
// environment variable Env, never from the configuration itself, and is
// never logged.
type Token struct {
	// Name identifies the client in logs, metrics and request ownership.
	Name string `yaml:"name,omitempty"`
	// Scopes are read (Score, ListWorkers, Lookup, Dump, Diagnose, Watch,
	// health, reflection, /metrics, /healthz) and route (Route, Release,
	// the endpoint picker's ext_proc stream).
	Scopes []string `yaml:"scopes,omitempty"`
	// File holds the secret.
	File string `yaml:"file,omitempty"`
	// Env names the environment variable that holds the secret.
	Env string `yaml:"env,omitempty"`
}

// Model is one served model.
type Model struct {
	// Name is the model name requests use (vLLM's served model name).
	Name string `yaml:"name,omitempty"`
	// BlockSize is vLLM's --block-size for this model (default
	// DefaultBlockSize).
	BlockSize int `yaml:"block_size,omitempty"`
	// TokenizerURLs are the base URLs of servers that tokenize for the
	// model, its vLLM servers (e.g. http://10.0.0.5:8000; /tokenize is
	// appended), tried in turn. Without any, text prompts of the model are
	// refused.
	TokenizerURLs []string `yaml:"tokenizer_urls,omitempty"`
}

// Pod is one vLLM engine (all its data-parallel ranks).
type Pod struct {
	// Name identifies the pod in answers and metrics.
	Name string `yaml:"name,omitempty"`
	// Model is the model the pod serves.
	Model string `yaml:"model,omitempty"`
	// Endpoint is the pod's KV event PUB endpoint for DP rank 0, e.g.
	// tcp://10.0.0.5:5557; rank r publishes on port+r.
	Endpoint string `yaml:"endpoint,omitempty"`
	// DPSize is the pod's data-parallel size (default DefaultDPSize).
	DPSize int `yaml:"dp_size,omitempty"`
	// Topic is the subscription prefix (default "", every topic).
	Topic string `yaml:"topic,omitempty"`
	// ReplayEndpoint is the pod's vLLM replay_endpoint for DP rank 0, e.g.
	// tcp://10.0.0.5:5567 (rank r: port+r); "" for none. With it, lost
	// events are replayed and a late start learns what is already cached.
	ReplayEndpoint string `yaml:"replay_endpoint,omitempty"`
	// MetricsURL is the pod's vLLM Prometheus endpoint, e.g.
	// http://10.0.0.5:8000/metrics; "" for none. Scraped for running and
	// waiting requests and KV cache usage, used by load-aware ranking.
	MetricsURL string `yaml:"metrics_url,omitempty"`
	// CapacityBlocks is the most blocks each of the pod's workers may hold,
	// e.g. vLLM's num_gpu_blocks (plus offload tiers); 0 uses
	// index.worker_capacity.
	CapacityBlocks int `yaml:"capacity_blocks,omitempty"`
}

// Index bounds what missed removals can leave behind.
type Index struct {
	// WorkerCapacity is the most blocks one worker may hold in all media
	// (0: learned from each worker's events; negative: unbounded). A pod's
	// capacity_blocks overrides it.
	WorkerCapacity int `yaml:"worker_capacity,omitempty"`
	// MemoryBudgetMiB bounds the index's estimated memory; beyond it blocks
	// are evicted from the workers holding the most (0: unbounded).
	MemoryBudgetMiB int64 `yaml:"memory_budget_mib,omitempty"`
	// RemovalHistory is how many recent removals each worker's record
	// keeps for kvindexctl diagnose, 16 bytes each (0: 256; negative:
	// none).
	RemovalHistory int `yaml:"removal_history,omitempty"`
}

// Scoring sets the default ranking policy (requests may override it) and
// how long routing decisions count.
type Scoring struct {
	// Policy is cache_aware (DefaultScoringPolicy) or longest_prefix.
	Policy string `yaml:"policy,omitempty"`
	// GPUWeight, CPUWeight and StorageWeight weigh a cached block by tier
	// (defaults DefaultGPUWeight, DefaultCPUWeight, DefaultStorageWeight).
	GPUWeight     float64 `yaml:"gpu_weight,omitempty"`
	CPUWeight     float64 `yaml:"cpu_weight,omitempty"`
	StorageWeight float64 `yaml:"storage_weight,omitempty"`
	// LoadWeight weighs a queued prefill token against an uncached one
	// (default DefaultLoadWeight, 1/3).
	LoadWeight float64 `yaml:"load_weight,omitempty"`
	// Guard is the hotspot guard: ttft (DefaultGuard), cost, static or off.
	Guard string `yaml:"guard,omitempty"`
	// Cost is the cost model the ttft guard estimates time to
	// first token with (defaults: scoring.DefaultCostModel, an 8B model on
	// one H100; see scoring.Calibrate for measuring it from vLLM's
	// metrics).
	Cost CostModel `yaml:"cost_model,omitempty"`
	// StaticK is the static guard's multiple of the median (default
	// DefaultStaticK).
	StaticK float64 `yaml:"static_k,omitempty"`
	// SpeculativeTTL is how long a routed request's blocks count as cached
	// before events confirm them (default DefaultSpeculativeTTL).
	SpeculativeTTL time.Duration `yaml:"speculative_ttl,omitempty"`
	// InflightTTL is how long a routed request counts as load without a
	// Release (default DefaultInflightTTL).
	InflightTTL time.Duration `yaml:"inflight_ttl,omitempty"`
	// ScrapeInterval is how often pods' metrics_url are read (default
	// DefaultScrapeInterval); a scrape older than 3 intervals is ignored.
	ScrapeInterval time.Duration `yaml:"scrape_interval,omitempty"`
}

// Push is one bound SUB socket for push-mode engines (vLLM started with
// endpoint tcp://<kvindex>:<port>). Topics name the pod: llm-d's
// kv@<pod>@<model> works as is; other topics are mapped in Routes.
type Push struct {
	// Listen is the bind address, e.g. tcp://*:5557.
	Listen string `yaml:"listen,omitempty"`
	// Topic is the subscription prefix (default "", every topic).
	Topic string `yaml:"topic,omitempty"`
	// Routes maps topics that do not follow kv@<pod>@<model>.
	Routes []Route `yaml:"routes,omitempty"`
	// MaxWorkers bounds the workers the listener creates, one per pod and
	// DP rank first seen (default 32); messages for more are refused and
	// counted.
	MaxWorkers int `yaml:"max_workers,omitempty"`
	// Allow lists the IP addresses or CIDR ranges engines may connect
	// from (default: any); other connections are refused at the ZeroMQ
	// handshake and counted.
	Allow []string `yaml:"allow,omitempty"`
}

// Route maps one push-mode topic to a pod.
type Route struct {
	// Topic is the engine's configured topic, matched exactly.
	Topic string `yaml:"topic,omitempty"`
	// Pod names the engine.
	Pod string `yaml:"pod,omitempty"`
	// Model is the model it serves.
	Model string `yaml:"model,omitempty"`
	// ReplayEndpoint is its replay socket for rank 0 ("" for none).
	ReplayEndpoint string `yaml:"replay_endpoint,omitempty"`
}

// Events tunes ingest.
type Events struct {
	// GapPolicy is what lost events that replay cannot recover do to a
	// worker: reset (DefaultGapPolicy: forget its blocks, relearn) or keep
	// (keep them, flag the worker UNSYNCED in every answer).
	GapPolicy string `yaml:"gap_policy,omitempty"`
	// ReplayTimeout bounds one replay (default DefaultReplayTimeout).
	ReplayTimeout time.Duration `yaml:"replay_timeout,omitempty"`
	// ReplayConcurrency bounds replays in flight (default
	// DefaultReplayConcurrency).
	ReplayConcurrency int `yaml:"replay_concurrency,omitempty"`
	// StaleAfterDisconnect marks a pull-mode worker stale after its
	// endpoint has been unreachable this long (default
	// DefaultStaleAfterDisconnect; negative: never).
	StaleAfterDisconnect time.Duration `yaml:"stale_after_disconnect,omitempty"`
	// StaleAfterSilence marks a worker stale after sending nothing this
	// long (default 0: off, since idle engines send nothing).
	StaleAfterSilence time.Duration `yaml:"stale_after_silence,omitempty"`
	// QueueSize is each worker's queue of batches waiting to be applied
	// (default DefaultQueueSize).
	QueueSize int `yaml:"queue_size,omitempty"`
	// QueueBytes bounds the payload bytes of one worker's queued batches,
	// and separately of the live batches held while a replay runs
	// (default 64 MiB); past it messages are dropped, counted and
	// recovered as gaps.
	QueueBytes int64 `yaml:"queue_bytes,omitempty"`
	// MaxMessageBytes is the largest event message accepted (default
	// 16 MiB, twice vLLM's largest real batch: a 1 M-token prompt
	// prefilled in one step); a larger one ends the engine's connection,
	// which kvindex re-establishes, and its loss is handled as a gap.
	MaxMessageBytes int64 `yaml:"max_message_bytes,omitempty"`
}

// Score tunes answers.
type Score struct {
	// IncludeStale keeps stale workers in Score answers (flagged STALE);
	// by default they are left out unless named as candidates.
	IncludeStale bool `yaml:"include_stale,omitempty"`
}

// Limits bound Score requests.
type Limits struct {
	// MaxTokens is the most token ids one request may carry (default
	// DefaultMaxTokens).
	MaxTokens int `yaml:"max_tokens,omitempty"`
	// MaxBlockKeys is the most block keys one request may carry (default
	// DefaultMaxBlockKeys).
	MaxBlockKeys int `yaml:"max_block_keys,omitempty"`
	// MaxCandidates is the most candidate workers one request may name
	// (default DefaultMaxCandidates).
	MaxCandidates int `yaml:"max_candidates,omitempty"`
	// MaxInflight is the most routed requests kvindex tracks at once
	// (default DefaultMaxInflight); Route refuses more with
	// RESOURCE_EXHAUSTED until some are released or expire.
	MaxInflight int `yaml:"max_inflight,omitempty"`
	// MaxPending bounds Score and Route calls received and not finished
	// (default 128); more are refused with RESOURCE_EXHAUSTED before their
	// body is read. With max_tokens it bounds a burst's memory: about
	// max_pending x 9 bytes x max_tokens.
	MaxPending int `yaml:"max_pending,omitempty"`
	// MaxWatches bounds concurrent Watch streams (default 64); more are
	// refused with RESOURCE_EXHAUSTED.
	MaxWatches int `yaml:"max_watches,omitempty"`
	// MaxTenants bounds the distinct tenant labels of the predicted
	// hit-ratio metrics (default 64); later tenants share "_other".
	MaxTenants int `yaml:"max_tenants,omitempty"`
	// MaxConcurrent bounds Score and Route calls executing at once
	// (default 8 per core).
	MaxConcurrent int `yaml:"max_concurrent,omitempty"`
	// QueueTarget is the queueing delay admission control keeps calls
	// under (default 1ms): a standing queue longer than it lowers the
	// number of calls taken on.
	QueueTarget time.Duration `yaml:"queue_target,omitempty"`
	// MaxQueueDelay refuses a call that queued longer before it could run
	// (default 50ms).
	MaxQueueDelay time.Duration `yaml:"max_queue_delay,omitempty"`
	// MaxConnections bounds open gRPC connections (default 1024); more
	// wait in the listen backlog.
	MaxConnections int `yaml:"max_connections,omitempty"`
	// MaxInspect bounds Lookup, Dump and Diagnose calls executing at once,
	// a budget apart from Score's and Route's (default half the cores, at
	// least 1), so that a storm of them cannot starve Score.
	MaxInspect int `yaml:"max_inspect,omitempty"`
	// MaxInspectPending bounds Lookup, Dump and Diagnose calls waiting for
	// a max_inspect slot (default 16); more are refused with
	// RESOURCE_EXHAUSTED before their body is read.
	MaxInspectPending int `yaml:"max_inspect_pending,omitempty"`
	// InspectWait is the longest a Lookup, Dump or Diagnose call waits
	// for a max_inspect slot before it is refused (default 1s).
	InspectWait time.Duration `yaml:"inspect_wait,omitempty"`
	// AdmissionOff turns admission control off (not recommended).
	AdmissionOff bool `yaml:"admission_off,omitempty"`
}

// Log sets up log/slog.
type Log struct {
	// Level is debug, info, warn or error (default DefaultLogLevel).
	Level string `yaml:"level,omitempty"`
	// Format is text or json (default DefaultLogFormat).
	Format string `yaml:"format,omitempty"`
	// ProblemInterval rate-limits repeated per-worker problem logs (default
	// DefaultProblemInterval).
	ProblemInterval time.Duration `yaml:"problem_interval,omitempty"`
}

// Load reads and validates a YAML file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes YAML (unknown fields are errors), then applies SetDefaults
// and Validate.
func Parse(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) model(name string) *Model {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i]
		}
	}
	return nil
}

// CostModel is the scoring.cost_model section: one engine's cost model
// (scoring.CostModel); zero fields take the defaults.
type CostModel struct {
	// PrefillTokensPerSec is the engine's prefill rate, attention aside.
	PrefillTokensPerSec float64 `yaml:"prefill_tokens_per_sec,omitempty"`
	// AttentionPairsPerSec is the prefill attention rate in (new token,
	// context token) pairs per second.
	AttentionPairsPerSec float64 `yaml:"attention_pairs_per_sec,omitempty"`
	// StepOverhead is the fixed cost of a forward pass.
	StepOverhead time.Duration `yaml:"step_overhead,omitempty"`
	// DecodePerSeq is the cost of each decoding request in a step.
	DecodePerSeq time.Duration `yaml:"decode_per_seq,omitempty"`
	// DecodePerContextToken is the cost of one context token of a
	// decoding request.
	DecodePerContextToken time.Duration `yaml:"decode_per_context_token,omitempty"`
	// MaxBatchedTokens is vLLM's max_num_batched_tokens.
	MaxBatchedTokens int `yaml:"max_batched_tokens,omitempty"`
	// KVCapacityTokens is one engine's KV cache in tokens.
	KVCapacityTokens int `yaml:"kv_capacity_tokens,omitempty"`
}

// model is scoring.DefaultCostModel with the section's non-zero fields.
func (m CostModel) model() scoring.CostModel {
	c := scoring.DefaultCostModel()
	override(&c.PrefillTokensPerSec, m.PrefillTokensPerSec)
	override(&c.AttentionPairsPerSec, m.AttentionPairsPerSec)
	override(&c.StepOverhead, m.StepOverhead)
	override(&c.DecodePerSeq, m.DecodePerSeq)
	override(&c.DecodePerContextToken, m.DecodePerContextToken)
	override(&c.MaxBatchedTokens, m.MaxBatchedTokens)
	override(&c.KVCapacityTokens, m.KVCapacityTokens)
	return c
}

// override stores x in *v unless x is the zero value.
func override[T comparable](v *T, x T) {
	var zero T
	if x != zero {
		*v = x
	}
}

// Policy is the configured default ranking policy.
func (c *Config) Policy() (scoring.Policy, error) {
	return c.Scoring.policy()
}

// policy is scoring.DefaultPolicy with the section's non-zero fields
// applied.
func (s *Scoring) policy() (scoring.Policy, error) {
	p, err := scoring.Override{
		Name: s.Policy, GPUWeight: s.GPUWeight, CPUWeight: s.CPUWeight, StorageWeight: s.StorageWeight,
		LoadWeight: s.LoadWeight, Guard: s.Guard, StaticK: s.StaticK,
	}.Apply(scoring.DefaultPolicy())
	if err != nil {
		return p, err
	}
	p.Cost = s.Cost.model()
	if err := p.Cost.Validate(); err != nil {
		return p, fmt.Errorf("cost_model: %w", err)
	}
	return p, nil
}

// Marshal encodes c as YAML in the keys Parse reads, fields at their zero
// value left out, so Parse(Marshal(c)) equals c once c.SetDefaults ran; a
// Config before SetDefaults comes out as short as it was written.
func Marshal(c *Config) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return b.Bytes(), nil
}

// Workers expands the pods into one endpoint per (pod, DP rank), in config order.
func (c *Config) Workers() []WorkerEndpoint {
	var out []WorkerEndpoint
	for _, p := range c.Pods {
		for r := 0; r < p.DPSize; r++ {
			ep, _ := events.OffsetEndpoint(p.Endpoint, r) // checked by Validate
			var rep string
			if p.ReplayEndpoint != "" {
				rep, _ = events.OffsetEndpoint(p.ReplayEndpoint, r)
			}
			out = append(out, WorkerEndpoint{
				Worker:         events.WorkerRef{Pod: p.Name, DPRank: r},
				Model:          p.Model,
				Endpoint:       ep,
				Topic:          p.Topic,
				ReplayEndpoint: rep,
				CapacityBlocks: p.CapacityBlocks,
			})
		}
	}
	return out
}

// WorkerEndpoint is one worker and where its events come from.
type WorkerEndpoint struct {
	// Worker is the (pod, DP rank).
	Worker events.WorkerRef
	// Model is the pod's model.
	Model string
	// Endpoint is this rank's PUB endpoint.
	Endpoint string
	// Topic is the subscription prefix.
	Topic string
	// ReplayEndpoint is this rank's replay socket, "" for none.
	ReplayEndpoint string
	// CapacityBlocks bounds the worker's blocks (0: the index default).
	CapacityBlocks int
}
