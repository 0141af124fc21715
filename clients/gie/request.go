package gie

import (
	"net"
	"strconv"
	"strings"

	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// rankSep is what the EPP puts between a pod's name and the index of the
// InferencePool target port an endpoint serves ("vllm-0-rank-1").
const rankSep = "-rank-"

// worker returns the kvindex worker behind ep, or nil: by address in
// Params.Endpoints, else by pod name and rank (see the package doc).
func (s *Scorer) worker(ep fwksched.Endpoint) *kvindexv1.WorkerRef {
	if ep == nil {
		return nil
	}
	md := ep.GetMetadata()
	if md == nil {
		return nil
	}
	if len(s.byAddr) > 0 && md.Address != "" {
		if r, ok := s.byAddr[net.JoinHostPort(md.Address, md.Port)]; ok {
			return r
		}
	}
	name := md.NamespacedName.Name
	pod := md.PodName
	if pod == "" {
		// An endpoint made without a pod name: its name is the pod's,
		// perhaps with the rank suffix.
		pod = name
		if i := strings.LastIndex(name, rankSep); i > 0 {
			pod = name[:i]
		}
	}
	if pod == "" {
		return nil
	}
	var rank uint32
	if tail, ok := strings.CutPrefix(name, pod+rankSep); ok {
		n, err := strconv.ParseUint(tail, 10, 32)
		if err != nil {
			return nil
		}
		rank = uint32(n)
	}
	return &kvindexv1.WorkerRef{Pod: pod, DpRank: rank}
}

// scoreRequest is req's prompt as a ScoreRequest without candidates, and
// false when req carries none kvindex can score (see the package doc).
func (s *Scorer) scoreRequest(req *fwksched.LLMRequest) (*kvindexv1.ScoreRequest, bool) {
	if req == nil {
		return nil, false
	}
	out := &kvindexv1.ScoreRequest{Model: s.model}
	if out.Model == "" {
		out.Model = req.TargetModel
	}
	if out.Model == "" {
		return nil, false
	}
	body := req.Body
	if body != nil {
		out.CacheSalt = body.CacheSalt()
	}
	switch {
	case req.TokenizedPrompt != nil && len(req.TokenizedPrompt.TokenIDs) > 0:
		out.TokenIds = req.TokenizedPrompt.TokenIDs
	case body == nil:
		return nil, false
	case body.ChatCompletions != nil && len(body.ChatCompletions.Messages) > 0:
		msgs := body.ChatCompletions.Messages
		out.Messages = make([]*kvindexv1.ChatMessage, len(msgs))
		for i, m := range msgs {
			out.Messages[i] = &kvindexv1.ChatMessage{Role: m.Role, Content: contentText(m.Content)}
		}
	case body.Completions != nil && body.Completions.Prompt.Raw != "":
		out.Prompt = body.Completions.Prompt.Raw
	case body.Completions != nil && len(body.Completions.Prompt.Strings) > 0 && body.Completions.Prompt.Strings[0] != "":
		out.Prompt = body.Completions.Prompt.Strings[0]
	default:
		return nil, false
	}
	return out, true
}

// contentText is a message's text: the raw string, or its text parts
// joined by newlines (kvindex's ChatMessage.content).
func contentText(c fwksched.Content) string {
	if c.Raw != "" || c.Structured == nil {
		return c.Raw
	}
	var parts []string
	for _, b := range c.Structured {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}
