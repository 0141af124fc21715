package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// holdToxic stops a stream without losing a byte: it reads nothing, so
// the link's earlier stages block and TCP's windows fill, as when packets
// are dropped and retransmitted; when it is removed, toxiproxy moves what
// waited into the next stage, in order. Toxiproxy's own "timeout" toxic
// drops the bytes instead, which cuts whole protocol messages out of a
// live TCP stream: no network does that, and a NATS connection that lost
// a SUB that way would never learn it.
type holdToxic struct{}

// Pipe implements toxics.Toxic.
func (holdToxic) Pipe(stub *toxics.ToxicStub) { <-stub.Interrupt }

func init() {
	toxics.Register("hold", new(holdToxic))
	// Toxiproxy's bandwidth toxic logs through zerolog's global logger.
	zerolog.SetGlobalLevel(zerolog.Disabled)
}

// Stream directions of a link, as toxiproxy names them: upstream carries
// the client's bytes to the server, downstream the server's to the client.
const (
	Upstream   = "upstream"
	Downstream = "downstream"
)

// Net is the fleet's fault-injecting network: one toxiproxy proxy per
// link, in this process, with toxics added and removed by name. Its
// methods are safe for concurrent use.
type Net struct {
	srv *toxiproxy.ApiServer

	mu    sync.Mutex // guards links
	links map[string]*Link
}

// NewNet returns an empty network.
func NewNet() *Net {
	return &Net{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), links: map[string]*Link{}}
}

// Link is one proxied TCP path: clients connect to Listen, and each of
// their connections is relayed to Upstream.
type Link struct {
	Name     string
	Listen   string // host:port
	Upstream string // host:port
	p        *toxiproxy.Proxy

	mu     sync.Mutex // guards down
	down   bool
	toxics map[string]bool
}

// Add starts the link name listening on listen (host:port) and relaying
// to upstream.
func (n *Net) Add(name, listen, upstream string) (*Link, error) {
	p := toxiproxy.NewProxy(n.srv, name, listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("chaos: link %s on %s: %w", name, listen, err)
	}
	l := &Link{Name: name, Listen: p.Listen, Upstream: upstream, p: p, toxics: map[string]bool{}}
	n.mu.Lock()
	n.links[name] = l
	n.mu.Unlock()
	return l, nil
}

// Link returns the link name, or nil.
func (n *Net) Link(name string) *Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.links[name]
}

// Close stops every link and closes its connections.
func (n *Net) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.links {
		l.p.Stop()
	}
}

// Toxic is one toxic: a toxiproxy type ("latency", "bandwidth",
// "reset_peer", or this package's "hold") on one direction, with the
// type's attributes.
type Toxic struct {
	Name   string
	Type   string
	Stream string
	Attrs  map[string]int64
}

// AddToxic adds t to every connection of the link, present and future.
func (l *Link) AddToxic(t Toxic) error {
	b, err := json.Marshal(map[string]any{"name": t.Name, "type": t.Type, "stream": t.Stream, "toxicity": 1.0, "attributes": t.Attrs})
	if err != nil {
		return fmt.Errorf("chaos: link %s: toxic %s: %w", l.Name, t.Name, err)
	}
	if _, err := l.p.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		return fmt.Errorf("chaos: link %s: add toxic %s (%s %s %v): %w", l.Name, t.Name, t.Type, t.Stream, t.Attrs, err)
	}
	l.mu.Lock()
	l.toxics[t.Name] = true
	l.mu.Unlock()
	return nil
}

// RemoveToxic removes the toxic name; bytes a hold kept flow on, in order.
func (l *Link) RemoveToxic(name string) error {
	if err := l.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		return fmt.Errorf("chaos: link %s: remove toxic %s: %w", l.Name, name, err)
	}
	l.mu.Lock()
	delete(l.toxics, name)
	l.mu.Unlock()
	return nil
}

// Toxics returns the names of the toxics on the link.
func (l *Link) Toxics() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for n := range l.toxics {
		out = append(out, n)
	}
	return out
}

// Down stops the link: its connections close and new ones are refused,
// as when the path to a host is down.
func (l *Link) Down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down {
		l.p.Stop()
		l.down = true
	}
}

// Up starts a stopped link again on the same address.
func (l *Link) Up() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down {
		return nil
	}
	if err := l.p.Start(); err != nil {
		return fmt.Errorf("chaos: link %s: up again on %s: %w", l.Name, l.Listen, err)
	}
	l.down = false
	return nil
}
