package loadgen

import (
	"google.golang.org/grpc/mem"

	"github.com/kvindex/kvindex/api"
)

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
