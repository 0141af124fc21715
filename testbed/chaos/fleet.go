package chaos

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/config"
)

// The fleet's fixed settings. Detection is fast so that the bound on an
// undetected outage (Bounds.Detect) is a few seconds: registrations live
// registrationTTL (heartbeat every quarter, a replica flags a worker
// STALE at half), an agent flags an engine silent or disconnected for
// staleAfter, and every process's link to NATS is one proxied path.
const (
	Model           = "chaos/model"
	BlockSize       = 16
	Capacity        = 512 // physical blocks per engine
	bufferSteps     = 400 // vLLM's buffer_steps: 20 s of steps
	registrationTTL = 3 * time.Second
	staleAfter      = 1500 * time.Millisecond
	checkpointEvery = 2 * time.Second
)

// PodName is engine i's pod.
func PodName(i int) string { return fmt.Sprintf("pod-%d", i) }

// Layout is where one run's fleet listens: nats-server (clients, HTTP
// monitoring), each engine's sockets and the links its agent reaches them
// through, each agent's and replica's link to NATS, gRPC and /metrics.
type Layout struct {
	Shape
	Dir                   string
	NATSPort, NATSMonitor int
	Engines               []EnginePorts
	Agents, Replicas      []ProcPorts
}

// EnginePorts are an engine's PUB and replay ports and its links'.
type EnginePorts struct{ Pub, Replay, PubLink, ReplayLink int }

// ProcPorts are an agent's or replica's link to NATS, gRPC and /metrics.
type ProcPorts struct{ NATSLink, GRPC, Metrics int }

// NewLayout takes consecutive free loopback ports below Linux's
// ephemeral range (32768 up), so that no outgoing connection takes a
// port a process or link binds again after a restart.
func NewLayout(shape Shape, dir string) (*Layout, error) {
	n := 2 + 4*shape.Engines + 3*shape.Engines + 3*shape.Replicas
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	for range 200 {
		base, ok := 20000+rng.IntN(12000-n), true
		for p := base; p < base+n && ok; p++ {
			ok = portFree(p)
		}
		if !ok {
			continue
		}
		next := func() int { base++; return base - 1 }
		l := &Layout{Shape: shape, Dir: dir, NATSPort: next(), NATSMonitor: next()}
		for range shape.Engines {
			l.Engines = append(l.Engines, EnginePorts{next(), next(), next(), next()})
			l.Agents = append(l.Agents, ProcPorts{next(), next(), next()})
		}
		for range shape.Replicas {
			l.Replicas = append(l.Replicas, ProcPorts{next(), next(), next()})
		}
		return l, nil
	}
	return nil, fmt.Errorf("chaos: no %d consecutive free loopback ports in [20000, 32000)", n)
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func hostPort(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// Checkpoint is agent i's checkpoint file.
func (l *Layout) Checkpoint(i int) string {
	return filepath.Join(l.Dir, fmt.Sprintf("agent-%d.checkpoint", i))
}

// AgentConfig is agent i's configuration: its pod's engine reached
// through the engine's links, NATS through its own link.
func (l *Layout) AgentConfig(i int) *config.Config {
	e, a := l.Engines[i], l.Agents[i]
	return &config.Config{
		MetricsListen: hostPort(a.Metrics),
		Models:        []config.Model{{Name: Model, BlockSize: BlockSize}},
		Pods: []config.Pod{{Name: PodName(i), Model: Model, Endpoint: tcpAddr(e.PubLink), ReplayEndpoint: tcpAddr(e.ReplayLink),
			CapacityBlocks: Capacity}},
		NATS:   config.NATS{URL: "nats://" + hostPort(a.NATSLink), RegistrationTTL: registrationTTL},
		Agent:  config.Agent{Pod: PodName(i), Checkpoint: l.Checkpoint(i), CheckpointInterval: checkpointEvery, GRPCListen: hostPort(a.GRPC)},
		Events: config.Events{StaleAfterSilence: staleAfter, StaleAfterDisconnect: staleAfter},
		Log:    config.Log{Level: "info", Format: "json"},
	}
}

// ReplicaConfig is replica j's configuration: NATS through its link, the
// model named so that it answers before any agent registers.
func (l *Layout) ReplicaConfig(j int) *config.Config {
	r := l.Replicas[j]
	return &config.Config{
		GRPCListen:    hostPort(r.GRPC),
		MetricsListen: hostPort(r.Metrics),
		Models:        []config.Model{{Name: Model, BlockSize: BlockSize}},
		NATS:          config.NATS{URL: "nats://" + hostPort(r.NATSLink), RegistrationTTL: registrationTTL},
		Events:        config.Events{StaleAfterDisconnect: staleAfter},
		Log:           config.Log{Level: "info", Format: "json"},
	}
}

// writeConfig writes c as name in the run's directory, after checking
// that kvindex would accept it, and returns its path.
func (l *Layout) writeConfig(name string, c *config.Config) (string, error) {
	text, err := config.Marshal(c)
	if err != nil {
		return "", err
	}
	if _, err := config.Parse(text); err != nil {
		return "", fmt.Errorf("chaos: %s: %w\n%s", name, err, text)
	}
	path := filepath.Join(l.Dir, name)
	if err := os.WriteFile(path, text, 0o644); err != nil {
		return "", fmt.Errorf("chaos: write %s: %w", name, err)
	}
	return path, nil
}

// Bounds are what the checks allow, derived from the fleet's settings.
type Bounds struct {
	// Detect bounds how long an unflagged answer may credit a block its
	// engine dropped, when no measured lag explains it: the slower of the
	// two ways an outage is flagged (an agent's silent or lost engine, a
	// registration not refreshed), then the heartbeat that carries it,
	// two links' injected latency, the replicas' 100 ms health refresh
	// and a second and a half for a loaded host.
	Detect time.Duration
	// Converge bounds how long after the faults stop every replica and
	// agent takes to hold exactly its engine's cache: a resync's backoff
	// (doubling to 10 s), a registration's life and a snapshot.
	Converge time.Duration
	// RSS, RSSNATS and Goroutines cap every kvindex process and
	// nats-server at every sample; Leak is how many goroutines a process
	// may have gained from its first sample to its last.
	RSS, RSSNATS     int64
	Goroutines, Leak int
	// AgentBacklog and ReplicaBacklog cap the batches queued for a worker
	// (events.queue_size, the replicas' delta queue).
	AgentBacklog, ReplicaBacklog int
}

// DefaultBounds are the bounds for plan p.
func DefaultBounds(p Plan) Bounds {
	return Bounds{
		Detect:   max(staleAfter, registrationTTL/2) + registrationTTL/4 + 2*p.MaxLatency + 100*time.Millisecond + 1500*time.Millisecond,
		Converge: 10*time.Second + registrationTTL + 7*time.Second,
		RSS:      256 << 20, RSSNATS: 512 << 20, Goroutines: 1000, Leak: 40,
		AgentBacklog: config.DefaultQueueSize, ReplicaBacklog: 1 << 16,
	}
}
