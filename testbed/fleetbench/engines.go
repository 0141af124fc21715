package fleetbench

import (
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// engine is one simulated vLLM worker: a workload played through an
// enginepub.Publisher, each batch stamped when it is sent, as vLLM does.
type engine struct {
	enginePort
	w        *Workload
	f        Filler
	pub      *enginepub.Publisher
	pos, lap int
	lastSeq  uint64
}

// startEngines starts n engines of shape (seeds seed, seed+1, ...) on
// free loopback ports.
func startEngines(n int, shape Shape, seed uint64) ([]*engine, error) {
	base, err := netutil.FreePorts(2 * n)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: %w", err)
	}
	var es []*engine
	for i := range n {
		w, err := NewWorkload(shape, seed+uint64(i))
		if err != nil {
			closeEngines(es)
			return nil, err
		}
		e := &engine{w: w, enginePort: enginePort{Pod: podName(i), BlockSize: shape.BlockSize,
			Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+2*i), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", base+2*i+1)}}
		if e.pub, err = enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: e.Endpoint, Bind: true, ReplayEndpoint: e.Replay}); err != nil {
			closeEngines(es)
			return nil, fmt.Errorf("fleetbench: engine %s: %w", e.Pod, err)
		}
		es = append(es, e)
	}
	return es, nil
}

func closeEngines(es []*engine) {
	for _, e := range es {
		_ = e.pub.Close()
	}
}

// enginePort is what an agent or a forwarder needs to reach an engine.
type enginePort struct {
	Pod       string `json:"pod"`
	Endpoint  string `json:"endpoint"`
	Replay    string `json:"replay"`
	BlockSize int    `json:"block_size"`
}

func ports(es []*engine) []enginePort {
	ps := make([]enginePort, len(es))
	for i, e := range es {
		ps[i] = e.enginePort
	}
	return ps
}

// send publishes the engine's next batch, stamped now, and returns the
// new blocks it stores.
func (e *engine) send() (int, error) {
	b := e.f.Fill(e.w, e.pos, e.lap, float64(time.Now().UnixNano())/1e9)
	seq, err := e.pub.Publish(b)
	if err != nil {
		return 0, fmt.Errorf("fleetbench: engine %s: %w", e.Pod, err)
	}
	e.lastSeq = seq
	blocks := e.w.Stored[e.pos]
	if e.pos++; e.pos == e.w.Len() {
		e.pos, e.lap = 0, e.lap+1
	}
	return blocks, nil
}

// playEngines sends count batches of the engines in turn, paced open loop
// at rate new blocks a second, and returns the blocks sent.
func playEngines(ctx context.Context, es []*engine, count int, rate float64) (int64, error) {
	var blocks int64
	t0 := time.Now()
	for k := 0; k < count; k++ {
		if ahead := time.Duration(float64(blocks)/rate*1e9) - time.Since(t0); ahead > 0 {
			if err := sleep(ctx, ahead); err != nil {
				return blocks, err
			}
		}
		n, err := es[k%len(es)].send()
		if err != nil {
			return blocks, err
		}
		blocks += int64(n)
	}
	return blocks, nil
}

// waitSubscribed waits until every engine has n subscribers.
func waitSubscribed(ctx context.Context, es []*engine, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, e := range es {
		if err := e.pub.WaitForSubscribers(ctx, n); err != nil {
			return fmt.Errorf("fleetbench: engine %s: %w", e.Pod, err)
		}
	}
	return nil
}

// agentConfig is the kvindex agent configuration of p's pod.
func (p enginePort) agentConfig(url string) (*config.Config, error) {
	cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
		Models: []config.Model{{Name: benchModel, BlockSize: p.BlockSize}}, Pods: []config.Pod{{Name: p.Pod, Model: benchModel, Endpoint: p.Endpoint, ReplayEndpoint: p.Replay, DPSize: 1}}}
	cfg.NATS = config.NATS{URL: url}
	cfg.Agent.Pod = p.Pod
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleetbench: agent configuration of %s: %w", p.Pod, err)
	}
	return cfg, nil
}

// blocksPerBatch is a workload's mean new blocks per batch.
func blocksPerBatch(w *Workload) float64 {
	n := 0
	for _, b := range w.Stored {
		n += b
	}
	return float64(n) / float64(len(w.Stored))
}
