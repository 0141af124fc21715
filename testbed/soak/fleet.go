package soak

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
)

// Names and settings of the soak's fleet: the served models (16- and
// 32-token blocks), the model of the pods the garbage sender invents, the
// legitimate push pod (on the allowlisted listener, through PushTopic's
// route, connecting from PushSource, the only address that listener
// accepts), the listeners' max_workers, and the daemon's
// events.max_message_bytes and scoring.inflight_ttl (unreleased routes
// expire several times in a run).
const (
	ModelA          = "soak/model-a"
	ModelB          = "soak/model-b"
	GarbageModel    = "soak/garbage"
	PushPod         = "push-a"
	PushTopic       = "soak-push-engine"
	PushSource      = "127.0.0.2"
	OpenMaxWorkers  = 4
	AllowMaxWorkers = 2
	MaxMessageBytes = 1 << 20
	InflightTTL     = 10 * time.Second
)

// PodSpec is one pull-mode pod of the fleet. Capacity is each rank's cache
// size, given to the daemon as capacity_blocks with ConfigureCapacity
// (otherwise the daemon learns it); Encoding and ReplayFrames are the vLLM
// release the pod imitates. PubBase and ReplayBase are rank 0's ports;
// the ports just below and just above each range are its neighbours,
// where garbage publishers bind (the daemon must never read them).
type PodSpec struct {
	Name                string
	Model               string
	DPSize              int
	Capacity            int
	ConfigureCapacity   bool
	Encoding            events.EncodeOptions
	ReplayFrames        int
	PubBase, ReplayBase int
}

// Fleet is the soak's topology: the daemon's ports, its two push
// listeners' (OpenPush, garbage only, and AllowPush, for PushPod),
// PushPod's replay port and cache size, and the pull pods.
type Fleet struct {
	GRPCPort, MetricsPort int
	OpenPush, AllowPush   int
	PushReplay            int
	PushCapacity          int
	Pods                  []PodSpec
}

// BlockSizeOf returns a fleet model's block size.
func BlockSizeOf(model string) int {
	if model == ModelB {
		return 32
	}
	return 16
}

