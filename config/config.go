package config

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/scoring"
)

// ErrInvalid reports a configuration that cannot run; it is wrapped with
// the field at fault.
var ErrInvalid = errors.New("config: invalid")

// Config is the daemon's configuration. A field's default is the Default*
// constant its key names (defaults.go).
type Config struct {
	// GRPCListen is the gRPC listen address.
	GRPCListen string `yaml:"grpc_listen,omitempty"`
	// MetricsListen is the /metrics listen address; MetricsOff disables it.
	MetricsListen string `yaml:"metrics_listen,omitempty"`
	// HTTPListen, when set, serves the API's unary calls as JSON over HTTP
	// (Connect's protocol: POST /kvindex.v1.IndexService/Score) with the
	// gRPC API's TLS, auth scopes, admission control and limits.
	HTTPListen string `yaml:"http_listen,omitempty"`
	// Models lists model namespaces and their block sizes.
	Models []Model `yaml:"models,omitempty"`
	// Pods are the vLLM engines to subscribe to.
	Pods []Pod `yaml:"pods,omitempty"`
	// Push lists bound sockets that push-mode engines connect to.
	Push []Push `yaml:"push,omitempty"`
	// Events tunes ingest.
	Events Events `yaml:"events,omitempty"`
	// Score tunes answers.
	Score Score `yaml:"score,omitempty"`
	// Scoring sets the ranking policy and load sources.
	Scoring Scoring `yaml:"scoring,omitempty"`
	// Index bounds the index's memory.
	Index Index `yaml:"index,omitempty"`
	// Limits bound what one request may ask.
	Limits Limits `yaml:"limits,omitempty"`
	// Log sets up logging.
	Log Log `yaml:"log,omitempty"`
	// TLS secures gRPC (and optionally /metrics), with mTLS given a client CA.
	TLS TLS `yaml:"tls,omitempty"`
	// Auth requires bearer tokens.
	Auth Auth `yaml:"auth,omitempty"`
	// NATS connects fleet mode: agents publish on it, replicas follow it.
	NATS NATS `yaml:"nats,omitempty"`
	// Agent configures kvindex agent, the sidecar beside one pod.
	Agent Agent `yaml:"agent,omitempty"`
	// Tokenize bounds the tokenization of text prompts.
	Tokenize Tokenize `yaml:"tokenize,omitempty"`
	// Gateway serves the Gateway API Inference Extension's endpoint picker.
	Gateway Gateway `yaml:"gateway,omitempty"`
	// Discovery finds pods to subscribe to directly, besides pods[].
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
// otherwise (the kvindex.io/ annotation named beside each field).
type DiscoveredPods struct {
	// Model is the model the pods serve (model).
	Model string `yaml:"model,omitempty"`
	// Port is the KV event port of DP rank 0 (kv-events-port); rank r: port+r.
	Port int `yaml:"port,omitempty"`
	// ReplayPort is the replay port of rank 0, 0 for none (replay-port).
	ReplayPort int `yaml:"replay_port,omitempty"`
	// MetricsPort is vLLM's /metrics port, scraped for load; 0 for none
	// (metrics-port).
	MetricsPort int `yaml:"metrics_port,omitempty"`
	// DPSize is the pods' data-parallel size (dp-size).
	DPSize int `yaml:"dp_size,omitempty"`
	// CapacityBlocks is as pods[].capacity_blocks (capacity-blocks).
	CapacityBlocks int `yaml:"capacity_blocks,omitempty"`
}

// KubernetesDiscovery watches pods with client-go informers: those that
// match Selector in Namespace and are Running and Ready are indexed.
type KubernetesDiscovery struct {
	DiscoveredPods `yaml:",inline"`
	// Namespace is the pods' ("": kvindex's own, from its service account).
	Namespace string `yaml:"namespace,omitempty"`
	// Selector is a label selector, e.g. "app=vllm" (required).
	Selector string `yaml:"selector,omitempty"`
	// Kubeconfig is for running outside the cluster ("": in-cluster).
	Kubeconfig string `yaml:"kubeconfig,omitempty"`
	// Resync is the informers' full resync period.
	Resync time.Duration `yaml:"resync,omitempty"`
}

// DNSDiscovery resolves Name (a headless service) every Interval: each
// address is a pod, named after the service's first label and its address
// (e.g. vllm-10-0-0-5).
type DNSDiscovery struct {
	DiscoveredPods `yaml:",inline"`
	// Name is the name to resolve (required).
	Name string `yaml:"name,omitempty"`
	// Interval is how often it is resolved again.
	Interval time.Duration `yaml:"interval,omitempty"`
	// Server is a DNS server host:port ("": the system's resolver).
	Server string `yaml:"server,omitempty"`
}

// NATS is the fleet's NATS connection (docs/fleet.md).
type NATS struct {
	// URL is the NATS server (comma-separated for a cluster); "" turns
	// fleet mode off.
	URL string `yaml:"url,omitempty"`
	// Bucket is the agents' JetStream key-value bucket.
	Bucket string `yaml:"bucket,omitempty"`
	// RegistrationTTL is how long an agent's registration lives without a
	// heartbeat: a dead agent's workers leave answers after it.
	RegistrationTTL time.Duration `yaml:"registration_ttl,omitempty"`
	// Models restricts a replica to these models' workers (a shard); empty:
	// every model.
	Models []string `yaml:"models,omitempty"`
	// CredsFile is a NATS credentials file (JWT and seed).
	CredsFile string `yaml:"creds_file,omitempty"`
	// TLS secures the connection to NATS.
	TLS NATSTLS `yaml:"tls,omitempty"`
}

// NATSTLS is the client side of TLS to NATS; any field set turns it on.
// The files are read at start (a bad one stops the process naming its
// field) and again at every reconnection, so a rotated client certificate
// is presented from the next connection on.
type NATSTLS struct {
	// CAFile signs the server's certificate ("": the system's roots).
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile and KeyFile are the client's certificate chain and key, for
	// a server that verifies clients; given together.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ServerName is the name the server's certificate must carry ("": the
	// URL's host).
	ServerName string `yaml:"server_name,omitempty"`
}

// Enabled reports whether TLS to NATS is configured.
func (t *NATSTLS) Enabled() bool { return *t != NATSTLS{} }

// Enabled reports whether fleet mode is configured.
func (n *NATS) Enabled() bool { return n.URL != "" }

// Agent configures kvindex agent.
type Agent struct {
	// Pod names the pod of pods[] the agent sits beside (default: the only one).
	Pod string `yaml:"pod,omitempty"`
	// Checkpoint is the file the agent writes its state to, so that a
	// restarted agent recovers without the engine's replay reaching back to
	// its start; "" for none.
	Checkpoint string `yaml:"checkpoint,omitempty"`
	// CheckpointInterval is how often the checkpoint is written.
	CheckpointInterval time.Duration `yaml:"checkpoint_interval,omitempty"`
	// GRPCListen, when set, serves the agent's own index over plaintext gRPC
	// for inspection (Route and Release refused), for kvindexctl diff; bind
	// it to loopback. It takes auth.tokens as kvindex serve does.
	GRPCListen string `yaml:"grpc_listen,omitempty"`
}

// TLS configures transport security. The files are re-read when they
// change (checked every second), so certificates rotate without a restart.
type TLS struct {
	// CertFile and KeyFile are the server's certificate chain and key;
	// setting them turns TLS on for gRPC.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ClientCAFile, when set, signs the client certificates clients must
	// present (mTLS).
	ClientCAFile string `yaml:"client_ca_file,omitempty"`
	// Metrics serves /metrics over the same TLS.
	Metrics bool `yaml:"metrics,omitempty"`
}

// Enabled reports whether TLS is configured.
func (t *TLS) Enabled() bool { return t.CertFile != "" }

// Auth configures bearer-token authentication of every listener: the gRPC
// API, the picker's ext_proc listener, the metrics server (scope read) and
// an agent's agent.grpc_listen.
type Auth struct {
	// Tokens are the accepted tokens; with none, calls need no token.
	Tokens []Token `yaml:"tokens,omitempty"`
	// OpenHealth lets gRPC health and /healthz through without a token
	// (kubelet's probes cannot send one).
	OpenHealth bool `yaml:"open_health,omitempty"`
	// CertIdentity accepts a verified client certificate in place of a
	// token, with every scope; its common name is the client's identity.
	CertIdentity bool `yaml:"cert_identity,omitempty"`
}

// Token is one client's bearer token. Its secret is read from File
// (trailing newline trimmed; re-read when it changes) or the environment
// variable Env, never from the configuration, and is never logged.
type Token struct {
	// Name identifies the client in logs, metrics and request ownership.
	Name string `yaml:"name,omitempty"`
	// Scopes are read (Score and the inspection calls, health, /metrics)
	// and route (Route, Release, the picker's ext_proc stream).
	Scopes []string `yaml:"scopes,omitempty"`
	// File holds the secret.
	File string `yaml:"file,omitempty"`
	// Env names the environment variable that holds the secret.
	Env string `yaml:"env,omitempty"`
}

// Model is one served model.
type Model struct {
	// Name is vLLM's served model name.
	Name string `yaml:"name,omitempty"`
	// BlockSize is vLLM's --block-size for this model.
	BlockSize int `yaml:"block_size,omitempty"`
	// TokenizerURLs are base URLs of the model's vLLM servers
	// (/tokenize is appended), tried in turn; without any, text prompts of
	// the model are refused.
	TokenizerURLs []string `yaml:"tokenizer_urls,omitempty"`
}

// Pod is one vLLM engine (all its data-parallel ranks).
type Pod struct {
	// Name identifies the pod in answers and metrics.
	Name string `yaml:"name,omitempty"`
	// Model is the model the pod serves.
	Model string `yaml:"model,omitempty"`
	// Endpoint is the KV event PUB endpoint of DP rank 0, e.g.
	// tcp://10.0.0.5:5557; rank r publishes on port+r.
	Endpoint string `yaml:"endpoint,omitempty"`
	// DPSize is the pod's data-parallel size.
	DPSize int `yaml:"dp_size,omitempty"`
	// Topic is the subscription prefix ("": every topic).
	Topic string `yaml:"topic,omitempty"`
	// ReplayEndpoint is vLLM's replay_endpoint for rank 0 (rank r: port+r);
	// "" for none. With it, lost events are replayed and a late start
	// learns what is already cached.
	ReplayEndpoint string `yaml:"replay_endpoint,omitempty"`
	// MetricsURL is the pod's vLLM /metrics, scraped for load-aware
	// ranking; "" for none.
	MetricsURL string `yaml:"metrics_url,omitempty"`
	// CapacityBlocks is the most blocks each worker may hold (vLLM's
	// num_gpu_blocks plus offload tiers); 0 uses index.worker_capacity.
	CapacityBlocks int `yaml:"capacity_blocks,omitempty"`
}

// Index bounds what missed removals can leave behind.
type Index struct {
	// WorkerCapacity is the most blocks one worker may hold in all media
	// (0: learned from its events; negative: unbounded).
	WorkerCapacity int `yaml:"worker_capacity,omitempty"`
	// MemoryBudgetMiB bounds the index's estimated memory; beyond it blocks
	// are evicted from the workers holding the most (0: unbounded).
	MemoryBudgetMiB int64 `yaml:"memory_budget_mib,omitempty"`
	// RemovalHistory is how many recent removals each worker keeps for
	// kvindexctl diagnose, 16 bytes each (0: 256; negative: none).
	RemovalHistory int `yaml:"removal_history,omitempty"`
}

// Scoring sets the default ranking policy (requests may override it) and
// how long routing decisions count.
type Scoring struct {
	// Policy is cache_aware or longest_prefix.
	Policy string `yaml:"policy,omitempty"`
	// GPUWeight, CPUWeight and StorageWeight weigh a cached block by tier:
	// aliases of TierWeights' gpu, cpu, and storage, disk and external.
	GPUWeight     float64 `yaml:"gpu_weight,omitempty"`
	CPUWeight     float64 `yaml:"cpu_weight,omitempty"`
	StorageWeight float64 `yaml:"storage_weight,omitempty"`
	// TierWeights weighs a cached block by tier class (gpu, cpu, storage,
	// disk, external, other), over the aliases; 0 credits nothing.
	TierWeights map[string]float64 `yaml:"tier_weights,omitempty"`
	// TierNames maps medium names engines send to a tier class, over the
	// built-in table (events.Medium); applied where events are decoded
	// (serve with pods or push listeners, or the agent).
	TierNames map[string]string `yaml:"tier_names,omitempty"`
	// UnknownTier is the class of medium names no table knows.
	UnknownTier string `yaml:"unknown_tier,omitempty"`
	// LoadWeight weighs a queued prefill token against an uncached one.
	LoadWeight float64 `yaml:"load_weight,omitempty"`
	// Guard is the hotspot guard: ttft, cost, static or off.
	Guard string `yaml:"guard,omitempty"`
	// Cost is the ttft guard's cost model (see scoring.Calibrate).
	Cost CostModel `yaml:"cost_model,omitempty"`
	// StaticK is the static guard's multiple of the median.
	StaticK float64 `yaml:"static_k,omitempty"`
	// SpeculativeTTL is how long a routed request's blocks count as cached
	// before events confirm them, at most (its Release ends it sooner).
	SpeculativeTTL time.Duration `yaml:"speculative_ttl,omitempty"`
	// InflightTTL is how long a routed request counts as load without a
	// Release.
	InflightTTL time.Duration `yaml:"inflight_ttl,omitempty"`
	// GroupCaps credits a hybrid model's worker (sliding window, mamba) only
	// with the hit every KV-cache group serves, as vLLM's coordinator
	// realizes it; false matches by the prefix group alone, a kill switch.
	// Unset is true (GroupCapsOn).
	GroupCaps *bool `yaml:"group_caps,omitempty"`
	// ScrapeInterval is how often pods' metrics_url are read; a scrape
	// older than 3 intervals is ignored.
	ScrapeInterval time.Duration `yaml:"scrape_interval,omitempty"`
}

// GroupCapsOn reports group_caps, true when unset.
func (s *Scoring) GroupCapsOn() bool { return s.GroupCaps == nil || *s.GroupCaps }

// Push is one bound SUB socket for push-mode engines. Topics name the pod:
// llm-d's kv@<pod>@<model> works as is; other topics are mapped in Routes.
type Push struct {
	// Listen is the bind address, e.g. tcp://*:5557.
	Listen string `yaml:"listen,omitempty"`
	// Topic is the subscription prefix ("": every topic).
	Topic string `yaml:"topic,omitempty"`
	// Routes maps topics that do not follow kv@<pod>@<model>.
	Routes []Route `yaml:"routes,omitempty"`
	// MaxWorkers bounds the workers (pod, DP rank) the listener creates;
	// messages for more are refused and counted.
	MaxWorkers int `yaml:"max_workers,omitempty"`
	// Allow lists the IP addresses or CIDR ranges engines may connect from
	// (default: any); others are refused at the handshake and counted.
	Allow []string `yaml:"allow,omitempty"`
	// DPSize is the largest --data-parallel-size of the engines that
	// connect. vLLM offsets a connecting endpoint's port by the DP rank, so
	// the listener binds listen's port and the DPSize-1 after it, and a
	// message on port+r is rank r's; one whose data_parallel_rank disagrees
	// is refused (dp_rank_mismatch). With 1, the payload's rank decides, for
	// publishers that send every rank to one address (vLLM does not).
	DPSize int `yaml:"dp_size,omitempty"`
}

// Route maps one push-mode topic, matched exactly, to a pod.
type Route struct {
	// Topic is the engine's configured topic.
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
	// worker: reset (forget its blocks, relearn) or keep (keep them, flag
	// the worker UNSYNCED in every answer).
	GapPolicy string `yaml:"gap_policy,omitempty"`
	// ReplayTimeout bounds one replay.
	ReplayTimeout time.Duration `yaml:"replay_timeout,omitempty"`
	// ReplayConcurrency bounds replays in flight.
	ReplayConcurrency int `yaml:"replay_concurrency,omitempty"`
	// StaleAfterDisconnect marks a pull-mode worker stale after its
	// endpoint has been unreachable this long (negative: never).
	StaleAfterDisconnect time.Duration `yaml:"stale_after_disconnect,omitempty"`
	// StaleAfterSilence marks a worker stale after sending nothing this
	// long (0, the default: off, since idle engines send nothing).
	StaleAfterSilence time.Duration `yaml:"stale_after_silence,omitempty"`
	// QueueSize is each worker's queue of batches waiting to be applied.
	QueueSize int `yaml:"queue_size,omitempty"`
	// QueueBytes bounds the payload bytes of one worker's queued batches,
	// and separately of the live batches held while a replay runs; past it
	// messages are dropped, counted and recovered as gaps.
	QueueBytes int64 `yaml:"queue_bytes,omitempty"`
	// MaxMessageBytes is the largest event message accepted (the default is
	// twice vLLM's largest real batch, a 1 M-token prompt prefilled in one
	// step); a larger one ends the connection, re-established, and its loss
	// is handled as a gap.
	MaxMessageBytes int64 `yaml:"max_message_bytes,omitempty"`
}

// Score tunes answers.
type Score struct {
	// IncludeStale keeps stale workers in Score answers (flagged STALE);
	// by default they are left out unless named as candidates.
	IncludeStale bool `yaml:"include_stale,omitempty"`
}

// Limits bound requests; RESOURCE_EXHAUSTED refuses what is over them.
type Limits struct {
	// MaxTokens is the most token ids one request may carry.
	MaxTokens int `yaml:"max_tokens,omitempty"`
	// MaxBlockKeys is the most block keys one request may carry.
	MaxBlockKeys int `yaml:"max_block_keys,omitempty"`
	// MaxCandidates is the most candidate workers one request may name.
	MaxCandidates int `yaml:"max_candidates,omitempty"`
	// MaxInflight is the most routed requests tracked at once; Route
	// refuses more until some are released or expire.
	MaxInflight int `yaml:"max_inflight,omitempty"`
	// MaxPending bounds Score and Route calls received and not finished,
	// refused before their body is read: a burst's memory is about
	// max_pending x 9 bytes x max_tokens.
	MaxPending int `yaml:"max_pending,omitempty"`
	// MaxWatches bounds concurrent Watch streams (default 64).
	MaxWatches int `yaml:"max_watches,omitempty"`
	// MaxTenants bounds the tenant labels of the predicted hit-ratio
	// metrics (default 64); later tenants share "_other".
	MaxTenants int `yaml:"max_tenants,omitempty"`
	// MaxConcurrent bounds Score and Route calls executing at once
	// (default 8 per core).
	MaxConcurrent int `yaml:"max_concurrent,omitempty"`
	// QueueTarget is the queueing delay admission control keeps calls
	// under: a standing queue longer than it lowers the calls taken on.
	QueueTarget time.Duration `yaml:"queue_target,omitempty"`
	// MaxQueueDelay refuses a call that queued longer before it could run.
	MaxQueueDelay time.Duration `yaml:"max_queue_delay,omitempty"`
	// MaxConnections bounds open gRPC connections; more wait in the listen
	// backlog.
	MaxConnections int `yaml:"max_connections,omitempty"`
	// MaxInspect bounds Lookup, Dump and Diagnose calls executing at once,
	// a budget apart from Score's so that they cannot starve it (default
	// half the cores, at least 1).
	MaxInspect int `yaml:"max_inspect,omitempty"`
	// MaxInspectPending bounds inspection calls waiting for a max_inspect
	// slot; more are refused before their body is read.
	MaxInspectPending int `yaml:"max_inspect_pending,omitempty"`
	// InspectWait is the longest an inspection call waits for a slot.
	InspectWait time.Duration `yaml:"inspect_wait,omitempty"`
	// AdmissionOff turns admission control off (not recommended).
	AdmissionOff bool `yaml:"admission_off,omitempty"`
}

// Log sets up log/slog.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level,omitempty"`
	// Format is text or json.
	Format string `yaml:"format,omitempty"`
	// ProblemInterval rate-limits repeated per-worker problem logs.
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

// FindPod returns the pod of pods[] named name, nil if none is.
func (c *Config) FindPod(name string) *Pod {
	for i := range c.Pods {
		if c.Pods[i].Name == name {
			return &c.Pods[i]
		}
	}
	return nil
}

func (c *Config) model(name string) *Model {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i]
		}
	}
	return nil
}

