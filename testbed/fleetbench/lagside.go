package fleetbench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/testbed/proc"
)

// lagSide is the lag generator's agent side: the agents its engines feed
// (the path) or the forwarders in their place (the floor), in the
// generator's process (localSide) or spread over processes of their own
// (procSide), as a fleet runs each agent beside its pod: in one process,
// 100 agents' indexes share one heap whose collections stall every agent
// at once. The floor and the path are spread the same way.
type lagSide interface {
	progress(ctx context.Context) (*lagProgress, error)
	// agentLag sums the agents' engine-to-agent lag (empty for forwarders).
	agentLag(ctx context.Context) (*lagHist, error)
	digests(ctx context.Context) (*digestsReport, error)
	// cpu is the CPU of the side's processes other than the generator's.
	cpu() time.Duration
	stop() error
}

// lagProgress is the last engine seq each agent has applied, by pod, or
// the frames the forwarders have published or failed to.
type lagProgress struct {
	Seqs      map[string]uint64 `json:"seqs,omitempty"`
	Forwarded int64             `json:"forwarded"`
	Failed    int64             `json:"failed"`
}

// waitCaughtUp waits, within a minute, until side has handled everything
// es sent (sent batches in all).
func waitCaughtUp(ctx context.Context, side lagSide, floor bool, es []*engine, sent int64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := side.progress(ctx)
		if err != nil {
			return err
		}
		caught := !floor || p.Forwarded+p.Failed >= sent
		for _, e := range es {
			if seq, ok := p.Seqs[e.Pod]; !floor && (!ok || seq < e.lastSeq) {
				caught = false
			}
		}
		if caught {
			return nil
		}
		if time.Now().After(deadline) {
			if floor {
				return fmt.Errorf("fleetbench: the forwarders moved %d of %d frames within a minute", p.Forwarded+p.Failed, sent)
			}
			return errors.New("fleetbench: the agents have not caught up with their engines within a minute")
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// localSide runs the agents or the forwarders of ps in this process.
type localSide struct {
	ps         []enginePort
	agents     []*fleet.Agent // the path's, in ps's order
	stopAgents func()
	fw         *forwarders // the floor's
}

// startLocalSide starts an agent (or, for the floor, a forwarder) per
// engine of ps against NATS at url.
func startLocalSide(ctx context.Context, url string, ps []enginePort, floor bool) (*localSide, error) {
	s := &localSide{ps: ps}
	var err error
	if floor {
		s.fw, err = startForwarders(ctx, url, ps)
		return s, err
	}
	s.agents, s.stopAgents, err = startLagAgents(ctx, ps, url)
	if err != nil {
		s.stopAgents()
		return nil, err
	}
	return s, nil
}

func (s *localSide) progress(context.Context) (*lagProgress, error) {
	if s.fw != nil {
		return &lagProgress{Forwarded: s.fw.forwarded.Load(), Failed: s.fw.failed.Load()}, nil
	}
	p := &lagProgress{Seqs: map[string]uint64{}}
	for i, a := range s.agents {
		for _, st := range a.Subscriber().WorkerStats() {
			if st.Worker == (events.WorkerRef{Pod: s.ps[i].Pod}) && st.HasSeq {
				p.Seqs[s.ps[i].Pod] = st.LastSeq
			}
		}
	}
	return p, nil
}

func (s *localSide) agentLag(context.Context) (*lagHist, error) { return agentLag(s.agents) }

func (s *localSide) digests(context.Context) (*digestsReport, error) {
	d := &digestsReport{Digests: map[string]string{}}
	for i, a := range s.agents {
		w := a.Index().LookupWorker(events.WorkerRef{Pod: s.ps[i].Pod})
		if w == nil {
			return nil, fmt.Errorf("fleetbench: the agent of %s has no worker", s.ps[i].Pod)
		}
		d.Digests[s.ps[i].Pod] = strconv.FormatUint(w.Digest(), 16)
	}
	return d, nil
}

func (s *localSide) cpu() time.Duration { return 0 }

func (s *localSide) stop() error {
	if s.fw != nil {
		return s.fw.stop()
	}
	s.stopAgents()
	return nil
}

// lagAgentsOpts configure the lag-agents role.
type lagAgentsOpts struct {
	URL   string       `json:"url"`
	Ports []enginePort `json:"ports"`
	Floor bool         `json:"floor,omitempty"`
}

// runLagAgents is the lag-agents role: it starts its agents or
// forwarders, reports "ready" and answers "progress", "lag" and "digests"
// until "exit".
func runLagAgents(ctx context.Context, o lagAgentsOpts, in *Commands, out *Reporter) error {
	side, err := startLocalSide(ctx, o.URL, o.Ports, o.Floor)
	if err != nil {
		return err
	}
	if err := out.Send("ready", struct{}{}); err != nil {
		return errors.Join(err, side.stop())
	}
	for {
		cmd, ok := in.Next(ctx)
		if !ok || cmd == "exit" {
			return side.stop()
		}
		var (
			msg any
			err error
		)
		switch cmd {
		case "progress":
			msg, err = side.progress(ctx)
		case "lag":
			msg, err = side.agentLag(ctx)
		case "digests":
			msg, err = side.digests(ctx)
		default:
			err = fmt.Errorf("fleetbench: lag-agents: unknown command %q", cmd)
		}
		if err == nil {
			err = out.Send(cmd, msg)
		}
		if err != nil {
			return errors.Join(err, side.stop())
		}
	}
}

// procSide runs the agents or forwarders in lag-agents processes, engine
// i in process i mod n, so that consecutive batches go to different
// processes.
type procSide struct {
	kids []*child
}

// startProcSide starts n lag-agents processes for the engines of ps and
// waits until each is ready.

func startProcSide(ctx context.Context, url string, ps []enginePort, floor bool, n int) (*procSide, error) {
	n = min(n, len(ps))
	s := &procSide{}
	for k := range n {
		o := lagAgentsOpts{URL: url, Floor: floor}
		for i := k; i < len(ps); i += n {
			o.Ports = append(o.Ports, ps[i])
		}
		c, err := startChild(ctx, "lag-agents", "", o)
		if err != nil {
			return nil, errors.Join(err, s.stop())
		}
		s.kids = append(s.kids, c)
	}
	for _, c := range s.kids {
		if _, err := c.await("ready", nil, time.Minute); err != nil {
			return nil, errors.Join(err, s.stop())
		}
	}
	return s, nil
}

// gather sends every process cmd, then merges each one's answer, so that
// the processes answer at once.
func gather[T any](s *procSide, cmd string, merge func(*T) error) error {
	for _, c := range s.kids {
		if err := c.send(cmd); err != nil {
			return err
		}
	}
	for _, c := range s.kids {
		var v T
		if _, err := c.await(cmd, &v, time.Minute); err != nil {
			return err
		}
		if err := merge(&v); err != nil {
			return err
		}
	}
	return nil
}

func (s *procSide) progress(context.Context) (*lagProgress, error) {
	p := &lagProgress{Seqs: map[string]uint64{}} // pods are disjoint across processes
	return p, gather(s, "progress", func(q *lagProgress) error {
		maps.Copy(p.Seqs, q.Seqs)
		p.Forwarded, p.Failed = p.Forwarded+q.Forwarded, p.Failed+q.Failed
		return nil
	})
}

func (s *procSide) agentLag(context.Context) (*lagHist, error) {
	h := &lagHist{}
	return h, gather(s, "lag", func(o *lagHist) error { return h.add(o, 1) })
}

func (s *procSide) digests(context.Context) (*digestsReport, error) {
	d := &digestsReport{Digests: map[string]string{}}
	return d, gather(s, "digests", func(r *digestsReport) error {
		maps.Copy(d.Digests, r.Digests)
		return nil
	})
}

func (s *procSide) cpu() time.Duration {
	var sum time.Duration
	for _, c := range s.kids {
		if t, err := proc.CPU(c.Pid()); err == nil {
			sum += t
		}
	}
	return sum
}

// stop closes every process's stdin, then waits for them all.
func (s *procSide) stop() error {
	errs := make([]error, len(s.kids))
	var wg sync.WaitGroup
	for i, c := range s.kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.finish(30 * time.Second)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