// NewFleet takes consecutive free loopback ports below Linux's ephemeral
// range (32768 up), so that no outgoing connection takes a daemon's port
// while it restarts, and lays out four pull pods (one with dp_size 2, two
// models, four payload forms) and one push pod.
func NewFleet() (*Fleet, error) {
	f := &Fleet{PushCapacity: 1024}
	f.Pods = []PodSpec{
		{Name: "pod-a", Model: ModelA, DPSize: 1, Capacity: 1024, ConfigureCapacity: true, Encoding: events.EncodeOptions{Encoding: events.EncodingMap}, ReplayFrames: 4},
		{Name: "pod-b", Model: ModelA, DPSize: 2, Capacity: 1024, Encoding: events.EncodeOptions{Encoding: events.EncodingArray, HashForm: events.HashBin32}, ReplayFrames: 3},
		{Name: "pod-c", Model: ModelB, DPSize: 1, Capacity: 512, ConfigureCapacity: true, Encoding: events.EncodeOptions{Encoding: events.EncodingArray, HashForm: events.HashInt64}, ReplayFrames: 4},
		{Name: "pod-d", Model: ModelB, DPSize: 1, Capacity: 512, Encoding: events.EncodeOptions{Encoding: events.EncodingMap, Envelope: events.EnvelopeMap}, ReplayFrames: 4},
	}
	n := 5
	for _, p := range f.Pods {
		n += 2 * (p.DPSize + 2) // dp_size ports plus a neighbour on each side, twice
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for range 200 {
		base, ok := 20000+rng.IntN(12000-n), true
		for p := base; p < base+n && ok; p++ {
			ok = portFree(p)
		}
		if !ok {
			continue
		}
		for _, p := range []*int{&f.GRPCPort, &f.MetricsPort, &f.OpenPush, &f.AllowPush, &f.PushReplay} {
			*p, base = base, base+1
		}
		for i := range f.Pods {
			p := &f.Pods[i]
			p.PubBase, p.ReplayBase = base+1, base+p.DPSize+3
			base += 2 * (p.DPSize + 2)
		}
		return f, nil
	}
	return nil, fmt.Errorf("soak: no %d consecutive free loopback ports in [20000, 32000)", n)
}

// Workers returns every legitimate worker by model.
func (f *Fleet) Workers() map[string][]events.WorkerRef {
	out := map[string][]events.WorkerRef{}
	for _, e := range f.Engines() {
		out[e.Model] = append(out[e.Model], e.Worker)
	}
	return out
}

// Engines returns the spec of every simulated engine.
func (f *Fleet) Engines() []EngineSpec {
	var out []EngineSpec
	for _, p := range f.Pods {
		for r := 0; r < p.DPSize; r++ {
			out = append(out, EngineSpec{
				Worker:         events.WorkerRef{Pod: p.Name, DPRank: r},
				Model:          p.Model,
				Endpoint:       tcp(p.PubBase + r),
				Topic:          "kv@" + p.Name + "@" + p.Model,
				ReplayEndpoint: tcp(p.ReplayBase + r),
				ReplayFrames:   p.ReplayFrames,
				Encoding:       p.Encoding,
				Capacity:       p.Capacity,
			})
		}
	}
	out = append(out, EngineSpec{
		Worker: events.WorkerRef{Pod: PushPod},
		Model:  ModelA,
		// libzmq's "source;destination" form: connect from PushSource.
		Endpoint:       "tcp://" + PushSource + ":0;127.0.0.1:" + strconv.Itoa(f.AllowPush),
		Push:           true,
		Topic:          PushTopic,
		ReplayEndpoint: tcp(f.PushReplay),
		ReplayFrames:   4,
		Encoding:       events.EncodeOptions{Encoding: events.EncodingMap},
		Capacity:       f.PushCapacity,
	})
	return out
}

// Config returns the daemon's configuration for the fleet, as a user
// would write it (defaults left out).
func (f *Fleet) Config() *config.Config {
	c := &config.Config{
		GRPCListen:    "127.0.0.1:" + strconv.Itoa(f.GRPCPort),
		MetricsListen: "127.0.0.1:" + strconv.Itoa(f.MetricsPort),
		Models:        []config.Model{{Name: ModelA, BlockSize: 16}, {Name: ModelB, BlockSize: 32}},
		Push: []config.Push{
			{Listen: f.OpenPushAddr(), MaxWorkers: OpenMaxWorkers},
			{
				Listen:     f.AllowPushAddr(),
				MaxWorkers: AllowMaxWorkers,
				Allow:      []string{PushSource + "/32"},
				Routes:     []config.Route{{Topic: PushTopic, Pod: PushPod, Model: ModelA, ReplayEndpoint: tcp(f.PushReplay)}},
			},
		},
		Events:  config.Events{MaxMessageBytes: MaxMessageBytes},
		Scoring: config.Scoring{InflightTTL: InflightTTL},
		Log:     config.Log{Level: "info", Format: "json"},
	}
	for _, p := range f.Pods {
		pc := config.Pod{
			Name:           p.Name,
			Model:          p.Model,
			Endpoint:       tcp(p.PubBase),
			DPSize:         p.DPSize,
			ReplayEndpoint: tcp(p.ReplayBase),
		}
		if p.ConfigureCapacity {
			pc.CapacityBlocks = p.Capacity
		}
		c.Pods = append(c.Pods, pc)
	}
	return c
}

// YAML returns the configuration file's text, after checking that the
// daemon would accept it.
func (f *Fleet) YAML() ([]byte, error) {
	text, err := config.Marshal(f.Config())
	if err != nil {
		return nil, err
	}
	if _, err := config.Parse(text); err != nil {
		return nil, fmt.Errorf("soak: generated configuration: %w\n%s", err, text)
	}
	return text, nil
}

// OpenPushAddr is the open push listener's endpoint.
func (f *Fleet) OpenPushAddr() string { return tcp(f.OpenPush) }

// AllowPushAddr is the allowlisted push listener's endpoint.
func (f *Fleet) AllowPushAddr() string { return tcp(f.AllowPush) }

// GRPCAddr is the daemon's gRPC host:port.
func (f *Fleet) GRPCAddr() string { return "127.0.0.1:" + strconv.Itoa(f.GRPCPort) }

// MetricsAddr is the daemon's /metrics host:port.
func (f *Fleet) MetricsAddr() string { return "127.0.0.1:" + strconv.Itoa(f.MetricsPort) }

// Neighbours returns the endpoints next to every pull pod's event and
// replay port ranges.
func (f *Fleet) Neighbours() (pub, replay []string) {
	for _, p := range f.Pods {
		pub = append(pub, tcp(p.PubBase-1), tcp(p.PubBase+p.DPSize))
		replay = append(replay, tcp(p.ReplayBase-1), tcp(p.ReplayBase+p.DPSize))
	}
	return pub, replay
}

func tcp(port int) string { return "tcp://127.0.0.1:" + strconv.Itoa(port) }

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
