package fleetbench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/indexer"
)

// WireCase is one measured stream of the wire benchmark.
type WireCase struct {
	// Name says which stream: "realistic" (DefaultShape), or "batch N"
	// (every batch N new GPU blocks in chains of up to 16, each request
	// continuing its chain half of the time, and N removals; no offload).
	Name string `json:"name"`
	// DeltaBytes and MixedPerBlock are the whole batches' deltas: payload
	// bytes per delta and per new block (removals, offloads and all).
	DeltaBytes    float64 `json:"delta_bytes"`
	MixedPerBlock float64 `json:"mixed_per_block"`
	// PerStore and PerRemove are the payload bytes per stored and per
	// removed block, from the same batches split into their stores
	// (offloads included) and their removals, one delta each, the
	// header's bytes shared out over the entries. WirePerStore and
	// WirePerRemove add NATS's framing of each message from the agent
	// ("PUB <subject> <size>\r\n" and "\r\n").
	PerStore      float64 `json:"per_store"`
	PerRemove     float64 `json:"per_remove"`
	WirePerStore  float64 `json:"wire_per_store"`
	WirePerRemove float64 `json:"wire_per_remove"`
	// Deltas are the deltas measured.
	Deltas int `json:"deltas"`
}

// WireResult is what the wire benchmark measured.
type WireResult struct {
	Subject string     `json:"subject"`
	Cases   []WireCase `json:"cases"`
}

// Wire measures the bytes a delta costs on NATS: batches of each case
// applied to an agent's index (ApplyBatchDelta, as kvindex agent does),
// published through natsbus.Agent.Publish (encodeDelta, the protobuf) into
// an embedded nats-server, and counted as a subscriber receives them.
func Wire(ctx context.Context) (*WireResult, error) {
	ns, err := startNATS()
	if err != nil {
		return nil, err
	}
	defer ns.close()
	res := &WireResult{}
	shapes := []struct {
		name  string
		shape Shape
	}{{"realistic", DefaultShape()}}
	for _, n := range []int{1, 16, 256} {
		per := min(n, 16)
		shapes = append(shapes, struct {
			name  string
			shape Shape
		}{fmt.Sprintf("batch %d", n), Shape{Ring: 256, Window: 128, Requests: n / per, MinBlocks: per, MaxBlocks: per, BlockSize: 16}})
	}
	for _, sc := range shapes {
		c, subject, err := wireCase(ctx, ns.url(), sc.name, sc.shape)
		if err != nil {
			return nil, err
		}
		res.Subject = subject
		res.Cases = append(res.Cases, *c)
	}
	return res, nil
}

// wireCase measures one stream: a lap to reach the steady state, then a
// lap of whole batches and a lap of split ones.
func wireCase(ctx context.Context, url, name string, shape Shape) (*WireCase, string, error) {
	w, err := NewWorkload(shape, 1)
	if err != nil {
		return nil, "", err
	}
	nc, err := connect(url, "kvfleetbench wire agent")
	if err != nil {
		return nil, "", err
	}
	defer nc.Close()
	sub, err := connect(url, "kvfleetbench wire subscriber")
	if err != nil {
		return nil, "", err
	}
	defer sub.Close()
	a, err := natsbus.NewAgent(ctx, nc, natsbus.AgentOptions{Model: benchModel, BlockSize: shape.BlockSize, KeyScheme: indexer.KeyScheme,
		Pod: podName(0), Version: "kvfleetbench"}, map[int]natsbus.LocalWorker{0: &fixedWorker{rec: &Recorded{}}})
	if err != nil {
		return nil, "", err
	}
	defer a.Close(ctx)
	subject := natsbus.DeltaSubject(benchModel, events.WorkerRef{Pod: podName(0)})
	s, err := sub.SubscribeSync(subject)
	if err != nil {
		return nil, "", fmt.Errorf("fleetbench: wire: %w", err)
	}
	if err := sub.Flush(); err != nil {
		return nil, "", fmt.Errorf("fleetbench: wire: %w", err)
	}
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, shape.BlockSize); err != nil {
		return nil, "", err
	}
	wk, err := ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(0)}, Model: benchModel})
	if err != nil {
		return nil, "", err
	}
	var f Filler
	var d indexer.Delta
	publish := func(b *events.Batch) (int, error) {
		err := a.Publish(0, 0, b.Timestamp, func(seq uint64, wire *events.Delta) error {
			d.Reset()
			d.Seq = seq
			err := wk.ApplyBatchDelta(b, &d)
			fleet.ToWire(&d, wire)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("fleetbench: wire: %w", err)
		}
		m, err := s.NextMsg(5 * time.Second)
		if err != nil {
			return 0, fmt.Errorf("fleetbench: wire: %w", err)
		}
		return len(m.Data), nil
	}
	for i := range w.Len() {
		if err := wk.ApplyBatch(f.Fill(w, i, 0, 0)); err != nil {
			return nil, "", fmt.Errorf("fleetbench: wire: warm-up: %w", err)
		}
	}
	c := &WireCase{Name: name}
	framing := func(size int) float64 {
		return float64(len("PUB ") + len(subject) + 1 + len(strconv.Itoa(size)) + 4)
	}
	var mixed, blocks int
	var stores, removes int
	var storeBytes, removeBytes, storeWire, removeWire float64
	for lap := 1; lap <= 2; lap++ {
		for i := range w.Len() {
			b := f.Fill(w, i, lap, 1)
			if lap == 1 {
				n, err := publish(b)
				if err != nil {
					return nil, "", err
				}
				mixed += n
				blocks += w.Stored[i]
				c.Deltas++
				continue
			}
			// The batch split in two, its removals first, as its events
			// come.
			all := b.Events
			var rm, st []events.Event
			for _, ev := range all {
				if ev.Kind == events.KindBlockRemoved {
					rm = append(rm, ev)
				} else {
					st = append(st, ev)
				}
			}
			for k, part := range [][]events.Event{rm, st} {
				if len(part) == 0 {
					continue
				}
				entries := 0
				for _, ev := range part {
					entries += len(ev.BlockHashes)
				}
				n, err := publish(&events.Batch{Timestamp: 1, Events: part, HasDPRank: true})
				if err != nil {
					return nil, "", err
				}
				if k == 0 {
					removes += entries
					removeBytes += float64(n)
					removeWire += float64(n) + framing(n)
				} else {
					stores += entries
					storeBytes += float64(n)
					storeWire += float64(n) + framing(n)
				}
				c.Deltas++
			}
		}
	}
	c.DeltaBytes = float64(mixed) / float64(w.Len())
	c.MixedPerBlock = float64(mixed) / float64(blocks)
	c.PerStore, c.WirePerStore = storeBytes/float64(stores), storeWire/float64(stores)
	c.PerRemove, c.WirePerRemove = removeBytes/float64(removes), removeWire/float64(removes)
	return c, subject, nil
}
