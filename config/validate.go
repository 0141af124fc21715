package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/redact"
)

// invalid returns an ErrInvalid naming field, its full path in the YAML
// (e.g. "pods[1].endpoint").
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// hostPort refuses v, the value of field, unless it is host:port.
func hostPort(field, v, or string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return invalid(field, "%q is not host:port%s", v, or)
	}
	return nil
}

// httpURL refuses u, the value of field, unless it is an http(s) URL.
func httpURL(field, u string) error {
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return invalid(field, "%q is not an http(s) URL", u)
	}
	return nil
}

// Validate reports the first problem, naming the field, section by
// section. It checks values as they are: zero fields that SetDefaults
// would fill may be invalid.
func (c *Config) Validate() error {
	if err := hostPort("grpc_listen", c.GRPCListen, ""); err != nil {
		return err
	}
	if c.MetricsListen != MetricsOff {
		if err := hostPort("metrics_listen", c.MetricsListen, " or off"); err != nil {
			return err
		}
	}
	if c.HTTPListen != "" {
		if err := hostPort("http_listen", c.HTTPListen, ""); err != nil {
			return err
		}
	}
	for _, check := range []func() error{
		c.Limits.Validate,
		c.Log.Validate,
		c.Events.Validate,
		c.Scoring.Validate,
		c.Index.Validate,
		func() error { return validateModels(c.Models) },
		func() error { return validatePods(c.Pods) },
		func() error { return validatePush(c) },
		c.TLS.Validate,
		func() error { return c.Auth.Validate(&c.TLS) },
		c.NATS.Validate,
		c.Discovery.Validate,
		c.Tokenize.Validate,
		func() error { return c.Gateway.Validate(c) },
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the tls section.
func (t *TLS) Validate() error {
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return invalid("tls.cert_file", "give both cert_file and key_file")
	case t.ClientCAFile != "" && !t.Enabled():
		return invalid("tls.client_ca_file", "needs cert_file and key_file")
	case t.Metrics && !t.Enabled():
		return invalid("tls.metrics", "needs cert_file and key_file")
	}
	return nil
}

// Validate checks the auth section against the tls section.
func (a *Auth) Validate(t *TLS) error {
	seen := map[string]bool{}
	for i, tok := range a.Tokens {
		f := fmt.Sprintf("auth.tokens[%d]", i)
		switch {
		case tok.Name == "":
			return invalid(f+".name", "required")
		case seen[tok.Name]:
			return invalid(f+".name", "token %q given twice", tok.Name)
		case len(tok.Scopes) == 0:
			return invalid(f+".scopes", "required: read, route or both")
		case (tok.File == "") == (tok.Env == ""):
			return invalid(f+".file", "give exactly one of file and env")
		}
		seen[tok.Name] = true
		for j, sc := range tok.Scopes {
			if sc != "read" && sc != "route" {
				return invalid(fmt.Sprintf("%s.scopes[%d]", f, j), "%q is not read or route", sc)
			}
		}
	}
	if a.CertIdentity && t.ClientCAFile == "" {
		return invalid("auth.cert_identity", "needs tls.client_ca_file")
	}
	return nil
}

// Validate checks the nats section; whether its files can be read is
// checked when the connection opens (fleet.Connect).
func (n *NATS) Validate() error {
	if !n.Enabled() {
		if n.Bucket != "" || len(n.Models) > 0 || n.CredsFile != "" || n.TLS.Enabled() {
			return invalid("nats.url", "required with the other nats settings")
		}
		return nil
	}
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		return invalid("nats.tls.cert_file", "give both cert_file and key_file")
	}
	for _, u := range strings.Split(n.URL, ",") {
		u = strings.TrimSpace(u)
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
			return invalid("nats.url", "%s: want nats://host:port or tls://host:port", redact.URL(u))
		}
		if _, _, err := net.SplitHostPort(u[strings.Index(u, "://")+3:]); err != nil {
			return invalid("nats.url", "%s is not host:port", redact.URL(u))
		}
	}
	if n.RegistrationTTL < time.Second {
		return invalid("nats.registration_ttl", "%v: at least 1s", n.RegistrationTTL)
	}
	for i, m := range n.Models {
		if m == "" {
			return invalid(fmt.Sprintf("nats.models[%d]", i), "empty")
		}
	}
	return nil
}

