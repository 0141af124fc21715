package picker

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/tokenize"
)

// body is the part of an OpenAI completions or chat completions body the
// picker reads.
type body struct {
	Model    string                 `json:"model"`
	Prompt   json.RawMessage        `json:"prompt"`
	Messages []tokenize.WireMessage `json:"messages"`
}

// loadOnly is the prompt of a request routed by load alone: one token, no
// full block, so no worker matches and the ranking is by load (and the
// request still counts in flight where it goes).
var loadOnly = []uint32{0}

// prompt fills sr's prompt from the request body. ok is false when the
// body has no prompt the picker can use.
func prompt(raw []byte, sr *kvindexv1.ScoreRequest) (model string, ok bool) {
	b, scanned := scanBody(raw)
	if !scanned {
		b = body{}
		if len(bytes.TrimSpace(raw)) == 0 || json.Unmarshal(raw, &b) != nil {
			return "", false
		}
	}
	switch {
	case b.Messages != nil:
		sr.Messages = make([]*kvindexv1.ChatMessage, len(b.Messages))
		for i := range b.Messages {
			// Shares the body's memory: the stream keeps the body,
			// unchanged, until Route returns, and the tokenizer copies
			// what it keeps (tokenize.Client.Tokenize).
			text, err := b.Messages[i].TextShared()
			if err != nil || b.Messages[i].Role == "" {
				sr.Messages = nil
				return b.Model, false
			}
			sr.Messages[i] = &kvindexv1.ChatMessage{Role: b.Messages[i].Role, Content: text}
		}
		return b.Model, len(sr.Messages) > 0
	case len(b.Prompt) > 0:
		// A string, token ids, or a batch of either (the first is
		// routed: a batch goes to one server).
		if s, ok := tokenize.SharedString(b.Prompt); ok { // shares the body, as a message's text
			sr.Prompt = s
			return b.Model, s != ""
		}
		var s string
		if json.Unmarshal(b.Prompt, &s) == nil {
			sr.Prompt = s
			return b.Model, s != ""
		}
		var ids []uint32
		if json.Unmarshal(b.Prompt, &ids) == nil {
			sr.TokenIds = ids
			return b.Model, len(ids) > 0
		}
		var batch []json.RawMessage
		if json.Unmarshal(b.Prompt, &batch) == nil && len(batch) > 0 {
			sub := body{Model: b.Model, Prompt: batch[0]}
			first, _ := json.Marshal(sub)
			return prompt(first, sr)
		}
	}
	return b.Model, false
}

