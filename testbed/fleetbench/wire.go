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
	"github.com/kvindex/kvindex/testbed/embednats"
	"github.com/nats-io/nats.go"
)

// WireCase is one measured stream of the wire benchmark: "realistic"
// (DefaultShape), or "batch N" (every batch N new GPU blocks in chains of
// up to 16, each request continuing its chain half of the time, and N
// removals; no offload). DeltaBytes and MixedPerBlock are the whole
// batches' payload bytes per delta and per new block (removals, offloads
// and all). PerStore and PerRemove are the payload bytes per stored and
// per removed block, from the same batches split into their stores
// (offloads included) and their removals, the header's bytes shared out
// over the entries; the Wire figures add NATS's framing.
type WireCase struct {
	Name          string  `json:"name"`
	DeltaBytes    float64 `json:"delta_bytes"`
	MixedPerBlock float64 `json:"mixed_per_block"`
	PerStore      float64 `json:"per_store"`
	PerRemove     float64 `json:"per_remove"`
	WirePerStore  float64 `json:"wire_per_store"`
	WirePerRemove float64 `json:"wire_per_remove"`
	Deltas        int     `json:"deltas"`
}

// WireResult is what the wire benchmark measured.
type WireResult struct {
	Subject string     `json:"subject"`
	Cases   []WireCase `json:"cases"`
}

// Wire measures the bytes a delta costs on NATS: batches of each case
// applied to an agent's index, published through natsbus.Agent.Publish
// into an embedded nats-server, and counted as a subscriber receives them.
func Wire(ctx context.Context) (*WireResult, error) {
	ns, err := embednats.Start("kvfleetbench")
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	res := &WireResult{}
	names, shapes := []string{"realistic"}, []Shape{DefaultShape()}
	for _, n := range []int{1, 16, 256} {
		per := min(n, 16)
		names = append(names, fmt.Sprintf("batch %d", n))
		shapes = append(shapes, Shape{Ring: 256, Window: 128, Requests: n / per, MinBlocks: per, MaxBlocks: per, BlockSize: 16})
	}
	for i, sh := range shapes {
		c, subject, err := wireCase(ctx, ns.URL(), names[i], sh)
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
	r, err := newWireRig(ctx, url, shape.BlockSize)
	if err != nil {
		return nil, "", err
	}
	defer r.close()
	var f Filler
	for i := range w.Len() {
		if err := r.wk.ApplyBatch(f.Fill(w, i, 0, 0)); err != nil {
			return nil, "", fmt.Errorf("fleetbench: wire: warm-up: %w", err)
		}
	}
	c := &WireCase{Name: name}
	var mixed, blocks int
	// The second lap's batches split in two, their removals (parts[0])
	// first, as their events come, then their stores (parts[1]).
	var parts [2]struct{ entries, bytes, wire float64 }
	for i := range w.Len() {
		n, err := r.publish(f.Fill(w, i, 1, 1))
		if err != nil {
			return nil, "", err
		}
		mixed += n
		blocks += w.Stored[i]
		c.Deltas++
	}
	for i := range w.Len() {
		var split [2][]events.Event
		for _, ev := range f.Fill(w, i, 2, 1).Events {
			k := 1
			if ev.Kind == events.KindBlockRemoved {
				k = 0
			}
			split[k] = append(split[k], ev)
		}
		for k, evs := range split {
			if len(evs) == 0 {
				continue
			}
			n, err := r.publish(&events.Batch{Timestamp: 1, Events: evs, HasDPRank: true})
			if err != nil {
				return nil, "", err
			}
			for _, ev := range evs {
				parts[k].entries += float64(len(ev.BlockHashes))
			}
			// NATS's framing: "PUB <subject> <size>\r\n" and "\r\n".
			framing := len("PUB ") + len(r.subject) + 1 + len(strconv.Itoa(n)) + 4
			parts[k].bytes += float64(n)
			parts[k].wire += float64(n + framing)
			c.Deltas++
		}
	}
	c.DeltaBytes = float64(mixed) / float64(w.Len())
	c.MixedPerBlock = float64(mixed) / float64(blocks)
	c.PerRemove, c.WirePerRemove = parts[0].bytes/parts[0].entries, parts[0].wire/parts[0].entries
	c.PerStore, c.WirePerStore = parts[1].bytes/parts[1].entries, parts[1].wire/parts[1].entries
	return c, r.subject, nil
}

// wireRig is an agent's path for one worker, and a subscriber that
// receives each delta.
type wireRig struct {
	fa      *fixedAgents
	subConn *nats.Conn
	sub     *nats.Subscription
	subject string
	wk      *indexer.Worker
	d       indexer.Delta
}

func newWireRig(ctx context.Context, url string, blockSize int) (r *wireRig, err error) {
	r = &wireRig{subject: natsbus.DeltaSubject(benchModel, events.WorkerRef{Pod: podName(0)})}
	if r.subConn, err = connect(url, "kvfleetbench wire subscriber"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.sub, err = r.subConn.SubscribeSync(r.subject); err != nil {
		return nil, fmt.Errorf("fleetbench: wire: %w", err)
	}
	if err := r.subConn.Flush(); err != nil {
		return nil, fmt.Errorf("fleetbench: wire: %w", err)
	}
	if r.fa, err = startAgents(ctx, url, []*Recorded{{}}, blockSize); err != nil {
		return nil, err
	}
	ix := indexer.New(indexer.Config{})
	if _, err := ix.AddModel(benchModel, blockSize); err != nil {
		return nil, err
	}
	r.wk, err = ix.AddWorker(indexer.WorkerInfo{Ref: events.WorkerRef{Pod: podName(0)}, Model: benchModel})
	return r, err
}

func (r *wireRig) close() {
	if r.fa != nil {
		r.fa.stop()
	}
	r.subConn.Close()
}

// publish applies b, publishes its delta and returns the payload bytes the
// subscriber received.
func (r *wireRig) publish(b *events.Batch) (int, error) {
	err := r.fa.agents[0].Publish(0, 0, b.Timestamp, func(seq uint64, wire *events.Delta) error {
		r.d.Reset()
		r.d.Seq = seq
		err := r.wk.ApplyBatchDelta(b, &r.d)
		fleet.ToWire(&r.d, wire)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("fleetbench: wire: %w", err)
	}
	m, err := r.sub.NextMsg(5 * time.Second)
	if err != nil {
		return 0, fmt.Errorf("fleetbench: wire: %w", err)
	}
	return len(m.Data), nil
}