// ValidateAgent checks what kvindex agent needs beyond Validate: a NATS
// server, and the one pod it sits beside.
func (c *Config) ValidateAgent() (*Pod, error) {
	if !c.NATS.Enabled() {
		return nil, invalid("nats.url", "required by kvindex agent")
	}
	if c.Agent.CheckpointInterval < 0 {
		return nil, invalid("agent.checkpoint_interval", "must not be negative")
	}
	if c.Agent.Pod == "" {
		if len(c.Pods) != 1 {
			return nil, invalid("agent.pod", "required when pods lists %d pods", len(c.Pods))
		}
		return &c.Pods[0], nil
	}
	if p := c.FindPod(c.Agent.Pod); p != nil {
		return p, nil
	}
	return nil, invalid("agent.pod", "%q is not in pods", c.Agent.Pod)
}

// RenameAgentPod names the pod the agent sits beside (agent.pod, or the
// only one) name (kvindex agent --pod-name), so that one configuration
// serves every pod of a vLLM Deployment.
func (c *Config) RenameAgentPod(name string) error {
	p, err := c.ValidateAgent()
	if err != nil {
		return err
	}
	if c.Agent.Pod != "" {
		c.Agent.Pod = name
	}
	p.Name = name
	return nil
}

// Validate checks the limits section.
func (l *Limits) Validate() error {
	if l.MaxTokens < 0 || l.MaxBlockKeys < 0 || l.MaxCandidates < 0 || l.MaxInflight < 0 ||
		l.MaxPending < 0 || l.MaxConcurrent < 0 || l.QueueTarget < 0 || l.MaxQueueDelay < 0 || l.MaxConnections < 0 ||
		l.MaxWatches < 0 || l.MaxTenants < 0 || l.MaxInspect < 0 || l.MaxInspectPending < 0 || l.InspectWait < 0 {
		return invalid("limits", "limits must not be negative")
	}
	return nil
}

// Validate checks the log section.
func (l *Log) Validate() error {
	switch strings.ToLower(l.Level) {
	case "debug", "info", "warn", "error":
	default:
		return invalid("log.level", "%q is not debug, info, warn or error", l.Level)
	}
	if l.Format != "text" && l.Format != "json" {
		return invalid("log.format", "%q is not text or json", l.Format)
	}
	return nil
}

// Validate checks the events section.
func (e *Events) Validate() error {
	if _, err := events.ParseGapPolicy(e.GapPolicy); err != nil {
		return invalid("events.gap_policy", "%q is not reset or keep", e.GapPolicy)
	}
	if e.ReplayTimeout < 0 || e.ReplayConcurrency < 0 || e.QueueSize < 0 || e.StaleAfterSilence < 0 || e.QueueBytes < 0 || e.MaxMessageBytes < 0 {
		return invalid("events", "durations and sizes must not be negative (stale_after_disconnect may be, to disable it)")
	}
	return nil
}

// Validate checks the scoring section: the policy and the medium table it
// makes, and its durations.
func (s *Scoring) Validate() error {
	if _, err := s.policy(); err != nil {
		return invalid("scoring", "%v", err)
	}
	if _, err := s.tiers(); err != nil {
		return invalid("scoring", "%v", err)
	}
	if s.SpeculativeTTL < 0 || s.InflightTTL < 0 || s.ScrapeInterval < 0 {
		return invalid("scoring", "durations must not be negative")
	}
	return nil
}

// Validate checks the index section.
func (ix *Index) Validate() error {
	if ix.MemoryBudgetMiB < 0 {
		return invalid("index.memory_budget_mib", "%d must not be negative", ix.MemoryBudgetMiB)
	}
	return nil
}