// CostModel is the scoring.cost_model section, the fields of
// scoring.CostModel; zero fields take scoring.DefaultCostModel's.
type CostModel struct {
	PrefillTokensPerSec   float64       `yaml:"prefill_tokens_per_sec,omitempty"`
	AttentionPairsPerSec  float64       `yaml:"attention_pairs_per_sec,omitempty"`
	StepOverhead          time.Duration `yaml:"step_overhead,omitempty"`
	DecodePerSeq          time.Duration `yaml:"decode_per_seq,omitempty"`
	DecodePerContextToken time.Duration `yaml:"decode_per_context_token,omitempty"`
	MaxBatchedTokens      int           `yaml:"max_batched_tokens,omitempty"`
	MaxNumSeqs            int           `yaml:"max_num_seqs,omitempty"`
	KVCapacityTokens      int           `yaml:"kv_capacity_tokens,omitempty"`
}

func (m CostModel) model() scoring.CostModel {
	c := scoring.DefaultCostModel()
	override(&c.PrefillTokensPerSec, m.PrefillTokensPerSec)
	override(&c.AttentionPairsPerSec, m.AttentionPairsPerSec)
	override(&c.StepOverhead, m.StepOverhead)
	override(&c.DecodePerSeq, m.DecodePerSeq)
	override(&c.DecodePerContextToken, m.DecodePerContextToken)
	override(&c.MaxBatchedTokens, m.MaxBatchedTokens)
	override(&c.MaxNumSeqs, m.MaxNumSeqs)
	override(&c.KVCapacityTokens, m.KVCapacityTokens)
	return c
}

