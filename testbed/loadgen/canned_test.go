package loadgen

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestCannedAnswer: over real gRPC, the canned server answers prompt 0
// exactly as a kvindex server loaded with the same shape does, answers
// every other prompt with that same answer, which is the size of kvindex's
// answer to it and has its longest match (so the generator's check
// passes), and a checked run against it has no errors.
func TestCannedAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shape := Shape{Model: "m", BlockSize: 16, Workers: 8, PromptBlocks: 32, SharedBlocks: 8, TailHolders: 2, Prompts: 16, FillerBlocks: 256}
	e, err := StartEmbedded(ctx, shape, "", api.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := StartCanned(ctx, shape, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	real, err := api.Dial(ctx, e.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	floor, err := api.Dial(ctx, c.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer floor.Close()
	reqs := scoreMessages(shape, false)
	for i, req := range reqs {
		want, err := real.Score(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := floor.Score(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && !proto.Equal(got, want) {
			t.Fatalf("prompt 0: canned answer\n%v\nkvindex's\n%v", got, want)
		}
		if proto.Size(got) != proto.Size(want) || len(c.Response) != proto.Size(want) {
			t.Errorf("prompt %d: canned answer %d bytes (%d encoded), kvindex's %d", i, proto.Size(got), len(c.Response), proto.Size(want))
		}
		if err := checkScore(shape, int64(i), got); err != nil {
			t.Errorf("prompt %d: %v", i, err)
		}
		if len(got.GetWorkers()) != shape.Workers {
			t.Errorf("prompt %d: %d workers in the canned answer, want %d", i, len(got.GetWorkers()), shape.Workers)
		}
	}
	load := Config{Rate: 200, Duration: 500 * time.Millisecond, Concurrency: 2, Timeout: 5 * time.Second}
	rep, err := Bench(ctx, Options{Addr: c.Addr, Check: true, Shape: shape, Client: "grpc", Load: load, Warmup: Config{Rate: 200, Duration: 100 * time.Millisecond, Concurrency: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent != 100 || rep.WarmupSent != 20 || rep.Errors != 0 || rep.Refused != 0 {
		t.Fatalf("checked run against the canned server: sent %d after %d warming up, errors %d (first: %s), refused %d; want 100 after 20, 0, 0",
			rep.Sent, rep.WarmupSent, rep.Errors, rep.FirstError, rep.Refused)
	}
}

// TestCannedCodecRefusesOtherTypes: the canned codec encodes only its
// answer and decodes only into its request, with an error naming the type.
func TestCannedCodecRefusesOtherTypes(t *testing.T) {
	var cc cannedCodec
	if _, err := cc.Marshal(&kvindexv1.ScoreResponse{}); err == nil {
		t.Error("encoded a ScoreResponse message")
	}
	if err := cc.Unmarshal(nil, &kvindexv1.ScoreRequest{}); err == nil {
		t.Error("decoded into a ScoreRequest")
	}
	b, err := cc.Marshal(encoded{1, 2, 3})
	if err != nil || b.Len() != 3 {
		t.Fatalf("encoded %d bytes (%v), want 3", b.Len(), err)
	}
	var r cannedRequest
	if err := cc.Unmarshal(b, &r); err != nil || r.n != 3 {
		t.Fatalf("decoded length %d (%v), want 3", r.n, err)
	}
}
