package events

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// TopicRoute says which pod and model a push-mode topic belongs to.
type TopicRoute struct {
	// Pod is the pod the topic's messages come from.
	Pod string
	// Model is the model the pod serves.
	Model string
	// ReplayEndpoint is the pod's replay socket for DP rank 0 ("" for none);
	// rank r uses the port offset by r, as vLLM does.
	ReplayEndpoint string
}

// ParseLLMDTopic reads llm-d's topic convention "kv@<pod>@<model>" (pod is
// often "<ip>:<port>"). The model may itself contain '@'; the pod may not.
func ParseLLMDTopic(topic string) (pod, model string, ok bool) {
	rest, found := strings.CutPrefix(topic, "kv@")
	if !found {
		return "", "", false
	}
	pod, model, found = strings.Cut(rest, "@")
	if !found || pod == "" || model == "" {
		return "", "", false
	}
	return pod, model, true
}

// OffsetEndpoint returns the endpoint DP rank r uses, the way vLLM offsets
// it: tcp port + r, and "_dp<r>" appended to ipc:// and inproc:// paths
// (rank 0 keeps the endpoint as is).
func OffsetEndpoint(endpoint string, r int) (string, error) {
	if r == 0 {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		return endpoint + "_dp" + strconv.Itoa(r), nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if i < 0 {
		return "", fmt.Errorf("events: endpoint %q has no port", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port <= 0 || port+r > 65535 {
		return "", fmt.Errorf("events: endpoint %q: port %q cannot be offset by rank %d", endpoint, endpoint[i+1:], r)
	}
	return endpoint[:i+1] + strconv.Itoa(port+r), nil
}

// SGLang's topic markers: its live topic is the configured topic followed
// by "\x00sgl-kv-epoch=<epoch>" (a new epoch per engine process), and a
// snapshot barrier, a batch with no events that marks where a snapshot
// stands in the stream, adds "\x00sgl-kv-snapshot=<id>".
const (
	sglEpochMarker   = "\x00sgl-kv-epoch="
	sglBarrierMarker = "\x00sgl-kv-snapshot="
)

// SplitTopic splits a message topic into the configured topic and
// SGLang's suffixes: the engine's lifecycle epoch ("" without one) and
// whether the message is a snapshot barrier. The results alias topic.
func SplitTopic(topic []byte) (base, epoch []byte, barrier bool) {
	i := bytes.Index(topic, []byte(sglEpochMarker))
	if i < 0 {
		return topic, nil, false
	}
	base, epoch = topic[:i], topic[i+len(sglEpochMarker):]
	if j := bytes.Index(epoch, []byte(sglBarrierMarker)); j >= 0 {
		epoch, barrier = epoch[:j], true
	}
	return base, epoch, barrier
}
