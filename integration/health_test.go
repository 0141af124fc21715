package integration

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// When the daemon starts to drain it reports NOT_SERVING to health
// watchers (a load balancer's Watch stream) before connections close.
func TestHealthNotServingWhileDraining(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"})
	conn, err := grpc.NewClient(f.d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "kvindex.v1.IndexService"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := watch.Recv()
	if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch update: %v, %v; want SERVING", got.GetStatus(), err)
	}
	f.cancel() // the daemon drains
	got, err = watch.Recv()
	if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch update on drain: %v, %v; want NOT_SERVING", got.GetStatus(), err)
	}
	cancel() // the watcher leaves, as a load balancer would; the drain ends
}
