package integration

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/testcerts"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestFleetMTLS: the whole fleet over a NATS server that requires TLS and
// verifies client certificates (mTLS, JetStream on): an agent and a
// replica, each with nats.tls (the CA, its own client certificate), follow
// a DP=2 pod through a random stream; the replica holds what the control
// holds and answers Score with the engine's blocks, and the server saw
// each of them present its certificate.
func TestFleetMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "fleet")
	if err != nil {
		t.Fatal(err)
	}
	srvPair, err := ca.Server("nats")
	if err != nil {
		t.Fatal(err)
	}
	agentPair, err := ca.Client("agent")
	if err != nil {
		t.Fatal(err)
	}
	replicaPair, err := ca.Client("replica")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: srvPair.CertFile, KeyFile: srvPair.KeyFile, CaFile: ca.File, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	port := freePorts(t, 1)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(),
		TLS: true, TLSVerify: true, TLSConfig: tc, TLSTimeout: 2, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(s.Shutdown)
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)

	rig := &fleetRig{t: t, agents: map[string]*agentProc{}}
	rig.direct = newFleet(t, fleetOptions{}, podSpec{name: "p0", dpSize: 2, replayFrames: 4})
	rig.direct.cfg.SetDefaults()
	rig.agents["p0"] = startAgentNATS(t, rig.direct.cfg, "p0", config.NATS{URL: url,
		TLS: config.NATSTLS{CAFile: ca.File, CertFile: agentPair.CertFile, KeyFile: agentPair.KeyFile}})
	rig.direct.start()
	rig.waitSubscribers(2)
	rep := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.NATS = config.NATS{URL: url, RegistrationTTL: 3 * time.Second,
			TLS: config.NATSTLS{CAFile: ca.File, CertFile: replicaPair.CertFile, KeyFile: replicaPair.KeyFile, ServerName: "localhost"}}
	}})
	rep.start()
	rig.replicas = []*fleet{rep}

	w := newWorkload(rig, 21)
	for i := 1; i <= 100; i++ {
		w.step()
		if i%25 == 0 {
			rig.waitConverged(10 * time.Second)
			rig.sameScores(w.samplePrompts(10))
		}
	}
	// A known prompt stored on rank 1: the replica's answer names its
	// blocks.
	eng := &engine{next: 1 << 40}
	prompt := tokens("mtls prompt", 5*blockSize)
	ev, hs := eng.store(0, prompt)
	rig.direct.publish("p0", 1, ev)
	rig.waitConverged(10 * time.Second)
	if n, _ := matched(rep.score(&kvindexv1.ScoreRequest{TokenIds: prompt}), "p0", 1); n != len(hs) {
		t.Fatalf("the replica matches %d blocks of the prompt on p0/1, want %d", n, len(hs))
	}

	cz, err := s.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	var conns []string
	for _, c := range cz.Conns {
		var subjects []string
		for _, pc := range c.TLSPeerCerts {
			subjects = append(subjects, pc.Subject)
		}
		conns = append(conns, fmt.Sprintf("%s %v", c.Name, subjects))
	}
	sort.Strings(conns)
	if want := "[kvindex serve [CN=replica] test agent p0 [CN=agent]]"; fmt.Sprint(conns) != want {
		t.Fatalf("the server's connections and their client certificates: %v, want %s", conns, want)
	}
}