// validateModels checks each model and that none is listed twice.
func validateModels(models []Model) error {
	seen := map[string]bool{}
	for i, m := range models {
		f := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			return invalid(f+".name", "required")
		}
		if seen[m.Name] {
			return invalid(f+".name", "model %q listed twice", m.Name)
		}
		seen[m.Name] = true
		if m.BlockSize <= 0 {
			return invalid(f+".block_size", "%d must be positive", m.BlockSize)
		}
		for j, u := range m.TokenizerURLs {
			if err := httpURL(fmt.Sprintf("%s.tokenizer_urls[%d]", f, j), u); err != nil {
				return err
			}
		}
	}
	return nil
}

// validatePods checks each pod, that no name is listed twice, that every
// rank's endpoints exist (the last rank's port must not pass 65535), and
// that no two workers (pod, DP rank) share an event or replay endpoint.
func validatePods(pods []Pod) error {
	seenPod := map[string]bool{}
	seenEndpoint := map[string]string{} // endpoint -> who uses it
	for i, p := range pods {
		f := fmt.Sprintf("pods[%d]", i)
		switch {
		case p.Name == "":
			return invalid(f+".name", "required")
		case seenPod[p.Name]:
			return invalid(f+".name", "pod %q listed twice", p.Name)
		case p.Model == "":
			return invalid(f+".model", "required")
		case p.DPSize < 1 || p.DPSize > maxDPSize:
			return invalid(f+".dp_size", "%d must be between 1 and %d", p.DPSize, maxDPSize)
		}
		seenPod[p.Name] = true
		if err := checkEndpoint(p.Endpoint); err != nil {
			return invalid(f+".endpoint", "%v", err)
		}
		if p.CapacityBlocks < 0 {
			return invalid(f+".capacity_blocks", "%d must not be negative", p.CapacityBlocks)
		}
		if p.MetricsURL != "" {
			if err := httpURL(f+".metrics_url", redact.URL(p.MetricsURL)); err != nil {
				return err
			}
		}
		if p.ReplayEndpoint != "" {
			if err := checkEndpoint(p.ReplayEndpoint); err != nil {
				return invalid(f+".replay_endpoint", "%v", err)
			}
		}
		for r := 0; r < p.DPSize; r++ {
			ep, err := events.OffsetEndpoint(p.Endpoint, r)
			if err != nil {
				return invalid(f+".endpoint", "%v", err)
			}
			if p.ReplayEndpoint != "" {
				rep, err := events.OffsetEndpoint(p.ReplayEndpoint, r)
				if err != nil {
					return invalid(f+".replay_endpoint", "%v", err)
				}
				if other, dup := seenEndpoint[rep]; dup {
					return invalid(f+".replay_endpoint", "%s (rank %d) is also used by %s: leave a gap of dp_size between the event and replay ports", rep, r, other)
				}
				seenEndpoint[rep] = fmt.Sprintf("pod %s replay", p.Name)
			}
			if other, dup := seenEndpoint[ep]; dup {
				return invalid(f+".endpoint", "%s (rank %d) is also used by %s", ep, r, other)
			}
			seenEndpoint[ep] = fmt.Sprintf("pod %s", p.Name)
		}
	}
	return nil
}

// maxDPSize bounds dp_size: the ranks the transport accepts (zmq.MaxDPRank).
const maxDPSize = 1024

// maxPushWorkers bounds push[].max_workers: each worker costs a goroutine,
// a queue and its index entry.
const maxPushWorkers = 4096

