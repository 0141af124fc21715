package integration

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// headless is an in-process DNS server (miekg/dns, UDP on loopback)
// answering one name with the A records the test sets, as a headless
// service answers with its ready pods' addresses.
type headless struct {
	mu    sync.Mutex
	addrs []string
	addr  string
}

func startHeadless(t *testing.T, name string) *headless {
	t.Helper()
	h := &headless{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		h.mu.Lock()
		q := req.Question[0]
		if q.Name == dns.Fqdn(name) && q.Qtype == dns.TypeA {
			for _, a := range h.addrs {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(a).To4()})
			}
		}
		if q.Name != dns.Fqdn(name) || len(h.addrs) == 0 {
			m.Rcode = dns.RcodeNameError
		}
		h.mu.Unlock()
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return h
}

func (h *headless) set(addrs ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addrs = addrs
}

// TestDNSDiscoveryJoinsAndLeaves runs the daemon with discovery.dns and no
// pods: engines on 127.0.0.1 and 127.0.0.2 (the same ports, as pods behind
// one headless service) join the index as their addresses appear in DNS,
// each learning what its engine already holds from its replay socket, and
// leave it as they disappear; /metrics counts both.
func TestDNSDiscoveryJoinsAndLeaves(t *testing.T) {
	const name = "vllm.inference.svc.cluster.local"
	h := startHeadless(t, name)
	h.set("127.0.0.1")
	port := freePorts(t, 2)
	pubs := map[string]*enginepub.Publisher{}
	var engines [2]engine
	prompts := map[string][]uint32{}
	for i, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{
			Endpoint: fmt.Sprintf("tcp://%s:%d", ip, port), ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", ip, port+1), Bind: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		podName := "vllm-" + strings.ReplaceAll(ip, ".", "-")
		pubs[podName] = pub
		prompts[podName] = tokens("prompt of "+podName, 8*blockSize)
		ev, _ := engines[i].store(0, prompts[podName])
		if _, err := pub.Publish(&events.Batch{Events: []events.Event{ev}}); err != nil { // before kvindex knows the pod
			t.Fatal(err)
		}
	}
	f := newFleet(t, fleetOptions{configure: func(c *config.Config) {
		c.Discovery.DNS = &config.DNSDiscovery{Name: name, Server: h.addr, Interval: time.Second,
			DiscoveredPods: config.DiscoveredPods{Model: model, Port: port, ReplayPort: port + 1}}
	}})
	f.start()
	for name, pub := range pubs {
		f.pods[name] = &pod{name: name, pubs: []*enginepub.Publisher{pub}}
	}

	holds := func(pod string) int {
		resp := f.score(&kvindexv1.ScoreRequest{TokenIds: prompts[pod]})
		n, _ := matched(resp, pod, 0)
		return n
	}
	f.waitFor(func() bool { return holds("vllm-127-0-0-1") == 8 }, "the first pod to join and learn its blocks")
	if f.d.Index().LookupWorker(events.WorkerRef{Pod: "vllm-127-0-0-2"}) != nil {
		t.Fatal("a pod not in DNS is indexed")
	}
	h.set("127.0.0.1", "127.0.0.2")
	f.waitFor(func() bool { return holds("vllm-127-0-0-2") == 8 }, "the second pod to join and learn its blocks")

	// Live events reach a discovered pod.
	ev, _ := engines[1].store(0, tokens("live", 4*blockSize))
	f.publish("vllm-127-0-0-2", 0, ev)
	if n, _ := matched(f.score(&kvindexv1.ScoreRequest{TokenIds: tokens("live", 4*blockSize)}), "vllm-127-0-0-2", 0); n != 4 {
		t.Fatalf("live batch: matched %d blocks, want 4", n)
	}

	h.set("127.0.0.2")
	f.waitFor(func() bool { return f.d.Index().LookupWorker(events.WorkerRef{Pod: "vllm-127-0-0-1"}) == nil }, "the first pod to leave")
	if n := holds("vllm-127-0-0-1"); n != 0 {
		t.Fatalf("a pod that left still answers with %d blocks", n)
	}
	resp, err := f.client.ListWorkers(context.Background(), &kvindexv1.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ws := resp.GetWorkers(); len(ws) != 1 || ws[0].GetWorker().GetPod() != "vllm-127-0-0-2" {
		t.Fatalf("ListWorkers after the leave: %v", ws)
	}
	m := f.metrics()
	for _, want := range []string{
		`kvindex_discovery_changes_total{change="join",reason="appeared"} 2`,
		`kvindex_discovery_changes_total{change="leave",reason="unresolved"} 1`,
		`kvindex_discovery_pods 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
