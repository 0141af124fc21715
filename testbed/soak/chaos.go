package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/events"
)

// runEngine steps engine e every stepInterval, from an offset of its own.
func (r *runner) runEngine(ctx context.Context, e *Engine, i int) {
	if !sleep(ctx, time.Duration(i)*stepInterval/time.Duration(len(r.engines))) {
		return
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	every(ctx, stepInterval, func(int) {
		if err := e.Step(); err != nil {
			r.fail.Add("engine_error", "%v", err)
			stop()
		}
	})
}

// action is one scheduled restart of the daemon with sig, or of an engine.
type action struct {
	at     time.Duration
	daemon bool
	sig    syscall.Signal
	engine int
}

// schedule returns a run of duration d's restarts in time order: daemon
// restarts evenly within the first 60% (SIGTERM and SIGKILL alternately,
// the last SIGKILL), and an engine restart every engineRestartEvery in a
// seeded round-robin order.
func schedule(d time.Duration, daemons, engines int, seed uint64) []action {
	var acts []action
	for i := 1; i <= daemons; i++ {
		sig := syscall.SIGTERM
		if (daemons-i)%2 == 0 {
			sig = syscall.SIGKILL
		}
		acts = append(acts, action{at: time.Duration(float64(d) * 0.6 * float64(i) / float64(daemons+1)), daemon: true, sig: sig})
	}
	order := rand.New(rand.NewPCG(seed, stringSeed("engine restarts"))).Perm(engines)
	for k, at := 0, engineRestartEvery; at < d-engineRestartEvery/2; k, at = k+1, at+engineRestartEvery {
		acts = append(acts, action{at: at + engineRestartEvery/3, engine: order[k%len(order)]})
	}
	sort.SliceStable(acts, func(i, j int) bool { return acts[i].at < acts[j].at })
	return acts
}

func (r *runner) runChaos(ctx context.Context) {
	start := time.Now()
	for _, a := range schedule(r.opts.Duration, daemonRestarts, len(r.engines), r.opts.Seed) {
		if !sleep(ctx, time.Until(start.Add(a.at))) {
			return
		}
		r.chaos.Lock()
		switch {
		case ctx.Err() != nil:
		case a.daemon:
			r.restartDaemon(ctx, a.sig)
		default:
			r.restartEngine(ctx, r.engines[a.engine])
		}
		r.chaos.Unlock()
		if ctx.Err() != nil || r.aborted.Load() {
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
	if _, ok := r.flushAndWait(ctx, "before restarting engine "+ref.String(), e); !ok {
		return
	}
	if err := e.RestartLocked(ctx, engineDown); err != nil {
		r.failLive(ctx, "engine_restart", "%v", err)
		return
	}
	r.mu.Lock()
	r.restarts[ref]++
	r.mu.Unlock()
	r.log.Info("engine restarted", "worker", ref.String())
}

// restartDaemon stops the daemon with sig and starts it again. The caller
// holds chaos.
func (r *runner) restartDaemon(ctx context.Context, sig syscall.Signal) {
	r.window.Begin()
	end := sync.OnceFunc(r.window.End)
	defer end()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	r.snapshot(sctx)
	cancel()
	// Keep the push engine quiet until a squatter has tried to claim its
	// pod name on the open listener.
	push := r.byRef[events.WorkerRef{Pod: PushPod}]
	push.Lock()
	unlock := sync.OnceFunc(push.Unlock)
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
		r.abort("daemon_start", "%v", err)
		return
	}
	if err := r.waitReady(ctx, 30*time.Second); err != nil {
		if ctx.Err() == nil {
			r.abort("daemon_start", "%v", err)
		}
		return
	}
	r.squat(ctx)
	unlock()
	r.log.Info("daemon restarted", "signal", sig.String(), "process", r.Process())
	sleep(ctx, 2*time.Second) // for the client to reconnect before errors count again
	end()
	r.checkpoint(ctx, fmt.Sprintf("after restart %d", r.Process()-1))
}
