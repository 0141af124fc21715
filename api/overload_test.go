package api_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/scoring"
)

// An admission refusal reaches the client as ResourceExhausted that
// IsOverloaded recognises; a request over a limit (a full in-flight table)
// is ResourceExhausted too but not an overload, and nor is any other error.
func TestIsOverloaded(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustWorker(t, ix, "m", "pod-0", 0)
	f := serve(t, ix, nil, api.Options{Admission: api.AdmissionOptions{MaxPending: 1, Target: time.Second, MaxQueueDelay: 10 * time.Second}})

	// A Score whose headers are sent and body is not holds the one
	// pending slot. It goes on the client's own connection, so that the
	// server's tap sees it before the Score after it; a held stream that
	// found the slot still taken (the previous Score's end not yet
	// counted) was refused itself, and the next attempt opens another.
	req := &kvindexv1.ScoreRequest{Model: "m", TokenIds: prompt(1, 2)}
	var refused error
	held := func() {}
	defer func() { held() }()
	deadline := time.Now().Add(10 * time.Second)
	for refused == nil && time.Now().Before(deadline) {
		held()
		ctx, cancel := context.WithCancel(context.Background())
		held = cancel
		if _, err := f.client.Conn().NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/kvindex.v1.IndexService/Score"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.client.Score(context.Background(), req); err != nil {
			refused = err
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if status.Code(refused) != codes.ResourceExhausted || !api.IsOverloaded(refused) {
		t.Fatalf("Score past max_pending: %v (overloaded %v), want an overload refusal", refused, api.IsOverloaded(refused))
	}
	held()

	srv := api.NewServer(ix, nil, api.Options{Tracker: scoring.NewTracker(scoring.TrackerOptions{MaxFlights: 1})})
	route := func(id string) error {
		_, err := srv.Route(context.Background(), &kvindexv1.RouteRequest{RequestId: id, Score: req})
		return err
	}
	if err := route("r1"); err != nil {
		t.Fatal(err)
	}
	full := route("r2")
	if status.Code(full) != codes.ResourceExhausted || api.IsOverloaded(full) {
		t.Fatalf("Route past max in flight: %v (overloaded %v), want ResourceExhausted, not an overload", full, api.IsOverloaded(full))
	}
	for _, err := range []error{nil, errors.New("plain"), status.Error(codes.Unavailable, "overloaded: not really")} {
		if api.IsOverloaded(err) {
			t.Errorf("IsOverloaded(%v) = true", err)
		}
	}
}