// override stores x in *v unless x is zero.
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

// Tiers is the medium table scoring.tier_names and unknown_tier make; nil
// when they add nothing to the built-in table.
func (c *Config) Tiers() (*events.Tiers, error) {
	return c.Scoring.tiers()
}

// tiers builds Tiers, or returns an error naming the bad entry.
func (s *Scoring) tiers() (*events.Tiers, error) {
	const want = "(want gpu, cpu, storage, disk, external or other)"
	unknown := events.MediumOther
	if s.UnknownTier != "" {
		m, ok := events.ParseMediumClass(s.UnknownTier)
		if !ok {
			return nil, fmt.Errorf("unknown_tier: %q is no tier %s", s.UnknownTier, want)
		}
		unknown = m
	}
	names := make(map[string]events.Medium, len(s.TierNames))
	upper := make(map[string]string, len(s.TierNames))
	for _, name := range slices.Sorted(maps.Keys(s.TierNames)) {
		if strings.TrimSpace(name) == "" {
			return nil, errors.New("tier_names: a medium name is empty")
		}
		if prev, ok := upper[strings.ToUpper(name)]; ok {
			return nil, fmt.Errorf("tier_names: %q and %q name the same medium (names ignore case)", prev, name)
		}
		upper[strings.ToUpper(name)] = name
		m, ok := events.ParseMediumClass(s.TierNames[name])
		if !ok {
			return nil, fmt.Errorf("tier_names.%s: %q is no tier %s", name, s.TierNames[name], want)
		}
		names[name] = m
	}
	if len(names) == 0 && unknown == events.MediumOther {
		return nil, nil
	}
	return events.NewTiers(names, unknown), nil
}

// policy is scoring.DefaultPolicy with the section's non-zero fields.
func (s *Scoring) policy() (scoring.Policy, error) {
	p, err := scoring.Override{
		Name: s.Policy, GPUWeight: s.GPUWeight, CPUWeight: s.CPUWeight, StorageWeight: s.StorageWeight,
		TierWeights: s.TierWeights, LoadWeight: s.LoadWeight, Guard: s.Guard, StaticK: s.StaticK,
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

// WorkerEndpoint is one worker (pod, DP rank) and where its events come
// from: the pod's fields at this rank's ports.
type WorkerEndpoint struct {
	Worker         events.WorkerRef
	Model          string
	Endpoint       string
	Topic          string
	ReplayEndpoint string // "" for none
	CapacityBlocks int    // 0: the index default
}
