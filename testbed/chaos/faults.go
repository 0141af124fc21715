package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// runSchedule applies each fault of the schedule at its time and heals it
// at its end, and returns once every fault is healed (restarted processes
// started, restarted engines up).
func (r *run) runSchedule(ctx context.Context) {
	var wg sync.WaitGroup
	for id, f := range r.sched {
		if !sleep(ctx, time.Until(r.start.Add(f.At))) {
			break
		}
		wg.Go(func() { r.inject(ctx, id, f) })
	}
	wg.Wait()
}

// inject applies fault id, waits out its time and heals it.
func (r *run) inject(ctx context.Context, id int, f Fault) {
	name := "f" + strconv.Itoa(id)
	heal, err := r.apply(ctx, name, f)
	if err != nil {
		r.harnessError("apply %v: %v", f, err)
		return
	}
	r.mu.Lock()
	r.active[id] = f
	r.applied[f.Kind]++
	r.appliedOn[f.Class()]++
	r.mu.Unlock()
	r.log.Info("fault", "id", id, "fault", f.String())
	// Heal even when the run is ending, so that nothing stays stopped.
	sleep(ctx, time.Until(r.start.Add(f.End())))
	if err := heal(); err != nil && ctx.Err() == nil {
		r.harnessError("heal %v: %v", f, err)
	}
	r.mu.Lock()
	delete(r.active, id)
	r.mu.Unlock()
}

// apply starts fault f (its toxics named after name) and returns what
// heals it.
func (r *run) apply(ctx context.Context, name string, f Fault) (func() error, error) {
	links := make([]*Link, len(f.Targets))
	for i, t := range f.Targets {
		links[i] = r.net.Link(t)
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	switch f.Kind {
	case Latency:
		return r.toxics(links, Toxic{Name: name, Type: "latency", Stream: f.Stream, Attrs: map[string]int64{"latency": ms(f.Latency), "jitter": ms(f.Jitter)}})
	case Bandwidth:
		return r.toxics(links, Toxic{Name: name, Type: "bandwidth", Stream: f.Stream, Attrs: map[string]int64{"rate": f.RateKB}})
	case Reset:
		return r.toxics(links,
			Toxic{Name: name + "-up", Type: "reset_peer", Stream: Upstream, Attrs: map[string]int64{"timeout": 0}},
			Toxic{Name: name + "-down", Type: "reset_peer", Stream: Downstream, Attrs: map[string]int64{"timeout": 0}})
	case Blackhole:
		return r.toxics(links, Toxic{Name: name, Type: "hold", Stream: f.Stream})
	case Partition:
		return r.toxics(links, Toxic{Name: name + "-up", Type: "hold", Stream: Upstream}, Toxic{Name: name + "-down", Type: "hold", Stream: Downstream})
	case LinkDown:
		links[0].Down()
		return links[0].Up, nil
	case SIGKILL, SIGTERM:
		return r.restart(ctx, f)
	case SIGSTOP:
		c := r.child(f.Targets[0])
		if err := c.pause(true); err != nil {
			return nil, err
		}
		return func() error { return c.pause(false) }, nil
	case EngineRestart:
		e := r.engineOf(f.Targets[0])
		done := make(chan error, 1)
		go func() { done <- e.Restart(ctx, f.For) }()
		return func() error { return <-done }, nil
	case EngineFreeze:
		e := r.engineOf(f.Targets[0])
		e.Freeze(true)
		heal, err := r.toxics(links[1:], Toxic{Name: name + "-up", Type: "hold", Stream: Upstream}, Toxic{Name: name + "-down", Type: "hold", Stream: Downstream})
		if err != nil {
			e.Freeze(false)
			return nil, err
		}
		return func() error { err := heal(); e.Freeze(false); return err }, nil
	}
	return nil, fmt.Errorf("unknown fault kind %q", f.Kind)
}

// toxics adds ts to every link and returns what removes them.
func (r *run) toxics(links []*Link, ts ...Toxic) (func() error, error) {
	var added []func() error
	heal := func() error {
		var errs []error
		for _, rm := range added {
			errs = append(errs, rm())
		}
		return errors.Join(errs...)
	}
	for _, l := range links {
		if l == nil {
			return nil, errors.Join(errors.New("no such link"), heal())
		}
		for _, t := range ts {
			if err := l.AddToxic(t); err != nil {
				return nil, errors.Join(err, heal())
			}
			added = append(added, func() error { return l.RemoveToxic(t.Name) })
		}
	}
	return heal, nil
}

// restart stops the process of f with its signal and returns what starts
// it again; a restarted agent is then checked to resume from its
// checkpoint.
func (r *run) restart(ctx context.Context, f Fault) (func() error, error) {
	c := r.child(f.Targets[0])
	sig := syscall.SIGKILL
	if f.Kind == SIGTERM {
		sig = syscall.SIGTERM
	}
	if err := c.stop(sig); err != nil {
		// An exit other than the signal's (SIGTERM must end it with status
		// 0) is the process's failure, not the harness's.
		r.violate("d", "unclean_exit", "%s after %v: %v", c.name, sig, err)
	}
	return func() error {
		agent := strings.HasPrefix(c.name, "agent-")
		_, statErr := os.Stat(r.lay.Checkpoint(r.indexOf(c.name)))
		if err := c.start(); err != nil {
			return err
		}
		if agent && ctx.Err() == nil {
			r.pending.Go(func() { r.checkResumed(ctx, c, statErr == nil) })
		}
		return nil
	}, nil
}
