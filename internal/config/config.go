// Package config loads and checks the kvindex daemon's YAML configuration.
//
// It only turns text into a validated Config; nothing here opens sockets.
package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/events"
)

// ErrInvalid reports a configuration that cannot run; it is wrapped with
// the field at fault.
var ErrInvalid = errors.New("config: invalid")

// DefaultBlockSize is vLLM's default tokens per KV block.
const DefaultBlockSize = 16

// Config is the daemon's configuration.
type Config struct {
	// GRPCListen is the gRPC listen address (default ":50051").
	GRPCListen string `yaml:"grpc_listen"`
	// MetricsListen is the Prometheus /metrics listen address (default
	// ":9400"); "off" disables it.
	MetricsListen string `yaml:"metrics_listen"`
	// Models lists model namespaces and their block sizes. Models that pods
	// name but that are not listed get DefaultBlockSize.
	Models []Model `yaml:"models"`
	// Pods are the vLLM engines to subscribe to.
	Pods []Pod `yaml:"pods"`
	// Limits bound what one Score request may ask.
	Limits Limits `yaml:"limits"`
	// Log sets up logging.
	Log Log `yaml:"log"`
}

// Model is one served model.
type Model struct {
	// Name is the model name requests use (vLLM's served model name).
	Name string `yaml:"name"`
	// BlockSize is vLLM's --block-size for this model (default 16).
	BlockSize int `yaml:"block_size"`
}

// Pod is one vLLM engine (all its data-parallel ranks).
type Pod struct {
	// Name identifies the pod in answers and metrics.
	Name string `yaml:"name"`
	// Model is the model the pod serves.
	Model string `yaml:"model"`
	// Endpoint is the pod's KV event PUB endpoint for DP rank 0, e.g.
	// tcp://10.0.0.5:5557; rank r publishes on port+r.
	Endpoint string `yaml:"endpoint"`
	// DPSize is the pod's data-parallel size (default 1).
	DPSize int `yaml:"dp_size"`
	// Topic is the subscription prefix (default "", every topic).
	Topic string `yaml:"topic"`
}

// Limits bound Score requests.
type Limits struct {
	// MaxTokens is the most token ids one request may carry (default 1,048,576).
	MaxTokens int `yaml:"max_tokens"`
	// MaxBlockKeys is the most block keys one request may carry (default 65,536).
	MaxBlockKeys int `yaml:"max_block_keys"`
	// MaxCandidates is the most candidate workers one request may name (default 4,096).
	MaxCandidates int `yaml:"max_candidates"`
}

// Log sets up log/slog.
type Log struct {
	// Level is debug, info, warn or error (default info).
	Level string `yaml:"level"`
	// Format is text or json (default text).
	Format string `yaml:"format"`
	// ProblemInterval rate-limits repeated per-worker problem logs (default 1m).
	ProblemInterval time.Duration `yaml:"problem_interval"`
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

// Parse decodes YAML (unknown fields are errors), applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) applyDefaults() {
	if c.GRPCListen == "" {
		c.GRPCListen = ":50051"
	}
	if c.MetricsListen == "" {
		c.MetricsListen = ":9400"
	}
	if c.Limits.MaxTokens == 0 {
		c.Limits.MaxTokens = 1 << 20
	}
	if c.Limits.MaxBlockKeys == 0 {
		c.Limits.MaxBlockKeys = 1 << 16
	}
	if c.Limits.MaxCandidates == 0 {
		c.Limits.MaxCandidates = 4096
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.Log.ProblemInterval == 0 {
		c.Log.ProblemInterval = time.Minute
	}
	for i := range c.Models {
		if c.Models[i].BlockSize == 0 {
			c.Models[i].BlockSize = DefaultBlockSize
		}
	}
	for i := range c.Pods {
		if c.Pods[i].DPSize == 0 {
			c.Pods[i].DPSize = 1
		}
	}
	// Models named only by pods get the default block size.
	for _, p := range c.Pods {
		if p.Model != "" && c.model(p.Model) == nil {
			c.Models = append(c.Models, Model{Name: p.Model, BlockSize: DefaultBlockSize})
		}
	}
}

func (c *Config) model(name string) *Model {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i]
		}
	}
	return nil
}

