// Package envoytest drives an ext_proc server the way Envoy's ext_proc
// filter does, for tests and benchmarks of the endpoint picker: Stream
// replays one HTTP request's message sequence, waits for each answer the
// filter would, and checks what a filter checks. A Stream belongs to one
// goroutine; many Streams may share a client connection.
package envoytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvindex/kvindex/picker"
)

// Decision is what the picker answered for a request.
type Decision struct {
	// Status is the immediate response's HTTP status; 0 when the request
	// was let through.
	Status int
	// Header and Metadata are the destination in the
	// x-gateway-destination-endpoint header and in the envoy.lb dynamic
	// metadata.
	Header, Metadata string
	// Rank is the x-data-parallel-rank header, "" when not set.
	Rank string
	// Elapsed is the decision's latency as the filter sees it: from
	// sending the request's last message (headers or body chunk) to the
	// answer carrying the destination.
	Elapsed time.Duration
}

// Stream is one HTTP request's ext_proc stream.
type Stream struct {
	s      extprocv3.ExternalProcessor_ProcessClient
	mode   picker.BodyMode
	cancel context.CancelFunc
}

// Open starts a request's stream on c; mode is the filter's body mode.
func Open(ctx context.Context, c extprocv3.ExternalProcessorClient, mode picker.BodyMode) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.Process(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("envoytest: open stream: %w", err)
	}
	return &Stream{s: s, mode: mode, cancel: cancel}, nil
}

func headers(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// send sends one message. When the server has ended the stream (a
// refusal: Unauthenticated, PermissionDenied), gRPC's Send says only
// io.EOF; the stream's status, what Envoy's filter acts on, is Recv's
// error, returned instead.
func (s *Stream) send(m *extprocv3.ProcessingRequest) error {
	err := s.s.Send(m)
	if errors.Is(err, io.EOF) {
		if _, rerr := s.s.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// Request sends the request: its headers (POST to path, with the subset
// hint when subset is not nil), then body in chunks of at most chunk
// bytes (0: one), and returns the picker's decision.
func (s *Stream) Request(path string, body []byte, chunk int, subset []string) (Decision, error) {
	hreq := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers:     headers(":method", "POST", ":path", path, ":authority", "gateway", "content-type", "application/json", "x-request-id", "envoy-req"),
		EndOfStream: len(body) == 0,
	}}}
	if subset != nil {
		vals := make([]any, len(subset))
		for i, e := range subset {
			vals[i] = e
		}
		st, err := structpb.NewStruct(map[string]any{picker.SubsetKey: vals})
		if err != nil {
			return Decision{}, err
		}
		hreq.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.SubsetNamespace: st}}
	}
	if err := s.send(hreq); err != nil {
		return Decision{}, fmt.Errorf("envoytest: send request headers: %w", err)
	}
	if len(body) == 0 {
		return s.decision(time.Now())
	}
	if s.mode == picker.Buffered {
		// Envoy waits for the headers' answer before it buffers the body.
		r, err := s.s.Recv()
		if err != nil {
			return Decision{}, fmt.Errorf("envoytest: request headers answer: %w", err)
		}
		if ir := r.GetImmediateResponse(); ir != nil {
			return Decision{Status: int(ir.GetStatus().GetCode())}, nil
		}
		if r.GetRequestHeaders() == nil {
			return Decision{}, fmt.Errorf("envoytest: answered %T to request headers", r.GetResponse())
		}
		chunk = 0 // BUFFERED: the whole body in one message
	}
	if chunk <= 0 {
		chunk = len(body)
	}
	var last time.Time
	for off := 0; off < len(body); off += chunk {
		end := min(off+chunk, len(body))
		last = time.Now()
		if err := s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: body[off:end], EndOfStream: end == len(body),
		}}}); err != nil {
			return Decision{}, fmt.Errorf("envoytest: send request body: %w", err)
		}
	}
	d, err := s.decision(last)
	if err != nil || d.Status != 0 || s.mode == picker.Buffered {
		return d, err
	}
	// Full duplex: the body comes back, and must be unchanged; compared
	// chunk by chunk, without a copy.
	back := 0
	for {
		r, err := s.s.Recv()
		if err != nil {
			return d, fmt.Errorf("envoytest: request body answer: %w", err)
		}
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if r.GetRequestBody() == nil || sr == nil {
			return d, fmt.Errorf("envoytest: answered %T to a full-duplex request body, want a streamed body", r.GetResponse())
		}
		got := sr.GetBody()
		if len(got) > len(body)-back || !bytes.Equal(got, body[back:back+len(got)]) {
			return d, fmt.Errorf("envoytest: the body came back changed at byte %d (a %d-byte chunk; sent %d bytes)", back, len(got), len(body))
		}
		back += len(got)
		if sr.GetEndOfStream() {
			break
		}
	}
	if back != len(body) {
		return d, fmt.Errorf("envoytest: the body came back changed: %d bytes, sent %d", back, len(body))
	}
	return d, nil
}

