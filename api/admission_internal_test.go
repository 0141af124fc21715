package api

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"
)

// fakeClock is a settable clock for admission's decisions.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time        { return c.t }
func (c *fakeClock) add(d time.Duration)   { c.t = c.t.Add(d) }
func score() *tap.Info                     { return &tap.Info{FullMethodName: "/kvindex.v1.IndexService/Score"} }
func ok(context.Context, any) (any, error) { return "done", nil }
func unaryInfo() *grpc.UnaryServerInfo {
	return &grpc.UnaryServerInfo{FullMethod: "/kvindex.v1.IndexService/Score"}
}
func end(a *admission, ctx context.Context) { admissionStats{a}.HandleRPC(ctx, &stats.End{}) }
func wire(a *admission, ctx context.Context, n int) {
	admissionStats{a}.HandleRPC(ctx, &stats.InPayload{WireLength: n})
}

func TestAdmissionPendingBound(t *testing.T) {
	clk := &fakeClock{t: time.Unix(100, 0)}
	a := newAdmission(AdmissionOptions{MaxPending: 3}, clk.now)
	var ctxs []context.Context
	for range 3 {
		ctx, err := a.tap(context.Background(), score())
		if err != nil {
			t.Fatal(err)
		}
		ctxs = append(ctxs, ctx)
	}
	if _, err := a.tap(context.Background(), score()); !IsOverloaded(err) || a.refused[refusedPending].Load() != 1 {
		t.Fatalf("fourth pending call: %v", err)
	}
	// Other methods are never refused.
	if _, err := a.tap(context.Background(), &tap.Info{FullMethodName: "/kvindex.v1.IndexService/Release"}); err != nil {
		t.Fatalf("Release refused: %v", err)
	}
	end(a, ctxs[0]) // a call ends, handler run or not: room again
	if _, err := a.tap(context.Background(), score()); err != nil {
		t.Fatalf("after an end: %v", err)
	}
	if a.pending.Load() != 3 {
		t.Fatalf("pending %d, want 3", a.pending.Load())
	}
}

