package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/kvindex/kvindex/config"
)

// DNS resolves a headless service's name every interval; each address is
// one pod.
type DNS struct {
	name     string
	resolver *net.Resolver
	interval time.Duration
	defaults config.DiscoveredPods
}

// NewDNS returns a resolver of cfg.Name; with cfg.Server set every query
// goes to that server, otherwise to the system's resolver.
func NewDNS(cfg *config.DNSDiscovery) *DNS {
	res := net.DefaultResolver
	if cfg.Server != "" {
		server := cfg.Server
		res = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
	}
	return &DNS{name: cfg.Name, resolver: res, interval: cfg.Interval, defaults: cfg.DiscoveredPods}
}

// Run resolves the name at once and then every interval until ctx is
// done, applying each answer to r. A name that does not exist (a headless
// service with no ready pods answers so) empties the set; any other
// failure is counted and leaves the pods as they were.
func (d *DNS) Run(ctx context.Context, r *Reconciler) error {
	tick := time.NewTicker(d.interval)
	defer tick.Stop()
	for {
		snap, err := d.Resolve(ctx)
		switch {
		case err == nil:
			r.Apply(snap)
		case ctx.Err() != nil:
			return nil
		default:
			r.Error(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Resolve looks the name up once and returns its pods, sorted by address.
func (d *DNS) Resolve(ctx context.Context) (Snapshot, error) {
	snap := Snapshot{Gone: ReasonUnresolved}
	addrs, err := d.resolver.LookupNetIP(ctx, "ip", d.name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return snap, nil
		}
		return snap, fmt.Errorf("resolve %s: %w", d.name, err)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	prefix, _, _ := strings.Cut(strings.TrimSuffix(d.name, "."), ".")
	for _, a := range addrs {
		a = a.Unmap()
		name := prefix + "-" + strings.NewReplacer(".", "-", ":", "-").Replace(a.String())
		snap.Ready = append(snap.Ready, podAt(name, a.String(), d.defaults))
	}
	return snap, nil
}