// Validate reports the first problem, naming the field.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
	}
	if _, _, err := net.SplitHostPort(c.GRPCListen); err != nil {
		return bad("grpc_listen", "%q is not host:port", c.GRPCListen)
	}
	if c.MetricsListen != "off" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return bad("metrics_listen", "%q is not host:port or off", c.MetricsListen)
		}
	}
	if c.Limits.MaxTokens < 0 || c.Limits.MaxBlockKeys < 0 || c.Limits.MaxCandidates < 0 {
		return bad("limits", "limits must not be negative")
	}
	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		return bad("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return bad("log.format", "%q is not text or json", c.Log.Format)
	}
	seenModel := map[string]bool{}
	for i, m := range c.Models {
		f := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			return bad(f+".name", "required")
		}
		if seenModel[m.Name] {
			return bad(f+".name", "model %q listed twice", m.Name)
		}
		seenModel[m.Name] = true
		if m.BlockSize <= 0 {
			return bad(f+".block_size", "%d must be positive", m.BlockSize)
		}
	}
	seenPod := map[string]bool{}
	seenEndpoint := map[string]string{}
	for i, p := range c.Pods {
		f := fmt.Sprintf("pods[%d]", i)
		if p.Name == "" {
			return bad(f+".name", "required")
		}
		if seenPod[p.Name] {
			return bad(f+".name", "pod %q listed twice", p.Name)
		}
		seenPod[p.Name] = true
		if p.Model == "" {
			return bad(f+".model", "required")
		}
		if p.DPSize < 1 || p.DPSize > 1024 {
			return bad(f+".dp_size", "%d must be between 1 and 1024", p.DPSize)
		}
		if err := checkEndpoint(p.Endpoint); err != nil {
			return bad(f+".endpoint", "%v", err)
		}
		for r := 0; r < p.DPSize; r++ {
			ep, err := RankEndpoint(p.Endpoint, r)
			if err != nil {
				return bad(f+".endpoint", "%v", err)
			}
			if other, dup := seenEndpoint[ep]; dup {
				return bad(f+".endpoint", "%s (rank %d) is also used by %s", ep, r, other)
			}
			seenEndpoint[ep] = fmt.Sprintf("pod %s", p.Name)
		}
	}
	return nil
}

// checkEndpoint accepts tcp://host:port, ipc://path and inproc://name.
func checkEndpoint(ep string) error {
	switch {
	case ep == "":
		return errors.New("required")
	case strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://"):
		return nil
	case strings.HasPrefix(ep, "tcp://"):
		_, port, err := net.SplitHostPort(ep[len("tcp://"):])
		if err != nil {
			return fmt.Errorf("%q is not tcp://host:port", ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return fmt.Errorf("%q: bad port %q", ep, port)
		}
		return nil
	}
	return fmt.Errorf("%q: want tcp://host:port, ipc://path or inproc://name", ep)
}

// RankEndpoint returns the endpoint DP rank r of a pod publishes on, the way
// vLLM offsets it: tcp port + r, and "_dp<r>" appended to ipc:// and
// inproc:// paths (rank 0 keeps the endpoint as is).
func RankEndpoint(endpoint string, r int) (string, error) {
	if r == 0 {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		return endpoint + "_dp" + strconv.Itoa(r), nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if i < 0 {
		return "", fmt.Errorf("endpoint %q has no port", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port <= 0 || port+r > 65535 {
		return "", fmt.Errorf("endpoint %q: port %q cannot be offset by rank %d", endpoint, endpoint[i+1:], r)
	}
	return endpoint[:i+1] + strconv.Itoa(port+r), nil
}

// Workers expands the pods into one endpoint per (pod, DP rank), in config order.
func (c *Config) Workers() []WorkerEndpoint {
	var out []WorkerEndpoint
	for _, p := range c.Pods {
		for r := 0; r < p.DPSize; r++ {
			ep, _ := RankEndpoint(p.Endpoint, r) // checked by Validate
			out = append(out, WorkerEndpoint{
				Worker:   events.WorkerRef{Pod: p.Name, DPRank: r},
				Model:    p.Model,
				Endpoint: ep,
				Topic:    p.Topic,
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
}

// DefaultYAML is the embedded default configuration `kvindex serve` runs
// without --config: one local engine on tcp://127.0.0.1:5557.
//
//go:embed default.yaml
var DefaultYAML []byte
