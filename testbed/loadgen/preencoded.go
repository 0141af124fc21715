package loadgen

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// PreencodedScoreDo is ScoreDo with each distinct request encoded once: the
// shape's prompts are a finite set, so every prompt's ScoreRequest is
// marshalled before the run and each call hands grpc-go those bytes
// through a codec that writes them as they are. The calls go over the same
// api.Client connections (grpc-go's transport, kvindex's windows) and each
// reply is decoded by api.Client's codec into a ScoreResponse and checked
// as ScoreDo's are; only the per-call marshalling of the request, about
// half of grpc-go's client CPU for a 32,768-token prompt, is gone. It is
// the generator of the overload rows, which must offer one server core
// three times what it takes from a single generator core.
func PreencodedScoreDo(shape Shape, clients []*api.Client, keys, check bool) (Do, error) {
	reqs, err := scoreRequests(shape, keys)
	if err != nil {
		return nil, err
	}
	codec := grpc.ForceCodecV2(preencodedCodec{replies: api.NewCodec()})
	return func(ctx context.Context, g int, k int64) error {
		i := k % int64(len(reqs))
		c := clients[g%len(clients)]
		resp := new(kvindexv1.ScoreResponse)
		if err := c.Conn().Invoke(ctx, kvindexv1.IndexService_Score_FullMethodName, encoded(reqs[i]), resp, codec); err != nil {
			return fmt.Errorf("loadgen: Score of prompt %d (%d bytes, pre-encoded): %w", i, len(reqs[i]), err)
		}
		if check {
			return checkScore(shape, i, resp)
		}
		return nil
	}, nil
}

// preencodedCodec writes encoded requests as they are and decodes replies
// with replies (api.Codec, the codec api.Client uses).
type preencodedCodec struct{ replies *api.Codec }

// Name returns "proto", the content subtype kvindex's server expects.
func (preencodedCodec) Name() string { return "proto" }

// Marshal returns an encoded request's bytes.
func (preencodedCodec) Marshal(v any) (mem.BufferSlice, error) {
	return marshalEncoded("pre-encoded", v)
}

// Unmarshal decodes a reply.
func (c preencodedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return c.replies.Unmarshal(data, v)
}
