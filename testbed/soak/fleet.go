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

// Names the soak's fleet uses.
const (
	// ModelA and ModelB are the served models (16- and 32-token blocks).
	ModelA = "soak/model-a"
	ModelB = "soak/model-b"
	// GarbageModel is the model of the pods the garbage sender invents.
	GarbageModel = "soak/garbage"
	// PushPod is the legitimate push-mode pod, on the allowlisted
	// listener, through PushTopic's route.
	PushPod   = "push-a"
	PushTopic = "soak-push-engine"
	// PushSource is the address the legitimate push engine connects
	// from, the only one the allowlisted listener accepts.
	PushSource = "127.0.0.2"
	// OpenMaxWorkers and AllowMaxWorkers are the listeners' max_workers.
	OpenMaxWorkers  = 4
	AllowMaxWorkers = 2
	// MaxMessageBytes is the daemon's events.max_message_bytes.
	MaxMessageBytes = 1 << 20
	// InflightTTL is the daemon's scoring.inflight_ttl: unreleased routes
	// expire several times in a run.
	InflightTTL = 10 * time.Second
)

// PodSpec is one pull-mode pod of the fleet.
type PodSpec struct {
	// Name, Model and DPSize are as in the configuration.
	Name   string
	Model  string
	DPSize int
	// Capacity is each rank's cache size; ConfigureCapacity gives it to
	// the daemon as capacity_blocks (otherwise the daemon learns it).
	Capacity          int
	ConfigureCapacity bool
	// Encoding and ReplayFrames are the vLLM release the pod imitates.
	Encoding     events.EncodeOptions
	ReplayFrames int
	// PubBase and ReplayBase are rank 0's ports; the ports just below and
	// just above each range are its neighbours, where garbage publishers
	// bind (the daemon must never read them).
	PubBase, ReplayBase int
}

// Fleet is the soak's topology: the daemon's gRPC and metrics ports, its
// two push listeners' ports (OpenPush, garbage only, and AllowPush, for
// PushPod), PushPod's replay port and cache size, and the pull pods.
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

// NewFleet picks free loopback ports below Linux's ephemeral range
// (32768 up), so that no outgoing connection takes a daemon's port while
// it restarts, and lays out four pull pods (one with dp_size 2, two
// models, four payload forms) and one push pod.
func NewFleet() (*Fleet, error) {
	rng, used := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)), map[int]bool{}
	// take returns the first of n consecutive free ports in [20000, 32000).
	take := func(n int) (int, error) {
		for try := 0; try < 200; try++ {
			base, ok := 20000+rng.IntN(12000-n), true
			for p := base; p < base+n && ok; p++ {
				ok = !used[p] && portFree(p)
			}
			if ok {
				for p := base; p < base+n; p++ {
					used[p] = true
				}
				return base, nil
			}
		}
		return 0, fmt.Errorf("soak: no %d consecutive free loopback ports in [20000, 32000)", n)
	}
	f := &Fleet{PushCapacity: 1024}
	var err error
	for _, p := range []*int{&f.GRPCPort, &f.MetricsPort, &f.OpenPush, &f.AllowPush, &f.PushReplay} {
		if *p, err = take(1); err != nil {
			return nil, err
		}
	}
	f.Pods = []PodSpec{
		{Name: "pod-a", Model: ModelA, DPSize: 1, Capacity: 1024, ConfigureCapacity: true, Encoding: events.EncodeOptions{Encoding: events.EncodingMap}, ReplayFrames: 4},
		{Name: "pod-b", Model: ModelA, DPSize: 2, Capacity: 1024, Encoding: events.EncodeOptions{Encoding: events.EncodingArray, HashForm: events.HashBin32}, ReplayFrames: 3},
		{Name: "pod-c", Model: ModelB, DPSize: 1, Capacity: 512, ConfigureCapacity: true, Encoding: events.EncodeOptions{Encoding: events.EncodingArray, HashForm: events.HashInt64}, ReplayFrames: 4},
		{Name: "pod-d", Model: ModelB, DPSize: 1, Capacity: 512, Encoding: events.EncodeOptions{Encoding: events.EncodingMap, Envelope: events.EnvelopeMap}, ReplayFrames: 4},
	}
	for i := range f.Pods {
		p := &f.Pods[i]
		// dp_size ports plus a neighbour on each side.
		if p.PubBase, err = take(p.DPSize + 2); err != nil {
			return nil, err
		}
		if p.ReplayBase, err = take(p.DPSize + 2); err != nil {
			return nil, err
		}
		p.PubBase++
		p.ReplayBase++
	}
	return f, nil
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
