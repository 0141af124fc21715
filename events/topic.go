package events

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// TopicRoute says which pod and model a push-mode topic belongs to.
type TopicRoute struct {
	Pod, Model string
	// ReplayEndpoint is the pod's DP rank 0 replay socket ("" for none);
	// rank r uses the port offset by r, as vLLM does.
	ReplayEndpoint string
}

// ParseLLMDTopic reads llm-d's "kv@<pod>@<model>"; the model may contain '@'.
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

// OffsetEndpoint returns DP rank r's endpoint as vLLM offsets it: tcp port
// + r, "_dp<r>" appended to ipc:// and inproc:// paths.
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

// SGLang's topic suffixes: "\x00sgl-kv-epoch=<epoch>" (new per engine
// process), and on a snapshot barrier (an empty batch marking where a
// snapshot stands) "\x00sgl-kv-snapshot=<id>".
const (
	sglEpochMarker   = "\x00sgl-kv-epoch="
	sglBarrierMarker = "\x00sgl-kv-snapshot="
)

// SplitTopic splits a topic into the configured topic, SGLang's epoch (nil
// without one) and whether it is a snapshot barrier; results alias topic.
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
