package discovery

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kvindex/kvindex/config"
)

// dnsServer is an in-process DNS server (miekg/dns over UDP on loopback)
// whose answer for one name the test changes.
type dnsServer struct {
	mu    sync.Mutex
	addrs []string // A and AAAA records of the name
	rcode int      // when not success, the answer's code
	addr  string
}

func startDNS(t *testing.T, name string) *dnsServer {
	t.Helper()
	s := &dnsServer{rcode: dns.RcodeSuccess}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = pc.LocalAddr().String()
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		s.mu.Lock()
		defer s.mu.Unlock()
		q := req.Question[0]
		switch {
		case s.rcode != dns.RcodeSuccess:
			m.Rcode = s.rcode
		case q.Name != dns.Fqdn(name):
			m.Rcode = dns.RcodeNameError
		default:
			for _, a := range s.addrs {
				ip := net.ParseIP(a)
				hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 5}
				switch {
				case ip.To4() != nil && q.Qtype == dns.TypeA:
					hdr.Rrtype = dns.TypeA
					m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip.To4()})
				case ip.To4() == nil && q.Qtype == dns.TypeAAAA:
					hdr.Rrtype = dns.TypeAAAA
					m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip})
				}
			}
			if len(s.addrs) == 0 {
				m.Rcode = dns.RcodeNameError // a headless service with no ready pods
			}
		}
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return s
}

func (s *dnsServer) set(rcode int, addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rcode, s.addrs = rcode, addrs
}

// TestDNSResolve asks a real DNS server over UDP: every A and AAAA record
// is a pod named after the service and its address, with the configured
// ports; NXDOMAIN is an empty set, SERVFAIL an error.
func TestDNSResolve(t *testing.T) {
	const name = "vllm.inference.svc.cluster.local"
	srv := startDNS(t, name)
	srv.set(dns.RcodeSuccess, "10.0.0.2", "10.0.0.1", "fd00::7")
	d := NewDNS(&config.DNSDiscovery{Name: name, Server: srv.addr, Interval: time.Second,
		DiscoveredPods: config.DiscoveredPods{Model: "m", Port: 5557, ReplayPort: 5567, MetricsPort: 8000, DPSize: 1}})
	snap, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []config.Pod{
		{Name: "vllm-10-0-0-1", Model: "m", Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5567", MetricsURL: "http://10.0.0.1:8000/metrics", DPSize: 1},
		{Name: "vllm-10-0-0-2", Model: "m", Endpoint: "tcp://10.0.0.2:5557", ReplayEndpoint: "tcp://10.0.0.2:5567", MetricsURL: "http://10.0.0.2:8000/metrics", DPSize: 1},
		{Name: "vllm-fd00--7", Model: "m", Endpoint: "tcp://[fd00::7]:5557", ReplayEndpoint: "tcp://[fd00::7]:5567", MetricsURL: "http://[fd00::7]:8000/metrics", DPSize: 1},
	}
	if !slices.Equal(snap.Ready, want) || snap.Gone != ReasonUnresolved {
		t.Fatalf("snapshot %+v, want %+v", snap, want)
	}
	srv.set(dns.RcodeSuccess)
	if snap, err := d.Resolve(context.Background()); err != nil || len(snap.Ready) != 0 {
		t.Fatalf("NXDOMAIN: %+v %v, want an empty set", snap, err)
	}
	srv.set(dns.RcodeServerFailure)
	if _, err := d.Resolve(context.Background()); err == nil {
		t.Fatal("SERVFAIL: no error")
	}
}

// TestDNSRun re-resolves every interval: pods join as addresses appear,
// stay through a failing server (counted), and leave as unresolved.
func TestDNSRun(t *testing.T) {
	const name = "kv.example.test"
	srv := startDNS(t, name)
	srv.set(dns.RcodeSuccess, "10.1.0.1")
	d := NewDNS(&config.DNSDiscovery{Name: name, Server: srv.addr, Interval: 20 * time.Millisecond, DiscoveredPods: config.DiscoveredPods{Model: "m", Port: 5557, DPSize: 1}})
	fl := &syncFleet{f: newFakeFleet()}
	r := NewReconciler(fl, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, r) }()
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s (pods %v)", what, fl.pods())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("first pod", func() bool { return len(fl.pods()) == 1 })
	srv.set(dns.RcodeSuccess, "10.1.0.1", "10.1.0.2")
	wait("second pod", func() bool { return len(fl.pods()) == 2 })
	srv.set(dns.RcodeServerFailure)
	wait("failures counted", func() bool { return r.Errors() >= 2 })
	if len(fl.pods()) != 2 {
		t.Fatalf("a failing server dropped pods: %v", fl.pods())
	}
	srv.set(dns.RcodeSuccess, "10.1.0.2")
	wait("first pod gone", func() bool { _, ok := fl.pods()["kv-10-1-0-1"]; return !ok && len(fl.pods()) == 1 })
	if got := r.Counts(Leave, ReasonUnresolved); got != 1 {
		t.Fatalf("leave/unresolved = %d, want 1", got)
	}
	if got := r.Counts(Join, ReasonAppeared); got != 2 {
		t.Fatalf("join/appeared = %d, want 2", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
