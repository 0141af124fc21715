package discovery

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/config"
)

// The pod annotations Kubernetes discovery reads; each overrides the
// configured default of discovery.kubernetes.
const (
	// AnnotationModel is the model the pod serves (vLLM's served model
	// name).
	AnnotationModel = "kvindex.io/model"
	// AnnotationPort is rank 0's KV event PUB port.
	AnnotationPort = "kvindex.io/kv-events-port"
	// AnnotationReplayPort is rank 0's replay port ("0": none).
	AnnotationReplayPort = "kvindex.io/replay-port"
	// AnnotationMetricsPort is the port of vLLM's /metrics ("0": none).
	AnnotationMetricsPort = "kvindex.io/metrics-port"
	// AnnotationDPSize is the pod's data-parallel size.
	AnnotationDPSize = "kvindex.io/dp-size"
	// AnnotationCapacityBlocks bounds each of the pod's workers' blocks.
	AnnotationCapacityBlocks = "kvindex.io/capacity-blocks"
)

// Pod is what discovery reads of a Kubernetes pod.
type Pod struct {
	Name, Namespace     string
	Labels, Annotations map[string]string
	// Terminating says metadata.deletionTimestamp is set.
	Terminating bool
	// Phase is status.phase ("Running", "Pending", ...).
	Phase string
	// IP is status.podIP.
	IP string
	// Ready says the condition of type Ready has status "True".
	Ready bool
}

// Endpoint is one model server address of an InferencePool and the
// kvindex worker, or workers, behind it.
type Endpoint struct {
	// Address is ip:port.
	Address string
	// Pod is the Kubernetes pod's name: the kvindex pod (the name
	// Kubernetes discovery gives its workers too).
	Pod   string
	Model string
	// DPRank is the rank this address serves, unless AllRanks.
	DPRank int
	// AllRanks says the address serves ranks 0..DPSize-1 (vLLM's internal
	// DP load balancing): the picker names the rank in a header.
	AllRanks bool
	DPSize   int
}

// PodFromKubernetes is the pod configuration of a Kubernetes pod, with
// ReasonAppeared, or the reason it is not to be indexed: not Running, not
// Ready or without an IP, terminating, or annotations that do not
// describe a valid pod (ReasonInvalid).
func PodFromKubernetes(p Pod, d config.DiscoveredPods) (config.Pod, Reason) {
	if why := podState(p); why != ReasonAppeared {
		return config.Pod{}, why
	}
	a := p.Annotations
	if m := a[AnnotationModel]; m != "" {
		d.Model = m
	}
	for _, f := range []struct {
		key string
		v   *int
	}{{AnnotationPort, &d.Port}, {AnnotationReplayPort, &d.ReplayPort}, {AnnotationMetricsPort, &d.MetricsPort}, {AnnotationDPSize, &d.DPSize}, {AnnotationCapacityBlocks, &d.CapacityBlocks}} {
		s, ok := a[f.key]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return config.Pod{}, ReasonInvalid
		}
		*f.v = n
	}
	if d.Validate("pod") != nil {
		return config.Pod{}, ReasonInvalid
	}
	return podAt(p.Name, p.IP, d), ReasonAppeared
}

// podAt is the pod configuration of pod name at ip with d's ports.
func podAt(name, ip string, d config.DiscoveredPods) config.Pod {
	hostport := func(port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	p := config.Pod{Name: name, Model: d.Model, Endpoint: "tcp://" + hostport(d.Port), DPSize: d.DPSize, CapacityBlocks: d.CapacityBlocks}
	if d.ReplayPort != 0 {
		p.ReplayEndpoint = "tcp://" + hostport(d.ReplayPort)
	}
	if d.MetricsPort != 0 {
		p.MetricsURL = "http://" + hostport(d.MetricsPort) + "/metrics"
	}
	return p
}

// PoolEndpoints are the endpoints of the Ready pods of list at ports, in
// pod name order, and how many pods are not endpoints (not Running and
// Ready, terminating, annotations that do not parse, or a dp-size that
// several ports contradict). model and dpSize apply unless the pod's
// annotations say otherwise.
func PoolEndpoints(list []Pod, ports []int, model string, dpSize int) (eps []Endpoint, excluded int) {
	list = slices.Clone(list)
	slices.SortFunc(list, func(a, b Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range list {
		if podState(p) != ReasonAppeared {
			excluded++
			continue
		}
		m, dp := model, dpSize
		if a := p.Annotations[AnnotationModel]; a != "" {
			m = a
		}
		if a, ok := p.Annotations[AnnotationDPSize]; ok {
			n, err := strconv.Atoi(strings.TrimSpace(a))
			if err != nil || n < 1 {
				excluded++
				continue
			}
			dp = n
		} else if len(ports) > 1 {
			dp = len(ports)
		}
		if m == "" || (len(ports) > 1 && dp != len(ports)) {
			excluded++
			continue
		}
		if len(ports) == 1 {
			eps = append(eps, Endpoint{Address: net.JoinHostPort(p.IP, strconv.Itoa(ports[0])), Pod: p.Name, Model: m, AllRanks: dp > 1, DPSize: dp})
			continue
		}
		for r, port := range ports {
			eps = append(eps, Endpoint{Address: net.JoinHostPort(p.IP, strconv.Itoa(port)), Pod: p.Name, Model: m, DPRank: r, DPSize: dp})
		}
	}
	return eps, excluded
}

// podState is ReasonAppeared for a pod that serves (Running, Ready, with
// an IP, not terminating), else why not.
func podState(p Pod) Reason {
	switch {
	case p.Terminating:
		return ReasonTerminating
	case p.Phase != "Running":
		return ReasonNotRunning
	case !p.Ready || p.IP == "":
		return ReasonNotReady
	}
	return ReasonAppeared
}
