package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// rawCodec sends a request's bytes as they are, so a test can put any
// encoding on the wire; replies are decoded by protobuf-go.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b := v.(*[]byte)
	*b = data.Materialize()
	return nil
}

func tag(num protowire.Number, typ protowire.Type) []byte {
	return protowire.AppendTag(nil, num, typ)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func bytesField(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(tag(num, protowire.BytesType), v)
}

// TestMalformedRequestsAreInvalidArgument sends requests whose protobuf
// encoding is broken in one field over real gRPC: each is answered
// InvalidArgument naming that field (grpc-go alone would answer Internal,
// "failed to unmarshal"), the server keeps answering well-formed requests
// after, and a well-formed request on the same connection is unaffected.
func TestMalformedRequestsAreInvalidArgument(t *testing.T) {
	ix := indexer.New(indexer.Config{})
	mustModel(t, ix, "m")
	mustWorker(t, ix, "m", "pod-a", 0)
	f := serve(t, ix, nil, api.Options{})
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	workerRef := func(pod []byte) []byte { return bytesField(1, pod) }
	cases := []struct {
		name, method string
		req          []byte
		want         string // in the status message
	}{
		{"truncated token ids", "Score", cat(bytesField(1, []byte("m")), tag(2, protowire.BytesType), []byte{0x05, 0x01}), "field token_ids"},
		{"bad varint in token ids", "Score", cat(bytesField(1, []byte("m")), bytesField(2, []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80})), "token_ids"},
		{"model not UTF-8", "Score", cat(bytesField(1, []byte{0xff, 0xfe}), bytesField(2, []byte{1, 2})), "field model (invalid UTF-8)"},
		{"a candidate's pod not UTF-8", "Score", cat(bytesField(1, []byte("m")), bytesField(2, []byte{1}), bytesField(6, workerRef([]byte("ok"))), bytesField(6, workerRef([]byte{0xc3}))), "field workers[1].pod (invalid UTF-8)"},
		{"a bad field after one of another wire type", "Score", cat(tag(1, protowire.VarintType), []byte{7}, bytesField(4, []byte{0xff})), "field lora_name (invalid UTF-8)"},
		{"truncated tag", "Score", []byte{0x80}, "field (tag)"},
		{"route model not UTF-8", "Route", bytesField(1, bytesField(1, []byte{0xff})), "malformed RouteRequest: field "},
		{"release truncated", "Release", cat(tag(1, protowire.BytesType), []byte{0x10}), "malformed ReleaseRequest: field "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var reply []byte
			err := conn.Invoke(ctx, "/kvindex.v1.IndexService/"+c.method, c.req, &reply, grpc.ForceCodecV2(rawCodec{}))
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.want) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, c.want)
			}
			if len(st.Message()) > 512 {
				t.Fatalf("status message of %d bytes", len(st.Message()))
			}
		})
	}
	// The server still answers, and a well-formed Score scores.
	resp, err := f.client.Score(context.Background(), &kvindexv1.ScoreRequest{Model: "m", TokenIds: make([]uint32, 2*blockSize)})
	if err != nil || resp.GetPromptBlocks() != 2 {
		t.Fatalf("after malformed requests: %v, %v", resp, err)
	}
}
