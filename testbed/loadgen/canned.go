package loadgen

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Canned is the floor of the gRPC rows: a grpc-go server that answers
// every Score with one response, the real answer to the shape's first
// prompt computed once at start, and does nothing else. What kvindex's
// server costs beyond it is kvindex's; what both cost (grpc-go's HTTP/2
// transport, loopback TCP, the request's and the answer's bytes) is the
// floor. To keep it a floor and not a straw man, it has the same grpc-go
// transport settings as kvindex's server (api.Server's GRPCOptions), a
// codec that neither decodes the request (it only takes its length) nor
// encodes the answer, and none of the server's interceptors; the index
// the answer was computed on is dropped before serving, so its heap costs
// the floor no collection work.
//
// Every prompt of a Shape has the same longest match, so the canned
// answer passes the generator's --check; the answers to other prompts
// differ only in which workers rank first, not in size
// (TestCannedAnswer checks both).
type Canned struct {
	*server
	Response []byte // the encoded ScoreResponse every call gets
}

// StartCanned computes the answer to shape's first prompt on an index
// loaded with shape, drops the index and serves that answer on listen
// ("host:port"; "" means a free loopback port). Close stops it.
func StartCanned(ctx context.Context, shape Shape, listen string) (*Canned, error) {
	resp, err := cannedAnswer(ctx, shape)
	if err != nil {
		return nil, err
	}
	runtime.GC()
	debug.FreeOSMemory()
	// Only this api.Server's transport settings are used: the last codec
	// option wins, and score calls no interceptor.
	transport := api.NewServer(indexer.New(indexer.Config{}), nil, api.Options{Admission: api.AdmissionOptions{Off: true}})
	g := grpc.NewServer(append(transport.GRPCOptions(), grpc.ForceServerCodecV2(cannedCodec{}))...)
	c := &Canned{Response: resp}
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: kvindexv1.IndexService_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Score", Handler: c.score}},
		Metadata:    kvindexv1.IndexService_ServiceDesc.Metadata,
	}, struct{}{})
	if c.server, err = serve(ctx, g, listen); err != nil {
		return nil, err
	}
	return c, nil
}

// cannedAnswer is a kvindex server's encoded answer to shape's first
// prompt.
func cannedAnswer(ctx context.Context, shape Shape) ([]byte, error) {
	ix := indexer.New(indexer.Config{})
	if err := shape.Load(ix); err != nil {
		return nil, err
	}
	resp, err := api.NewServer(ix, nil, api.Options{}).Score(ctx, scoreMessages(shape, false)[0])
	if err != nil {
		return nil, fmt.Errorf("loadgen: canned server: the answer to prompt 0: %w", err)
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		return nil, fmt.Errorf("loadgen: canned server: encode the answer to prompt 0: %w", err)
	}
	return b, nil
}

func (c *Canned) score(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var req cannedRequest
	if err := dec(&req); err != nil {
		return nil, err
	}
	return encoded(c.Response), nil
}

// cannedRequest is a request the canned server has read: its length.
type cannedRequest struct{ n int }

// encoded is a message already encoded: the canned server's answers and
// the pre-encoded generator's requests.
type encoded []byte

// marshalEncoded returns an encoded message's bytes, shared by every call
// that sends it (a SliceBuffer's Free does nothing). who names the codec.
func marshalEncoded(who string, v any) (mem.BufferSlice, error) {
	r, ok := v.(encoded)
	if !ok {
		return nil, fmt.Errorf("loadgen: %s codec: cannot encode %T, only encoded messages", who, v)
	}
	return mem.BufferSlice{mem.SliceBuffer(r)}, nil
}

// cannedCodec is the canned server's codec: requests are read as their
// length, answers written as they are.
type cannedCodec struct{}

// Name returns "proto", the content subtype the clients send.
func (cannedCodec) Name() string { return "proto" }

// Marshal returns an encoded answer's bytes.
func (cannedCodec) Marshal(v any) (mem.BufferSlice, error) { return marshalEncoded("canned", v) }

// Unmarshal notes the request's length.
func (cannedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*cannedRequest)
	if !ok {
		return fmt.Errorf("loadgen: canned codec: cannot decode into %T", v)
	}
	r.n = data.Len()
	return nil
}