// pick chooses the destination of st's request: the endpoints value
// (chosen first, then the fallbacks) and, for an address serving several
// ranks, the rank (else -1); or a status for an immediate answer.
func (p *Picker) pick(ctx context.Context, st *stream) (dest string, rank int, code typev3.StatusCode, msg string) {
	start := time.Now()
	defer func() {
		d := time.Since(start)
		p.counter.pickNanos.Add(int64(d))
		p.counter.picks.Add(1)
		p.counter.pickSeconds.Observe(d.Seconds())
	}()
	pool := p.pool.Load() // the whole decision sees one set
	sr := &kvindexv1.ScoreRequest{}
	bodyModel, ok := prompt(st.body, sr)
	model := bodyModel
	if !slices.Contains(pool.models, model) {
		// An adapter's name, or no model: the pool's model, when it has
		// one, with the name as the LoRA adapter.
		if len(pool.models) != 1 {
			p.counter.decisions[decisionNoEndpoint].Add(1)
			return "", -1, typev3.StatusCode_ServiceUnavailable, "kvindex picker: no endpoint serves model " + quote(model)
		}
		model = pool.models[0]
		if bodyModel != "" && sr.TokenIds == nil && ok {
			sr.LoraName = bodyModel
		}
	}
	sr.Model = model
	cands := p.candidates(pool, model, st.subset)
	if len(cands) == 0 {
		p.counter.decisions[decisionNoEndpoint].Add(1)
		return "", -1, typev3.StatusCode_ServiceUnavailable, "kvindex picker: no ready endpoint in the pool"
	}
	sr.Workers = cands
	if !ok {
		p.counter.decisions[decisionLoadOnly].Add(1)
		sr.Prompt, sr.Messages, sr.TokenIds, sr.LoraName = "", nil, loadOnly, ""
	}
	id := p.prefix + strconv.FormatUint(p.seq.Add(1), 10)
	resp, err := p.router.Route(ctx, &kvindexv1.RouteRequest{Score: sr, RequestId: id})
	if err != nil && ok && status.Code(err) != codes.ResourceExhausted {
		// The prompt could not be scored (the tokenizer is down, it is
		// too long for the model): route by load, and let the engine
		// answer a bad prompt.
		p.log.Warn("picker: routing by load alone", "model", model, "err", err)
		p.counter.decisions[decisionLoadOnly].Add(1)
		sr.Prompt, sr.Messages, sr.TokenIds, sr.LoraName = "", nil, loadOnly, ""
		resp, err = p.router.Route(ctx, &kvindexv1.RouteRequest{Score: sr, RequestId: id})
	}
	if err != nil {
		switch status.Code(err) {
		case codes.ResourceExhausted:
			p.counter.decisions[decisionBusy].Add(1)
			return "", -1, typev3.StatusCode_TooManyRequests, "kvindex picker: overloaded"
		default:
			p.log.Warn("picker: no route", "model", model, "err", err)
			p.counter.decisions[decisionNoEndpoint].Add(1)
			return "", -1, typev3.StatusCode_ServiceUnavailable, "kvindex picker: no endpoint: " + status.Convert(err).Message()
		}
	}
	st.id = id
	if ok {
		p.counter.decisions[decisionRouted].Add(1)
	}
	chosen := pool.endpoint(resp.GetChosen())
	if chosen == nil { // Route answers among the candidates: cannot happen
		p.counter.decisions[decisionNoEndpoint].Add(1)
		return "", -1, typev3.StatusCode_ServiceUnavailable, "kvindex picker: the chosen worker has no endpoint"
	}
	dest, rank = chosen.Address, -1
	st.chosen = chosen.Address
	if chosen.RankHeader {
		rank = chosen.Worker.DPRank
	}
	seen := []string{chosen.Address}
	for _, ws := range resp.GetRanking().GetWorkers() {
		if len(seen) > p.opts.Fallbacks {
			break
		}
		e := pool.endpoint(ws.GetWorker())
		if e == nil || slices.Contains(seen, e.Address) {
			continue
		}
		seen = append(seen, e.Address)
		dest += "," + e.Address
	}
	return dest, rank, 0, ""
}

// endpoint is the endpoint of a worker Route answered with (one of the
// candidates, so found), nil for a worker not in the set.
func (s *endpointSet) endpoint(r *kvindexv1.WorkerRef) *Endpoint {
	i, ok := s.byRef[events.WorkerRef{Pod: r.GetPod(), DPRank: int(r.GetDpRank())}]
	if !ok {
		return nil
	}
	return &s.list[i]
}

// candidates are the workers of model's endpoints, within the subset
// hint when there is one, and trusted (not stale, not in conflict) unless
// none is.
func (p *Picker) candidates(pool *endpointSet, model string, hint []string) []*kvindexv1.WorkerRef {
	var good, untrusted []*kvindexv1.WorkerRef
	for i := range pool.list {
		e := &pool.list[i]
		if e.Model != model || (hint != nil && !slices.Contains(hint, e.Address)) {
			continue
		}
		ref := &kvindexv1.WorkerRef{Pod: e.Worker.Pod, DpRank: uint32(e.Worker.DPRank)}
		if p.opts.Health != nil {
			if c := p.opts.Health.Health(e.Worker); c != nil && !c.Load().Trusted() {
				untrusted = append(untrusted, ref)
				continue
			}
		}
		good = append(good, ref)
	}
	if len(good) == 0 {
		if len(untrusted) > 0 {
			p.counter.decisions[decisionStaleOnly].Add(1)
		}
		return untrusted
	}
	return good
}

// release ends st's request's in-flight accounting once, counting why.
func (p *Picker) release(ctx context.Context, st *stream, why releaseReason) {
	if st.id == "" || st.released {
		return
	}
	st.released = true
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.ReleaseTimeout)
	defer cancel()
	if _, err := p.router.Release(rctx, &kvindexv1.ReleaseRequest{RequestId: st.id}); err != nil {
		p.counter.releaseFailures.Add(1)
		p.log.Warn("picker: release failed", "request_id", st.id, "err", err)
		return
	}
	p.counter.releases[why].Add(1)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
