package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/ctl"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files of kvindexctl's output in testdata/ctl")

// timestamps matches the times in kvindexctl's output.
var timestamps = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z|\b\d\d:\d\d:\d\d\.\d{3}\b`)

// golden compares out, with addr and times masked, with
// testdata/ctl/name.golden (rewritten with -update).
func golden(t *testing.T, name, out string, addrs ...string) {
	t.Helper()
	for i, a := range addrs {
		out = strings.ReplaceAll(out, a, []string{"ADDR_A", "ADDR_B"}[i])
	}
	out = timestamps.ReplaceAllString(out, "TIME")
	path := filepath.Join("testdata", "ctl", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./integration -run %s -update)", err, t.Name())
	}
	if out != string(want) {
		t.Errorf("kvindexctl %s output differs from %s:\n--- got\n%s\n--- want\n%s", name, path, out, want)
	}
}

// startTwin starts a second daemon on f's configuration (the same
// engines, its own listeners) and waits until every engine has both
// subscribers.
func startTwin(t *testing.T, f *fleet) *daemon.Daemon {
	t.Helper()
	cfg := *f.cfg
	cfg.GRPCListen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	d, err := daemon.New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	for _, p := range f.pods {
		for _, pub := range p.pubs {
			if err := pub.WaitForSubscribers(wctx, 2); err != nil {
				t.Fatalf("pod %s: %v", p.name, err)
			}
		}
	}
	return d
}

// TestKvindexctlCommands runs each of kvindexctl's inspection commands
// against live daemons fed by simulated engines over ZeroMQ, and compares
// their output with golden files.
func TestKvindexctlCommands(t *testing.T) {
	f := startFleet(t, podSpec{name: "a"}, podSpec{name: "b"})
	replica := startTwin(t, f)
	var ea, eb engine
	prompt := tokens("kvindexctl", 6*blockSize)
	ev, ha := ea.store(0, prompt)
	f.publish("a", 0, ev)
	ev, _ = eb.store(0, prompt[:2*blockSize])
	f.publish("b", 0, ev)
	f.publish("a", 0, removed(ha[4]))
	// The replica applied the same events.
	f.waitFor(func() bool {
		w := replica.Index().LookupWorker(events.WorkerRef{Pod: "a"})
		return w != nil && w.Stats().BlocksRemoved == 1
	}, "the replica to apply a's events")

	addr := f.d.GRPCAddr()
	// run runs one command (as kvindexctl's main does, with its Config)
	// and returns its output.
	run := func(json bool, cmd func(context.Context, ctl.Config) error) string {
		t.Helper()
		var out bytes.Buffer
		cfg := ctl.Config{Addr: addr, Timeout: 5 * time.Second, JSON: json, Out: &out, Stdin: strings.NewReader("")}
		if err := cmd(context.Background(), cfg); err != nil {
			t.Fatalf("kvindexctl: %v\n%s", err, out.String())
		}
		return out.String()
	}
	var toks []string
	for _, x := range prompt {
		toks = append(toks, strconv.FormatUint(uint64(x), 10))
	}
	pa := ctl.PromptArgs{Model: model, Tokens: strings.Join(toks, ",")}

	golden(t, "lookup", run(false, func(ctx context.Context, c ctl.Config) error { return ctl.Lookup(ctx, c, pa) }), addr)
	golden(t, "dump", run(false, func(ctx context.Context, c ctl.Config) error {
		return ctl.Dump(ctx, c, ctl.DumpArgs{Worker: "b/0", PageSize: 1})
	}), addr)
	var hs []string
	for _, h := range ha {
		hs = append(hs, "0x"+strconv.FormatUint(h, 16))
	}
	golden(t, "diagnose", run(false, func(ctx context.Context, c ctl.Config) error {
		return ctl.Diagnose(ctx, c, ctl.DiagnoseArgs{PromptArgs: pa, Worker: "a/0", EngineHashes: strings.Join(hs, ",")})
	}), addr)

	// Equal replicas, then a replica that drifted (a block it lost).
	raddr := replica.GRPCAddr()
	diff := func(json bool, worker string) string {
		return run(json, func(ctx context.Context, c ctl.Config) error {
			return ctl.Diff(ctx, c, ctl.DiffArgs{Other: raddr, Worker: worker})
		})
	}
	golden(t, "diff-equal", diff(false, ""), addr, raddr)
	if err := replica.Index().Apply(events.WorkerRef{Pod: "a"}, &events.Batch{Events: []events.Event{removed(ha[5])}}); err != nil {
		t.Fatal(err)
	}
	golden(t, "diff-drift", diff(false, ""), addr, raddr)
	out := diff(true, "a/0")
	var res ctl.DiffResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Workers) != 1 || res.Workers[0].State != "differs" || res.Workers[0].OnlyA != 1 || res.Workers[0].OnlyB != 0 {
		t.Fatalf("diff --json: %v %s", err, out)
	}

	// watch: the next two events of a, printed as they are applied.
	got := make(chan string, 1)
	go func() {
		var out bytes.Buffer
		cfg := ctl.Config{Addr: addr, Out: &out}
		err := ctl.Watch(context.Background(), cfg, ctl.WatchArgs{Workers: []string{"a/0"}, Hashes: true, Count: 2})
		if err != nil {
			out.WriteString("error: " + err.Error())
		}
		got <- out.String()
	}()
	waitWatchers(t, f, 1)
	ev, _ = ea.store(ha[3], prompt[4*blockSize:5*blockSize])
	f.publish("a", 0, ev)
	f.publish("a", 0, cleared)
	golden(t, "watch", <-got, addr)

	// top: two tables a tenth of a second apart, as JSON lines.
	f.score(&kvindexv1.ScoreRequest{TokenIds: prompt[:2*blockSize]})
	out = run(true, func(ctx context.Context, c ctl.Config) error {
		return ctl.Top(ctx, c, ctl.TopArgs{Interval: 100 * time.Millisecond, Iterations: 2})
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("top: %q", out)
	}
	var rows []ctl.TopRow
	if err := json.Unmarshal([]byte(lines[1]), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("top row JSON: %v %s", err, lines[1])
	}
	if rows[0].Worker != "a/0" || rows[0].Health != "ok" || rows[0].Resident != 0 || rows[0].StaleSecs < 0 {
		t.Errorf("top a/0: %+v", rows[0])
	}
	if rows[1].Worker != "b/0" || rows[1].Resident != 2 || rows[1].HitRatioTotal != 1 {
		t.Errorf("top b/0: %+v (b holds the whole 2-block prompt scored)", rows[1])
	}
	out = run(false, func(ctx context.Context, c ctl.Config) error { return ctl.Top(ctx, c, ctl.TopArgs{Iterations: 1}) })
	if !strings.Contains(squashSpaces(out), "WORKER MODEL HEALTH EVENTS/S RESIDENT GAPS REPLAYS LAST EVENT INFLIGHT HIT% HIT% TOTAL") || !strings.Contains(squashSpaces(out), "b/0 test/model ok 0.0 2 0 0") {
		t.Errorf("top table: %s", out)
	}
}

func squashSpaces(s string) string {
	var ls []string
	for _, l := range strings.Split(s, "\n") {
		ls = append(ls, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(ls, "\n")
}

// TestKvindexctlDiffReplicaAndAgent: in fleet mode, kvindexctl diff
// compares a replica with the agent it follows (the agent's index served
// by agent.grpc_listen): equal worker by worker once converged; the
// agent's index refuses routing.
func TestKvindexctlDiffReplicaAndAgent(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 2})
	w := newWorkload(rig, 3)
	for range 60 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	agentAddr, stop, err := rig.agents["p0"].a.ServeIndex("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	replicaAddr := rig.replicas[0].d.GRPCAddr()
	var out bytes.Buffer
	cfg := ctl.Config{Addr: replicaAddr, Timeout: 5 * time.Second, JSON: true, Out: &out}
	if err := ctl.Diff(context.Background(), cfg, ctl.DiffArgs{Other: agentAddr}); err != nil {
		t.Fatal(err)
	}
	var res ctl.DiffResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Workers) != 2 {
		t.Fatalf("diff: %s", out.String())
	}
	for _, wd := range res.Workers {
		if wd.State != "equal" || wd.DigestA == hexZero {
			t.Errorf("replica vs agent, %s: %+v", wd.Worker, wd)
		}
	}
	c, err := api.Dial(context.Background(), agentAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Route(context.Background(), &kvindexv1.RouteRequest{RequestId: "r", Score: &kvindexv1.ScoreRequest{Model: model, TokenIds: tokens("x", blockSize)}}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Route at the agent: %v, want PermissionDenied", err)
	}

	// With auth.tokens the agent's index takes the same tokens as kvindex
	// serve: kvindexctl diff with a read token, nothing without one.
	t.Setenv("KVINDEX_TEST_READ", readSecret)
	auth, err := daemon.NewAuth(&config.Auth{Tokens: []config.Token{{Name: "dashboards", Scopes: []string{"read"}, Env: "KVINDEX_TEST_READ"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	securedAddr, stopSecured, err := rig.agents["p0"].a.ServeIndex("127.0.0.1:0", auth.ListenerOptions(api.ListenerGRPC)...)
	if err != nil {
		t.Fatal(err)
	}
	defer stopSecured()
	anon := ctl.Config{Addr: securedAddr, Timeout: 5 * time.Second, Out: &out}
	if err := ctl.Workers(context.Background(), anon, ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the agent's index without a token: %v, want Unauthenticated", err)
	}
	out.Reset()
	cfg.Token = readSecret
	if err := ctl.Diff(context.Background(), cfg, ctl.DiffArgs{Other: securedAddr}); err != nil {
		t.Fatalf("kvindexctl diff with a read token: %v", err)
	}
}

const hexZero = "0000000000000000"
