package events

import (
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