// decision reads the answer carrying the destination (or an immediate
// response) to the message sent at sent.
func (s *Stream) decision(sent time.Time) (Decision, error) {
	r, err := s.s.Recv()
	if err != nil {
		return Decision{}, fmt.Errorf("envoytest: decision: %w", err)
	}
	elapsed := time.Since(sent)
	if ir := r.GetImmediateResponse(); ir != nil {
		return Decision{Status: int(ir.GetStatus().GetCode()), Elapsed: elapsed}, nil
	}
	var common *extprocv3.CommonResponse
	switch {
	case r.GetRequestHeaders() != nil:
		common = r.GetRequestHeaders().GetResponse()
	case r.GetRequestBody() != nil:
		common = r.GetRequestBody().GetResponse()
	default:
		return Decision{}, fmt.Errorf("envoytest: answered %T, want the destination", r.GetResponse())
	}
	d := Decision{Elapsed: elapsed}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		switch h.GetHeader().GetKey() {
		case picker.DestinationHeader:
			d.Header = string(h.GetHeader().GetRawValue())
		case picker.RankHeader:
			d.Rank = string(h.GetHeader().GetRawValue())
		}
	}
	if ns := r.GetDynamicMetadata().GetFields()[picker.MetadataNamespace]; ns != nil {
		d.Metadata = ns.GetStructValue().GetFields()[picker.DestinationKey].GetStringValue()
	}
	if d.Header == "" || d.Header != d.Metadata {
		return d, fmt.Errorf("envoytest: destination header %q and metadata %q must be set and equal", d.Header, d.Metadata)
	}
	return d, nil
}

// ResponseHeaders sends the upstream's response headers with status;
// eos says the response has no body.
func (s *Stream) ResponseHeaders(status int, eos bool) error {
	return s.ResponseHeadersServed(status, eos, "")
}

// ResponseHeadersServed is ResponseHeaders with the endpoint that served
// the request in the metadata context, as the gateway reports it ("" for
// none).
func (s *Stream) ResponseHeadersServed(status int, eos bool, served string) error {
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headers(":status", strconv.Itoa(status), "content-type", "text/event-stream"), EndOfStream: eos,
	}}}
	if served != "" {
		st, err := structpb.NewStruct(map[string]any{picker.ServedKey: served})
		if err != nil {
			return err
		}
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.MetadataNamespace: st}}
	}
	if err := s.send(req); err != nil {
		return fmt.Errorf("envoytest: send response headers: %w", err)
	}
	r, err := s.s.Recv()
	if err != nil {
		return fmt.Errorf("envoytest: response headers answer: %w", err)
	}
	if r.GetResponseHeaders() == nil {
		return fmt.Errorf("envoytest: answered %T to response headers", r.GetResponse())
	}
	return nil
}

// ResponseChunk sends one response body chunk (eos on the last) and
// checks the answer (the chunk sent back unchanged in full duplex).
func (s *Stream) ResponseChunk(b []byte, eos bool) error {
	if err := s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}); err != nil {
		return fmt.Errorf("envoytest: send response body: %w", err)
	}
	r, err := s.s.Recv()
	if err != nil {
		return fmt.Errorf("envoytest: response body answer: %w", err)
	}
	if r.GetResponseBody() == nil {
		return fmt.Errorf("envoytest: answered %T to a response body", r.GetResponse())
	}
	if s.mode == picker.FullDuplex {
		sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || !bytes.Equal(sr.GetBody(), b) || sr.GetEndOfStream() != eos {
			return fmt.Errorf("envoytest: response chunk not sent back unchanged")
		}
	}
	return nil
}

// Close ends the stream as Envoy does after the response: the send side
// closes, and the server's end is awaited.
func (s *Stream) Close() error {
	defer s.cancel()
	if err := s.s.CloseSend(); err != nil {
		return fmt.Errorf("envoytest: close: %w", err)
	}
	for {
		if _, err := s.s.Recv(); err != nil {
			return nil // io.EOF, or the server's status: either way, ended
		}
	}
}

// Cancel resets the stream, as Envoy does when the client goes away or
// the upstream fails mid-request.
func (s *Stream) Cancel() { s.cancel() }

// Begin sends the request headers and the first part of a body that has
// more to come, without waiting for an answer (in full-duplex mode the
// picker answers once the body is complete): a client that goes away
// mid-upload is then Cancel.
func (s *Stream) Begin(path string, part []byte) error {
	if err := s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headers(":method", "POST", ":path", path, "content-type", "application/json"),
	}}}); err != nil {
		return fmt.Errorf("envoytest: send request headers: %w", err)
	}
	if err := s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: part}}}); err != nil {
		return fmt.Errorf("envoytest: send request body: %w", err)
	}
	return nil
}
