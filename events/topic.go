package events

import "strings"

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