// A standing queue (the least delay of an interval above Target) cuts the
// bound on pending calls; intervals without one raise it back.
func TestAdmissionAdaptsToStandingQueue(t *testing.T) {
	clk := &fakeClock{t: time.Unix(100, 0)}
	a := newAdmission(AdmissionOptions{MaxPending: 64, Target: time.Millisecond, Interval: 50 * time.Millisecond}, clk.now)
	a.roll(clk.now()) // start the first interval
	call := func(queued time.Duration) error {
		ctx, err := a.tap(context.Background(), score())
		if err != nil {
			return err
		}
		defer end(a, ctx)
		clk.add(queued)
		_, err = a.interceptor(ctx, nil, unaryInfo(), ok)
		return err
	}
	// 40 calls pending while each waits 3 ms: a standing queue.
	var held []context.Context
	for range 40 {
		ctx, _ := a.tap(context.Background(), score())
		held = append(held, ctx)
	}
	for range 5 {
		if err := call(3 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(50 * time.Millisecond)
	a.roll(clk.now())
	if !a.overloaded.Load() || a.limit.Load() != 30 { // 3/4 of the 40 pending
		t.Fatalf("after a standing queue: overloaded %v, limit %d; want true, 30", a.overloaded.Load(), a.limit.Load())
	}
	if err := call(0); !IsOverloaded(err) || a.refused[refusedOverload].Load() != 1 {
		t.Fatalf("call over the cut bound: %v", err)
	}
	for _, ctx := range held {
		end(a, ctx)
	}
	// An interval with short delays that met the bound raises it.
	for range 31 {
		ctx, _ := a.tap(context.Background(), score())
		held = append(held[:0], ctx)
	}
	clk.add(50 * time.Millisecond)
	a.roll(clk.now())
	if a.overloaded.Load() || a.limit.Load() != 33 {
		t.Fatalf("after a calm interval at the bound: overloaded %v, limit %d; want false, 33", a.overloaded.Load(), a.limit.Load())
	}
}

// A standing queue never raises the bound above MaxPending, even one below
// the floor a cut stops at (a core's worth of calls).
func TestAdmissionStandingQueueKeepsMaxPending(t *testing.T) {
	clk := &fakeClock{t: time.Unix(100, 0)}
	a := newAdmission(AdmissionOptions{MaxPending: 1, Target: time.Millisecond, Interval: 50 * time.Millisecond}, clk.now)
	a.roll(clk.now())
	ctx, err := a.tap(context.Background(), score())
	if err != nil {
		t.Fatal(err)
	}
	clk.add(3 * time.Millisecond) // queued past Target: a standing queue
	if _, err := a.interceptor(ctx, nil, unaryInfo(), ok); err != nil {
		t.Fatal(err)
	}
	end(a, ctx)
	held, err := a.tap(context.Background(), score())
	if err != nil {
		t.Fatal(err)
	}
	clk.add(50 * time.Millisecond)
	a.roll(clk.now())
	if !a.overloaded.Load() || a.limit.Load() != 1 {
		t.Fatalf("after a standing queue: overloaded %v, limit %d; want true, 1 (MaxPending)", a.overloaded.Load(), a.limit.Load())
	}
	if _, err := a.tap(context.Background(), score()); !IsOverloaded(err) {
		t.Fatalf("a second pending call with MaxPending 1: %v", err)
	}
	end(a, held)
}

// A call that queued past MaxQueueDelay is refused, unless its message was
// big (its wait was its body arriving).
func TestAdmissionMaxQueueDelay(t *testing.T) {
	clk := &fakeClock{t: time.Unix(100, 0)}
	a := newAdmission(AdmissionOptions{MaxQueueDelay: 5 * time.Millisecond}, clk.now)
	ctx, _ := a.tap(context.Background(), score())
	clk.add(6 * time.Millisecond)
	if _, err := a.interceptor(ctx, nil, unaryInfo(), ok); !IsOverloaded(err) || a.refused[refusedQueued].Load() != 1 {
		t.Fatalf("late small call: %v", err)
	}
	ctx, _ = a.tap(context.Background(), score())
	wire(a, ctx, 2<<20)
	clk.add(200 * time.Millisecond)
	if got, err := a.interceptor(ctx, nil, unaryInfo(), ok); err != nil || got != "done" {
		t.Fatalf("late big call: %v, %v", got, err)
	}
	if a.admittedN.Load() != 1 {
		t.Fatalf("admitted %d, want 1", a.admittedN.Load())
	}
}

// The inspection budget: MaxInspect running and MaxInspectPending waiting,
// more refused at their start; a waiting call is refused after
// InspectWait; Score's bounds are neither used nor touched.
func TestAdmissionInspectBudget(t *testing.T) {
	a := newAdmission(AdmissionOptions{MaxPending: 4, MaxInspect: 1, MaxInspectPending: 1, InspectWait: 20 * time.Millisecond}, nil)
	dump := &tap.Info{FullMethodName: "/kvindex.v1.IndexService/Dump"}
	dumpInfo := &grpc.UnaryServerInfo{FullMethod: dump.FullMethodName}
	running, err := a.tap(context.Background(), dump)
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := a.tap(context.Background(), &tap.Info{FullMethodName: "/kvindex.v1.IndexService/Lookup"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.tap(context.Background(), &tap.Info{FullMethodName: "/kvindex.v1.IndexService/Diagnose"}); !IsOverloaded(err) {
		t.Fatalf("a third inspection call: %v, want an overload refusal", err)
	}
	// Score is admitted by its own bound meanwhile.
	sctx, err := a.tap(context.Background(), score())
	if err != nil {
		t.Fatalf("Score while the inspection budget is spent: %v", err)
	}
	if r, err := a.interceptor(sctx, nil, unaryInfo(), ok); err != nil || r != "done" {
		t.Fatalf("Score: %v, %v", r, err)
	}
	end(a, sctx)

	// The running call holds the one slot; the waiting one gives up after
	// InspectWait.
	release, held := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := a.interceptor(running, nil, dumpInfo, func(context.Context, any) (any, error) {
			close(held)
			<-release
			return "dumped", nil
		})
		done <- err
	}()
	<-held
	if _, err := a.interceptor(waiting, nil, dumpInfo, ok); !IsOverloaded(err) {
		t.Fatalf("a call that waited InspectWait: %v, want an overload refusal", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	end(a, running)
	end(a, waiting)
	if r, err := a.interceptor(waiting, nil, dumpInfo, ok); err != nil || r != "done" {
		t.Fatalf("with the slot free: %v, %v", r, err)
	}
	st := AdmissionStats{Inspected: a.inspectedN.Load(), RefusedInspect: a.refused[refusedInspect].Load()}
	if st.Inspected != 2 || st.RefusedInspect != 2 || a.inspectPending.Load() != 0 || a.pending.Load() != 0 || a.admittedN.Load() != 1 {
		t.Fatalf("inspected %d, refused %d, inspect pending %d, Score pending %d, admitted %d; want 2 2 0 0 1",
			st.Inspected, st.RefusedInspect, a.inspectPending.Load(), a.pending.Load(), a.admittedN.Load())
	}
	for r := range refusedInspect {
		if n := a.refused[r].Load(); n != 0 {
			t.Errorf("Score's refusal %d counted %d", r, n)
		}
	}
}

// While a standing queue lasts, a call that finds every slot taken is
// refused at once (counted as an overload refusal), not after waiting out
// MaxQueueDelay; without one it waits for a slot.
func TestAdmissionNoSlotWhileOverloaded(t *testing.T) {
	clk := &fakeClock{t: time.Unix(100, 0)}
	a := newAdmission(AdmissionOptions{MaxConcurrent: 1, MaxQueueDelay: time.Hour}, clk.now)
	a.slots <- struct{}{} // the one slot is taken
	ctx, _ := a.tap(context.Background(), score())
	a.overloaded.Store(true) // as the interval's end (roll, in the tap) found it
	if _, err := a.interceptor(ctx, nil, unaryInfo(), ok); !IsOverloaded(err) || a.refused[refusedOverload].Load() != 1 || a.refused[refusedQueued].Load() != 0 {
		t.Fatalf("no slot while overloaded: %v; refused overload %d, queued %d", err, a.refused[refusedOverload].Load(), a.refused[refusedQueued].Load())
	}
	end(a, ctx)
	a.overloaded.Store(false)
	ctx, _ = a.tap(context.Background(), score())
	go func() { <-a.slots }() // the running call ends
	if got, err := a.interceptor(ctx, nil, unaryInfo(), ok); err != nil || got != "done" {
		t.Fatalf("no slot, no standing queue: %v, %v (want it to wait for the slot)", got, err)
	}
	if a.admittedN.Load() != 1 {
		t.Fatalf("admitted %d, want 1", a.admittedN.Load())
	}
}
