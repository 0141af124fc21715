package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/proc"
)

func TestShapeValidate(t *testing.T) {
	if err := DefaultShape().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*Shape){
		func(s *Shape) { s.Model = "" },
		func(s *Shape) { s.BlockSize = 0 },
		func(s *Shape) { s.Workers = 0 },
		func(s *Shape) { s.PromptBlocks = 0 },
		func(s *Shape) { s.SharedBlocks = s.PromptBlocks + 1 },
		func(s *Shape) { s.TailHolders = s.Workers + 1 },
		func(s *Shape) { s.Prompts = 0 },
		func(s *Shape) { s.FillerBlocks = -1 },
	} {
		s := DefaultShape()
		mut(&s)
		if s.Validate() == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

func TestShapeLoadAndPrompts(t *testing.T) {
	s := Shape{Model: "m", BlockSize: 4, Workers: 5, PromptBlocks: 6, SharedBlocks: 2, TailHolders: 2, Prompts: 7, FillerBlocks: 100}
	p0, p1 := s.Prompt(0), s.Prompt(1)
	if len(p0) != 24 || !equal(p0[:8], p1[:8]) || equal(p0[8:], p1[8:]) {
		t.Fatalf("prompts must share exactly the 2-block prefix: %v %v", p0, p1)
	}
	if !equal(p0, s.Prompt(0)) {
		t.Fatal("Prompt is not deterministic")
	}
	ix := indexer.New(indexer.Config{})
	if err := s.Load(ix); err != nil {
		t.Fatal(err)
	}
	var resident int64
	for _, w := range ix.Workers() {
		if st := w.Stats(); st.Orphans != 0 || st.InvalidEvents != 0 {
			t.Fatalf("worker %s: %+v", w.Info().Ref, st)
		}
		resident += w.Stats().ResidentBlocks
	}
	// 5 workers x 2 shared blocks + 7 tails x 4 blocks x 2 holders + 5 x
	// 100 filler blocks.
	if want := int64(5*2 + 7*4*2 + 5*100); resident != want {
		t.Errorf("%d residencies, want %d", resident, want)
	}
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBenchEmbedded is a short real run with each client: 200 req/s for
// 1 s over real gRPC against the embedded server, every answer checked
// against the shape.
func TestBenchEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("1 s real runs")
	}
	for _, tc := range []struct {
		client string
		conns  int
	}{{"grpc-preencoded", 0}, {"grpc-preencoded", 1}, {"grpc", 0}} {
		t.Run(fmt.Sprintf("%s/%d", tc.client, tc.conns), func(t *testing.T) {
			benchEmbedded(t, tc.client, tc.conns)
		})
	}
}

func benchEmbedded(t *testing.T, client string, conns int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shape := Shape{Model: "m", BlockSize: 16, Workers: 4, PromptBlocks: 32, SharedBlocks: 8, TailHolders: 1, Prompts: 16}
	rep, err := Bench(ctx, Options{
		Embedded:    true,
		Shape:       shape,
		Client:      client,
		Connections: conns,
		Load:        Config{Rate: 200, Duration: time.Second, Concurrency: 2, Timeout: 5 * time.Second},
		Warmup:      Config{Rate: 200, Duration: 100 * time.Millisecond, Concurrency: 2, Timeout: 5 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantConns := conns
	if conns == 0 {
		wantConns = 2 // one per sender
	}
	if rep.Client != client || rep.Connections != wantConns {
		t.Errorf("report says client %q over %d connections, want %q over %d", rep.Client, rep.Connections, client, wantConns)
	}
	// Admission control may refuse a few calls when the test machine is
	// busy (they are not errors); most must be answered.
	if rep.Sent != 200 || rep.Errors != 0 || rep.Refused > 20 {
		t.Fatalf("sent %d, errors %d (first: %s), refused %d, want 200, 0 and few", rep.Sent, rep.Errors, rep.FirstError, rep.Refused)
	}
	// Open loop: 200 requests take the 1 s schedule, no less; the upper
	// bound on time is loose because the test machine may be busy.
	if rep.Achieved < 100 || rep.Achieved > 205 {
		t.Errorf("achieved %.1f req/s, want ~200", rep.Achieved)
	}
	if !(rep.P50 > 0 && rep.P50 <= rep.P99 && rep.P99 <= rep.Max) {
		t.Errorf("latency p50 %d p99 %d max %d not ordered", rep.P50, rep.P99, rep.Max)
	}
	var text, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "p99") || !strings.Contains(text.String(), "embedded kvindex") {
		t.Errorf("text report:\n%s", text.String())
	}
	if err := proc.WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back["p99_ns"] == nil || back["achieved_rps"] == nil {
		t.Errorf("JSON report %s: %v", js.String(), err)
	}
}

// TestBenchRemoteChecked runs the generator against a server started
// apart, as `make bench`'s split rows do (kvbench --serve in one process,
// kvbench --addr --check in another): replies are checked against the
// shape, and a server loaded with another shape fails the check.
func TestBenchRemoteChecked(t *testing.T) {
	if testing.Short() {
		t.Skip("real runs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shape := Shape{Model: "m", BlockSize: 16, Workers: 4, PromptBlocks: 32, SharedBlocks: 8, TailHolders: 1, Prompts: 16}
	// Every call must be answered, also under the race detector on a busy
	// machine, for the counts below to be exact; admission control has its
	// own tests.
	e, err := StartEmbedded(ctx, shape, "", api.Options{Admission: api.AdmissionOptions{Target: time.Second, MaxQueueDelay: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	load := Config{Rate: 200, Duration: 500 * time.Millisecond, Concurrency: 2, Timeout: 5 * time.Second}
	for _, client := range []string{"grpc", "grpc-preencoded"} {
		rep, err := Bench(ctx, Options{Addr: e.Addr, Check: true, Shape: shape, Client: client, Load: load})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Checked || rep.Embedded || rep.Sent != 100 || rep.Errors != 0 {
			t.Errorf("%s: checked %v, embedded %v, sent %d, errors %d (first: %s); want checked, remote, 100 sent, none failed",
				client, rep.Checked, rep.Embedded, rep.Sent, rep.Errors, rep.FirstError)
		}
		other := shape
		other.SharedBlocks = 4 // different tokens: the server holds none of these tails
		rep, err = Bench(ctx, Options{Addr: e.Addr, Check: true, Shape: other, Client: client, Load: load})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Errors != rep.Sent || !strings.Contains(rep.FirstError, "longest match") {
			t.Errorf("%s, another shape: %d of %d failed (first: %q), want all, on the longest match", client, rep.Errors, rep.Sent, rep.FirstError)
		}
		rep, err = Bench(ctx, Options{Addr: e.Addr, Shape: other, Client: client, Load: load})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Checked || rep.Errors != 0 {
			t.Errorf("%s, unchecked: checked %v, %d errors, want neither", client, rep.Checked, rep.Errors)
		}
	}
}

func TestBenchNeedsATarget(t *testing.T) {
	_, err := Bench(context.Background(), Options{Shape: DefaultShape(), Load: Config{Rate: 1, Duration: time.Second, Concurrency: 1}})
	if err == nil {
		t.Fatal("Bench without address or embedded server succeeded")
	}
}

func TestBenchRejectsUnknownClient(t *testing.T) {
	_, err := Bench(context.Background(), Options{Embedded: true, Client: "http3", Shape: DefaultShape(), Load: Config{Rate: 1, Duration: time.Second, Concurrency: 1}})
	if err == nil || !strings.Contains(err.Error(), `client "http3"`) {
		t.Fatalf("Bench with client http3: %v, want an error naming the client", err)
	}
}
