package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/events"
)

// runEngine steps engine e every StepInterval, starting at an offset of
// its own.
func (r *runner) runEngine(ctx context.Context, e *Engine, i int) {
	if !sleep(ctx, time.Duration(i)*r.opts.StepInterval/time.Duration(len(r.engines))) {
		return
	}
	every(ctx, r.opts.StepInterval, func(int) bool {
		if err := e.Step(); err != nil {
			r.fail.Add("engine_error", "%v", err)
			return false
		}
		return true
	})
}

// action is one scheduled restart.
type action struct {
	at     time.Duration
	daemon bool
	sig    syscall.Signal
	engine int
}

// schedule returns the run's restarts in time order: DaemonRestarts
// evenly within the first 60% (SIGTERM and SIGKILL alternately, the last
// SIGKILL), and an engine restart every EngineRestartEvery in a seeded
// round-robin order, each engine restarted at most once a round.
func (r *runner) schedule() []action {
	var acts []action
	n := r.opts.DaemonRestarts
	for i := 1; i <= n; i++ {
		sig := syscall.SIGTERM
		if (n-i)%2 == 0 {
			sig = syscall.SIGKILL
		}
		acts = append(acts, action{at: time.Duration(float64(r.opts.Duration) * 0.6 * float64(i) / float64(n+1)), daemon: true, sig: sig})
	}
	if r.opts.EngineRestartEvery > 0 {
		order := rand.New(rand.NewPCG(r.opts.Seed, stringSeed("engine restarts"))).Perm(len(r.engines))
		for k, at := 0, r.opts.EngineRestartEvery; at < r.opts.Duration-r.opts.EngineRestartEvery/2; k, at = k+1, at+r.opts.EngineRestartEvery {
			acts = append(acts, action{at: at + r.opts.EngineRestartEvery/3, engine: order[k%len(order)]})
		}
	}
	sort.SliceStable(acts, func(i, j int) bool { return acts[i].at < acts[j].at })
	return acts
}

func (r *runner) runChaos(ctx context.Context) {
	start := time.Now()
	for _, a := range r.schedule() {
		if !sleep(ctx, time.Until(start.Add(a.at))) {
			return
		}
		r.chaos.Lock()
		if ctx.Err() != nil {
			r.chaos.Unlock()
			return
		}
		if a.daemon {
			r.restartDaemon(ctx, a.sig)
		} else {
			r.restartEngine(ctx, r.engines[a.engine])
		}
		r.chaos.Unlock()
		if r.isAborted() {
			return
		}
	}
}

// restartEngine restarts e once the daemon has applied everything it
// sent (a restart racing a replay is the transport tests' subject; here
// every restart must be seen as exactly one). The caller holds chaos.
func (r *runner) restartEngine(ctx context.Context, e *Engine) {
	ref := e.Spec().Worker
	e.Lock()
	defer e.Unlock()
	// Fewer than this many messages since the last restart could leave
	// the new process's first seq past the old one's last: vLLM's seqs
	// carry no process id, so that would read as a gap, not a restart.
	if e.SinceRestartLocked() < 100 {
		r.log.Info("engine restart skipped: too few messages since the last", "worker", ref.String())
		return
	}
	if err := e.FlushLocked(); err != nil {
		r.fail.Add("engine_error", "%v", err)
		return
	}
	seq, _ := e.LastSeqLocked()
	if _, err := r.waitApplied(ctx, map[events.WorkerRef]uint64{ref: seq}, 30*time.Second); err != nil {
		if ctx.Err() == nil {
			r.fail.Add("not_applied", "before restarting engine %s: %v", ref, err)
		}
		return
	}
	if err := e.RestartLocked(ctx, r.opts.EngineDown); err != nil {
		if ctx.Err() == nil {
			r.fail.Add("engine_restart", "%v", err)
		}
		return
	}
	r.mu.Lock()
	r.restarts[ref]++
	r.mu.Unlock()
	r.log.Info("engine restarted", "worker", ref.String())
}

// restartDaemon stops the daemon with sig and starts it again with the
// same configuration. The caller holds chaos.
func (r *runner) restartDaemon(ctx context.Context, sig syscall.Signal) {
	r.window.Begin()
	ended := false
	end := func() {
		if !ended {
			r.window.End()
			ended = true
		}
	}
	defer end()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	r.snapshot(sctx)
	cancel()
	// Keep the push engine quiet until a squatter has tried to claim its
	// pod name on the open listener.
	push := r.byRef[events.WorkerRef{Pod: PushPod}]
	push.Lock()
	unlocked := false
	unlock := func() {
		if !unlocked {
			push.Unlock()
			unlocked = true
		}
	}
	defer unlock()
	r.stopDaemon(sig)
	r.mu.Lock()
	if sig == syscall.SIGKILL {
		r.killed++
	} else {
		r.terminated++
	}
	r.mu.Unlock()
	if err := r.startDaemon(); err != nil {
		r.fail.Add("daemon_start", "%v", err)
		r.abort()
		return
	}
	if err := r.waitReady(ctx, 30*time.Second); err != nil {
		if ctx.Err() == nil {
			r.fail.Add("daemon_start", "%v", err)
			r.abort()
		}
		return
	}
	r.squat(ctx)
	unlock()
	r.log.Info("daemon restarted", "signal", sig.String(), "process", r.currentProcess())
	// Time for the client to reconnect before errors count again.
	sleep(ctx, 2*time.Second)
	end()
	// The new process must have relearned every cache exactly.
	r.checkpoint(ctx, fmt.Sprintf("after restart %d", r.currentProcess()-1))
}
