package deploy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/internal/netutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/sim/demoload"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/vllmsim"
)

const liveModel = "meta-llama/Llama-3.1-8B-Instruct"

// replicaToken is the secret of the replica's token.
const replicaToken = "s3cret"

// scrape fetches url and returns its metric families by name.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The replica's /metrics takes its tokens (scope read); the others
	// ignore the header.
	req.Header.Set("Authorization", "Bearer "+replicaToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return fams
}

// serveRegistry serves reg's /metrics on a test server.
func serveRegistry(t *testing.T, cs ...prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(cs...)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// nxdomain is an in-process DNS server that knows no name: a headless
// service with no ready pods.
func nxdomain(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestEveryUsedMetricIsExported runs the compose demo's shape in process:
// NATS (JetStream), a simulated vLLM engine (kvsim engine's server), a
// kvindex agent beside it with a checkpoint, a replica (fleet mode, with a
// token, and DNS discovery in direct mode beside it), a direct-mode daemon
// scraping the engine's metrics and the demo's load through the replica;
// then it scrapes each one's /metrics and fails
// naming every metric an alert rule or a dashboard panel uses that none of
// them exports.
func TestEveryUsedMetricIsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS, an engine, an agent, a replica and load")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stops []chan error
	run := func(f func(context.Context) error) {
		ch := make(chan error, 1)
		go func() { ch <- f(ctx) }()
		stops = append(stops, ch)
	}
	defer func() {
		cancel()
		for _, ch := range stops {
			if err := <-ch; err != nil {
				t.Error(err)
			}
		}
	}()

	natsPort, err := netutil.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: natsPort, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)

	base, err := netutil.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	pub, rep := fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)
	eng, err := vllmsim.New(vllmsim.Config{Model: liveModel, Pod: "vllm-0", Publish: pub, Replay: rep, HTTPListen: "127.0.0.1:0", Engine: engine.Config{CacheBlocks: 4000}})
	if err != nil {
		t.Fatal(err)
	}
	run(eng.Run)

	acfg := &config.Config{MetricsListen: "off", Models: []config.Model{{Name: liveModel, BlockSize: 16}},
		Pods:  []config.Pod{{Name: "vllm-0", Model: liveModel, Endpoint: pub, ReplayEndpoint: rep}},
		NATS:  config.NATS{URL: natsURL},
		Agent: config.Agent{Checkpoint: filepath.Join(t.TempDir(), "vllm-0.ckpt"), CheckpointInterval: 200 * time.Millisecond}}
	acfg.SetDefaults()
	if err := acfg.Validate(); err != nil {
		t.Fatal(err)
	}
	anc, err := fleet.Connect(acfg.NATS, "test agent", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer anc.Close()
	agent, err := fleet.NewAgent(ctx, acfg, anc, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(agent.Run)
	agentURL := serveRegistry(t, append(agent.Collectors(), collectors.NewGoCollector())...)

	t.Setenv("KVINDEX_TEST_TOKEN", replicaToken)
	rcfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", Models: []config.Model{{Name: liveModel, BlockSize: 16}},
		NATS:      config.NATS{URL: natsURL},
		Auth:      config.Auth{OpenHealth: true, Tokens: []config.Token{{Name: "load", Scopes: []string{"read", "route"}, Env: "KVINDEX_TEST_TOKEN"}}},
		Discovery: config.Discovery{DNS: &config.DNSDiscovery{Name: "vllm.inference.svc.cluster.local", Server: nxdomain(t), DiscoveredPods: config.DiscoveredPods{Model: liveModel}}}}
	rcfg.SetDefaults()
	if err := rcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	replica, err := daemon.New(rcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(replica.Run)
	// A direct-mode daemon beside it, subscribed to the same engine and
	// scraping its vLLM metrics (metrics_url), as kvindex serve without
	// NATS runs: it exports the engines' own prefix-cache counters.
	dcfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", Models: []config.Model{{Name: liveModel, BlockSize: 16}},
		Pods: []config.Pod{{Name: "vllm-0", Model: liveModel, Endpoint: pub, ReplayEndpoint: rep, MetricsURL: "http://" + eng.Addr() + "/metrics"}}}
	dcfg.SetDefaults()
	if err := dcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	direct, err := daemon.New(dcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(direct.Run)
	kv, err := api.Dial(ctx, replica.GRPCAddr(), grpc.WithPerRPCCredentials(api.NewBearerToken(replicaToken, false)))
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()

	// The load fills the engine's cache; its events reach the replica
	// through the agent.
	load, err := demoload.New(demoload.Config{Model: liveModel, Engines: map[string]string{"vllm-0": "http://" + eng.Addr()},
		Rate: 30, Prefixes: 3, SystemTokens: 256, Duration: 1500 * time.Millisecond}, kv)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if load.Stats().Sent.Load() == 0 || load.Stats().Failed.Load() != 0 {
		t.Fatalf("load: sent %d, failed %d", load.Stats().Sent.Load(), load.Stats().Failed.Load())
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := kv.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{})
		if err == nil && len(resp.GetWorkers()) == 1 && resp.GetWorkers()[0].GetResidentBlocks() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never synced vllm-0: %v %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	directURL := "http://" + direct.MetricsAddr() + "/metrics"
	for deadline := time.Now().Add(15 * time.Second); ; {
		if f := scrape(t, directURL)["kvindex_engine_prefix_cache_queries_total"]; f != nil && len(f.GetMetric()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the direct daemon never exported its scrape of the engine's prefix-cache counters")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// One call refused by authentication, so its counter has a series.
	noToken, err := api.Dial(ctx, replica.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer noToken.Close()
	if _, err := noToken.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{}); err == nil {
		t.Fatal("a call without a token was answered")
	}
	time.Sleep(300 * time.Millisecond) // a checkpoint is written

	exported := map[string]string{}
	for who, url := range map[string]string{
		"replica": "http://" + replica.MetricsAddr() + "/metrics",
		"direct":  directURL,
		"agent":   agentURL,
		"engine":  "http://" + eng.Addr() + "/metrics",
		"load":    serveRegistry(t, load.Collector()),
	} {
		for name, f := range scrape(t, url) {
			if len(f.GetMetric()) == 0 {
				continue // a family with no series cannot be queried
			}
			exported[name] = who
			if f.GetType() == dto.MetricType_HISTOGRAM {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					exported[name+s] = who
				}
			}
		}
	}
	used := usedMetrics(t)
	var missing []string
	for name, where := range used {
		if exported[name] == "" {
			missing = append(missing, fmt.Sprintf("%s (used by %s)", name, strings.Join(where, ", ")))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("%d metrics used by alerts or panels are exported by no replica, direct daemon, agent, engine or load:\n%s", len(missing), strings.Join(missing, "\n"))
	}
	t.Logf("%d metrics used, all exported", len(used))
}