// validatePush checks each push listener and its routes; a route may not
// name a pull-mode pod, nor a pod another listener routes (a routed pod
// is claimable only on its listener). A listener binds a port per DP rank,
// none bound by another listener or by kvindex's own listen addresses; a
// route's replay endpoint, offset by rank too, is no other route's nor a
// pull-mode pod's.
func validatePush(c *Config) error {
	pulled := map[string]bool{}
	for _, p := range c.Pods {
		pulled[p.Name] = true
	}
	used := map[string]string{} // engine endpoint -> who uses it
	for _, w := range c.Workers() {
		used[w.Endpoint] = "pod " + w.Worker.String()
		if w.ReplayEndpoint != "" {
			used[w.ReplayEndpoint] = "pod " + w.Worker.String() + " replay"
		}
	}
	binds := bound{}
	for _, l := range [][2]string{{"grpc_listen", c.GRPCListen}, {"metrics_listen", c.MetricsListen}, {"http_listen", c.HTTPListen}, {"gateway.listen", c.Gateway.Listen}} {
		if l[1] != "" && l[1] != MetricsOff {
			binds.add("tcp://"+l[1], l[0])
		}
	}
	routedOn := map[string]int{}
	for i, pl := range c.Push {
		f := fmt.Sprintf("push[%d]", i)
		if err := checkEndpoint(pl.Listen); err != nil {
			return invalid(f+".listen", "%v", err)
		}
		if pl.MaxWorkers < 0 || pl.MaxWorkers > maxPushWorkers {
			return invalid(f+".max_workers", "%d must be between 1 and %d", pl.MaxWorkers, maxPushWorkers)
		}
		if pl.DPSize < 0 || pl.DPSize > maxDPSize {
			return invalid(f+".dp_size", "%d must be between 1 and %d", pl.DPSize, maxDPSize)
		}
		for r := range max(pl.DPSize, 1) {
			field := f + ".dp_size"
			if r == 0 {
				field = f + ".listen"
			}
			ep, err := events.OffsetEndpoint(pl.Listen, r)
			if err != nil {
				return invalid(field, "%v", err)
			}
			if o, ok := binds.add(ep, fmt.Sprintf("%s (rank %d)", f, r)); ok {
				return invalid(field, "%s (rank %d) is also bound by %s: leave dp_size ports free from listen's", ep, r, o)
			}
		}
		for j, a := range pl.Allow {
			if net.ParseIP(a) == nil {
				if _, _, err := net.ParseCIDR(a); err != nil {
					return invalid(fmt.Sprintf("%s.allow[%d]", f, j), "%q is not an IP address or CIDR range", a)
				}
			}
		}
		seenTopic := map[string]bool{}
		for j, r := range pl.Routes {
			rf := fmt.Sprintf("%s.routes[%d]", f, j)
			switch {
			case seenTopic[r.Topic]:
				return invalid(rf+".topic", "topic %q mapped twice", r.Topic)
			case r.Pod == "":
				return invalid(rf+".pod", "required")
			case r.Model == "":
				return invalid(rf+".model", "required")
			case pulled[r.Pod]:
				return invalid(rf+".pod", "pod %q is also a pull-mode pod", r.Pod)
			}
			if li, ok := routedOn[r.Pod]; ok && li != i {
				return invalid(rf+".pod", "pod %q is routed on push[%d] too", r.Pod, li)
			}
			routedOn[r.Pod] = i
			seenTopic[r.Topic] = true
			if err := checkRouteReplay(rf, r, max(pl.DPSize, 1), used); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRouteReplay checks route r's replay endpoint (field rf) at each of
// dp ranks against, and adds it to, the engine endpoints used.
func checkRouteReplay(rf string, r Route, dp int, used map[string]string) error {
	if r.ReplayEndpoint == "" {
		return nil
	}
	if err := checkEndpoint(r.ReplayEndpoint); err != nil {
		return invalid(rf+".replay_endpoint", "%v", err)
	}
	for rank := range dp {
		rep, err := events.OffsetEndpoint(r.ReplayEndpoint, rank)
		if err != nil {
			return invalid(rf+".replay_endpoint", "%v", err)
		}
		if other, dup := used[rep]; dup {
			return invalid(rf+".replay_endpoint", "%s (rank %d) is also used by %s: leave a gap of dp_size between replay ports", rep, rank, other)
		}
		used[rep] = fmt.Sprintf("pod %s replay", r.Pod)
	}
	return nil
}

// bound are the addresses kvindex binds: by tcp port (or whole ipc:// or
// inproc:// endpoint), then host ("" for a wildcard), who binds it.
type bound map[string]map[string]string

// add records endpoint ep (checked by checkEndpoint) bound by who, or
// returns who binds it already: the same tcp port on the same host or
// where either is a wildcard. Port 0 picks a free port and collides with
// nothing.
func (b bound) add(ep, who string) (string, bool) {
	key, host := ep, ""
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		host, key, _ = net.SplitHostPort(rest)
		if host == "*" || host == "0.0.0.0" || host == "::" {
			host = ""
		}
	}
	for h, o := range b[key] {
		if h == host || h == "" || host == "" {
			return o, true
		}
	}
	if key == "0" {
		return "", false
	}
	if b[key] == nil {
		b[key] = map[string]string{}
	}
	b[key][host] = who
	return "", false
}

// checkEndpoint accepts tcp://host:port, ipc://path and inproc://name.
func checkEndpoint(ep string) error {
	switch {
	case ep == "":
		return errors.New("required")
	case strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://"):
		return nil
	case strings.HasPrefix(ep, "tcp://"):
		_, port, err := net.SplitHostPort(ep[len("tcp://"):])
		if err != nil {
			return fmt.Errorf("%q is not tcp://host:port", ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return fmt.Errorf("%q: bad port %q", ep, port)
		}
		return nil
	}
	return fmt.Errorf("%q: want tcp://host:port, ipc://path or inproc://name", ep)
}

// Validate checks the discovery section.
func (d *Discovery) Validate() error {
	switch {
	case d.Kubernetes != nil && d.DNS != nil:
		return invalid("discovery", "give one of kubernetes and dns")
	case d.Kubernetes != nil:
		k := d.Kubernetes
		if k.Selector == "" {
			return invalid("discovery.kubernetes.selector", "required (e.g. app=vllm): without it every pod of the namespace would be indexed")
		}
		if err := checkSelector(k.Selector); err != nil {
			return invalid("discovery.kubernetes.selector", "%q: %v", k.Selector, err)
		}
		if k.Resync < 0 {
			return invalid("discovery.kubernetes.resync", "must not be negative")
		}
		return k.DiscoveredPods.Validate("discovery.kubernetes")
	case d.DNS != nil:
		n := d.DNS
		if n.Name == "" {
			return invalid("discovery.dns.name", "required (the headless service's name)")
		}
		if n.Interval < time.Second {
			return invalid("discovery.dns.interval", "%v: at least 1s", n.Interval)
		}
		if n.Server != "" {
			if err := hostPort("discovery.dns.server", n.Server, ""); err != nil {
				return err
			}
		}
		return n.DiscoveredPods.Validate("discovery.dns")
	}
	return nil
}

// Validate checks the defaults of discovered pods, field being the path
// of their section; discovery checks a pod's annotations with it too.
func (p *DiscoveredPods) Validate(field string) error {
	if p.Model == "" {
		return invalid(field+".model", "required: the model pods serve when they do not say")
	}
	if p.DPSize < 1 || p.DPSize > maxDPSize {
		return invalid(field+".dp_size", "%d must be between 1 and %d", p.DPSize, maxDPSize)
	}
	for _, port := range []struct {
		name string
		v    int
		opt  bool
	}{{"port", p.Port, false}, {"replay_port", p.ReplayPort, true}, {"metrics_port", p.MetricsPort, true}} {
		if (port.opt && port.v == 0) || (port.v >= 1 && port.v+p.DPSize-1 <= 65535) {
			continue
		}
		return invalid(field+"."+port.name, "%d: want a port from 1 to %d (dp_size %d)", port.v, 65536-p.DPSize, p.DPSize)
	}
	if p.ReplayPort != 0 && p.ReplayPort < p.Port+p.DPSize && p.Port < p.ReplayPort+p.DPSize {
		return invalid(field+".replay_port", "%d overlaps the event ports %d-%d: leave a gap of dp_size", p.ReplayPort, p.Port, p.Port+p.DPSize-1)
	}
	if p.CapacityBlocks < 0 {
		return invalid(field+".capacity_blocks", "%d must not be negative", p.CapacityBlocks)
	}
	return nil
}
