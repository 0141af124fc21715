package soak

import (
	"context"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
)

// overloadErr is the error a daemon's admission control refuses with.
func overloadErr(t *testing.T) error {
	t.Helper()
	st, err := status.New(codes.ResourceExhausted, "overloaded: the call queued longer than 50ms; retry with backoff").
		WithDetails(&errdetails.ErrorInfo{Reason: api.OverloadReason, Domain: api.ErrorDomain})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// An overload refusal of a load call is counted, not a failure; any other
// error outside a restart is one, ResourceExhausted for a limit included.
func TestLoadCountsOverloadRefusals(t *testing.T) {
	l := &runner{}
	ctx := context.Background()
	overload := overloadErr(t)
	if l.call(ctx, "rpc_error", "Score", func(context.Context) error { return overload }) {
		t.Fatal("a refused call reported success")
	}
	if !l.call(ctx, "rpc_error", "Score", func(context.Context) error { return nil }) {
		t.Fatal("an answered call reported failure")
	}
	if st := l.load.snapshot(); st["calls"] != 2 || st["refused"] != 1 || l.fail.Count() != 0 {
		t.Fatalf("calls %d, refused %d, failures %v; want 2, 1, none", st["calls"], st["refused"], l.fail.String())
	}
	l.call(ctx, "rpc_error", "Route", func(context.Context) error {
		return status.Error(codes.ResourceExhausted, "request_id: too long")
	})
	if st := l.load.snapshot(); st["calls"] != 3 || st["refused"] != 1 || l.fail.Counts()["rpc_error"] != 1 {
		t.Fatalf("calls %d, refused %d, failures %v; want 3, 1, rpc_error=1", st["calls"], st["refused"], l.fail.String())
	}
}

// A checkpoint Score refused for overload is sent again until answered,
// each refusal counted; past checkpointTries the refusal is returned.
func TestRetryOverloaded(t *testing.T) {
	l := &runner{}
	ctx := context.Background()
	overload := overloadErr(t)
	n := 0
	if err := l.retryOverloaded(ctx, func() error {
		if n++; n <= 2 {
			return overload
		}
		return nil
	}); err != nil || n != 3 || l.load.snapshot()["checkpoint_refused"] != 2 {
		t.Fatalf("err %v after %d calls, %d refusals counted; want nil, 3, 2", err, n, l.load.snapshot()["checkpoint_refused"])
	}
	other := status.Error(codes.Internal, "boom")
	n = 0
	if err := l.retryOverloaded(ctx, func() error { n++; return other }); err != other || n != 1 {
		t.Fatalf("another error: %v after %d calls, want it after 1", err, n)
	}
	n = 0
	if err := l.retryOverloaded(ctx, func() error { n++; return overload }); !api.IsOverloaded(err) || n != checkpointTries || l.load.snapshot()["checkpoint_refused"] != 2+checkpointTries-1 {
		t.Fatalf("always refused: %v after %d calls, %d counted; want the refusal after %d, %d", err, n, l.load.snapshot()["checkpoint_refused"], checkpointTries, 2+checkpointTries-1)
	}
}

// The run fails only when more than MaxRefused of the load's calls were
// refused for overload.
func TestCheckRefused(t *testing.T) {
	for _, c := range []struct {
		refused, calls int64
		fail           bool
	}{{0, 0, false}, {5, 100, false}, {6, 100, true}, {1, 0, true}} {
		r := &runner{opts: Options{MaxRefused: 0.05}}
		r.checkRefused(map[string]int64{"calls": c.calls, "refused": c.refused})
		if got := r.fail.Counts()["overload_refused"] == 1; got != c.fail {
			t.Errorf("%d of %d refused: failed %v, want %v (%s)", c.refused, c.calls, got, c.fail, r.fail.String())
		}
	}
}
