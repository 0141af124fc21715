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
