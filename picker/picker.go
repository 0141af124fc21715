package picker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/defaults"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// The names GIE's endpoint-picker protocol fixes.
const (
	// DestinationHeader carries the chosen endpoint and its fallbacks,
	// "ip:port,ip:port,...", to the gateway; DestinationKey is its key in
	// the MetadataNamespace dynamic metadata.
	DestinationHeader = "x-gateway-destination-endpoint"
	DestinationKey    = DestinationHeader
	MetadataNamespace = "envoy.lb"
	// SubsetNamespace and SubsetKey are where the request's filter metadata
	// may list the endpoints the picker must choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey is where the response's metadata reports the endpoint that
	// served the request (a fallback when the chosen one failed).
	ServedKey = "x-gateway-destination-endpoint-served"
	// RankHeader names the chosen rank to a vLLM server that serves all its
	// ranks behind one address.
	RankHeader = "x-data-parallel-rank"
)

// Router is what the picker routes with: *api.Server, in process.
type Router interface {
	Route(ctx context.Context, req *kvindexv1.RouteRequest) (*kvindexv1.RouteResponse, error)
	Release(ctx context.Context, req *kvindexv1.ReleaseRequest) (*kvindexv1.ReleaseResponse, error)
}

// Endpoint is one model server address (ip:port) of the pool and the
// kvindex worker and model behind it. An address that serves several DP
// ranks is one Endpoint per rank, with RankHeader set.
type Endpoint struct {
	Address string
	Worker  events.WorkerRef
	Model   string
	// RankHeader sets RankHeader to Worker.DPRank on requests sent here.
	RankHeader bool
}

// BodyMode is the request body mode of the gateway's ext_proc filter.
type BodyMode int

const (
	// FullDuplex is FULL_DUPLEX_STREAMED both ways (GIE's configuration):
	// the request headers are answered once the body is complete, and the
	// body is sent back, chunk by chunk, unchanged.
	FullDuplex BodyMode = iota
	// Buffered is BUFFERED requests and STREAMED responses.
	Buffered
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes = 8 << 20
	DefaultMaxRequests  = 4096
)

// Options configures a Picker.
type Options struct {
	// Endpoints are the pool's servers at the start (see SetEndpoints).
	Endpoints []Endpoint
	// Health, when not nil, gives workers' health: untrusted ones (stale,
	// conflict) are not picked while another endpoint is eligible.
	Health   events.HealthSource
	BodyMode BodyMode
	// MaxBodyBytes bounds a request body (0: DefaultMaxBodyBytes); a
	// longer one is answered 413.
	MaxBodyBytes int64
	// Fallbacks is how many endpoints after the chosen one the answer
	// lists, best first.
	Fallbacks int
	// MaxRequests bounds requests followed at once (0: DefaultMaxRequests);
	// more are answered 429.
	MaxRequests int
	// ReleaseTimeout bounds one Release call (0: 5 s).
	ReleaseTimeout time.Duration
	// Logger receives problems (nil: discarded).
	Logger *slog.Logger
}

// Picker is the ext_proc server. See the package doc.
type Picker struct {
	extprocv3.UnimplementedExternalProcessorServer

	router  Router
	opts    Options // opts.Endpoints is the first set; pool holds the current one
	log     *slog.Logger
	pool    atomic.Pointer[endpointSet]
	prefix  string // of request ids, unique per Picker
	seq     atomic.Uint64
	active  atomic.Int64
	health  *health.Server
	counter counters
	// bodies holds buffers of chunked request bodies, reused once a
	// decision is sent; one over maxPooledBody is not pooled.
	bodies sync.Pool
}

// maxPooledBody bounds a body buffer kept for reuse.
const maxPooledBody = 1 << 20

// endpointSet is one immutable set of the pool's endpoints: a decision
// loads it once and sees it whole, whatever SetEndpoints does meanwhile.
type endpointSet struct {
	list   []Endpoint
	byRef  map[events.WorkerRef]int // index into list
	models []string                 // the endpoints' models, in order of first appearance
}

func newEndpointSet(eps []Endpoint) (*endpointSet, error) {
	s := &endpointSet{list: slices.Clone(eps), byRef: make(map[events.WorkerRef]int, len(eps))}
	for i, e := range s.list {
		if e.Address == "" || e.Model == "" || e.Worker.Pod == "" {
			return nil, fmt.Errorf("picker: endpoint %d (%q): address, model and pod are required", i, e.Address)
		}
		if j, dup := s.byRef[e.Worker]; dup {
			return nil, fmt.Errorf("picker: worker %s behind both %s and %s", e.Worker, s.list[j].Address, e.Address)
		}
		s.byRef[e.Worker] = i
		if !slices.Contains(s.models, e.Model) {
			s.models = append(s.models, e.Model)
		}
	}
	return s, nil
}

// New returns a Picker routing with r among opts.Endpoints. It fails on
// an endpoint without an address, a model or a pod, or a worker listed
// twice.
func New(r Router, opts Options) (*Picker, error) {
	defaults.Positive(&opts.MaxBodyBytes, DefaultMaxBodyBytes)
	defaults.Positive(&opts.MaxRequests, DefaultMaxRequests)
	defaults.Positive(&opts.ReleaseTimeout, 5*time.Second)
	set, err := newEndpointSet(opts.Endpoints)
	if err != nil {
		return nil, err
	}
	p := &Picker{router: r, opts: opts, log: opts.Logger,
		prefix: fmt.Sprintf("gw-%x-", time.Now().UnixNano()), health: health.NewServer()}
	defaults.Zero(&p.log, slog.New(slog.DiscardHandler))
	p.counter.pickSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvindex_gateway_pick_seconds", Help: "Endpoint picker decisions, from the complete body to the destination (tokenization and Route included).",
		Buckets: prometheus.ExponentialBuckets(0.0000625, 2, 16),
	})
	p.bodies.New = func() any {
		b := make([]byte, 0, 64<<10)
		return &b
	}
	p.pool.Store(set)
	for _, svc := range []string{"", "liveness", "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		p.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	return p, nil
}

// SetEndpoints replaces the pool's endpoints for decisions that start
// after it returns. It fails, changing nothing, on an endpoint New would
// refuse.
func (p *Picker) SetEndpoints(eps []Endpoint) error {
	set, err := newEndpointSet(eps)
	if err != nil {
		return err
	}
	p.bodies.New = func() any {
		b := make([]byte, 0, 64<<10)
		return &b
	}
	p.pool.Store(set)
	p.counter.endpointSets.Add(1)
	return nil
}

// Endpoints returns a copy of the pool's current endpoints.
func (p *Picker) Endpoints() []Endpoint { return slices.Clone(p.pool.Load().list) }

// Register registers the ExternalProcessor and the gRPC health service
// (SERVING for "", liveness, readiness and the ext_proc service) on g.
func (p *Picker) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, p)
	healthpb.RegisterHealthServer(g, p.health)
}

// Health returns the health service Register installs; Shutdown it to
// drain.
func (p *Picker) Health() *health.Server { return p.health }

// Active is the number of requests being followed now.
func (p *Picker) Active() int64 { return p.active.Load() }

// stream is one request's state, owned by its Process goroutine.
type stream struct {
	srv      extprocv3.ExternalProcessor_ProcessServer
	method   string
	path     string
	body     []byte
	pooled   *[]byte  // body's buffer, from Picker.bodies; nil when body is a message's own memory
	subset   []string // the gateway's subset hint; nil without one
	id       string   // the request id given to Route; "" until routed
	chosen   string   // the chosen endpoint's address
	released bool
	picked   bool  // the destination was sent
	cuts     []int // full duplex: where each body chunk ends in body, to send it back as it came
}

// Process implements extprocv3.ExternalProcessorServer: one stream per
// HTTP request, in Envoy's order, possibly cut short by the stream's end.
func (p *Picker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	if p.active.Add(1) > int64(p.opts.MaxRequests) {
		p.active.Add(-1)
		p.counter.decisions[decisionBusy].Add(1)
		return p.refuseStream(srv, typev3.StatusCode_TooManyRequests, "kvindex picker: too many requests in flight")
	}
	defer p.active.Add(-1)
	st := &stream{srv: srv}
	ctx := srv.Context()
	defer func() { // the request is no longer in flight, whatever its state
		if st.id != "" && !st.released {
			p.release(ctx, st, releaseCancel)
		}
	}()
	for {
		req, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		if err := p.handle(ctx, st, req); err != nil {
			return err
		}
	}
}

// refuseStream answers a stream's first message with an immediate response.
func (p *Picker) refuseStream(srv extprocv3.ExternalProcessor_ProcessServer, code typev3.StatusCode, msg string) error {
	if _, err := srv.Recv(); err != nil {
		return nil
	}
	return srv.Send(immediate(code, msg))
}

func (p *Picker) handle(ctx context.Context, st *stream, req *extprocv3.ProcessingRequest) error {
	switch m := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		hs := m.RequestHeaders
		st.method, st.path = header(hs.GetHeaders(), ":method"), header(hs.GetHeaders(), ":path")
		st.subset = subset(req.GetMetadataContext())
		if hs.GetEndOfStream() { // no body: pick now
			return p.pickAndAnswer(ctx, st, true)
		}
		if p.opts.BodyMode == Buffered {
			return st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
		}
		return nil // full duplex: answered with the destination once the body is in
	case *extprocv3.ProcessingRequest_RequestBody:
		b := m.RequestBody
		if int64(len(st.body)+len(b.GetBody())) > p.opts.MaxBodyBytes {
			p.counter.decisions[decisionTooLarge].Add(1)
			return st.srv.Send(immediate(typev3.StatusCode_PayloadTooLarge, fmt.Sprintf("kvindex picker: request body over %d bytes", p.opts.MaxBodyBytes)))
		}
		switch {
		case st.body == nil && b.GetEndOfStream():
			st.body = b.GetBody() // the whole body in one message (its own memory): no copy
		case st.pooled == nil && len(b.GetBody()) > 0:
			st.pooled = p.bodies.Get().(*[]byte)
			st.body = append((*st.pooled)[:0], st.body...)
			fallthrough
		default:
			st.body = append(st.body, b.GetBody()...)
		}
		if p.opts.BodyMode == FullDuplex {
			st.cuts = append(st.cuts, len(st.body))
		}
		if !b.GetEndOfStream() {
			if p.opts.BodyMode == Buffered { // BUFFERED_PARTIAL or STREAMED: each chunk answered
				return st.srv.Send(bodyResponse(false, nil, false))
			}
			return nil
		}
		return p.pickAndAnswer(ctx, st, false)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !st.picked {
			if err := p.pickAndAnswer(ctx, st, false); err != nil {
				return err
			}
		}
		return st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if served := servedBy(req.GetMetadataContext()); served != "" && st.chosen != "" && served != st.chosen {
			// A fallback served it: its load was counted on the chosen
			// worker until now (released below at the latest).
			p.counter.decisions[decisionServedFallback].Add(1)
		}
		code, _ := strconv.Atoi(header(m.ResponseHeaders.GetHeaders(), ":status"))
		switch {
		case code >= 400:
			p.release(ctx, st, releaseError)
		case m.ResponseHeaders.GetEndOfStream():
			p.release(ctx, st, releaseEnd)
		}
		return st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		// The first chunk means the prefill is done: the request's
		// uncached tokens no longer load the worker.
		p.release(ctx, st, releaseFirstChunk)
		b := m.ResponseBody
		if p.opts.BodyMode == FullDuplex {
			return st.srv.Send(bodyResponse(true, b.GetBody(), b.GetEndOfStream()))
		}
		return st.srv.Send(bodyResponse(true, nil, false))
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		p.release(ctx, st, releaseEnd)
		return st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil // flow-control and other messages need no answer
}

// pickAndAnswer picks the destination and sends it: on the request
// headers' answer when they are not answered yet (no body, or full
// duplex), else on the body's; in full duplex the body follows unchanged.
func (p *Picker) pickAndAnswer(ctx context.Context, st *stream, headersOnly bool) error {
	st.picked = true
	// Sent (gRPC encodes a message before Send returns) and routed (Route
	// keeps nothing of the prompt's text): the body is no longer needed
	// while the response streams, and its buffer is reused.
	defer func() {
		if st.pooled != nil {
			*st.pooled = st.body[:0]
			if cap(st.body) <= maxPooledBody {
				p.bodies.Put(st.pooled)
			}
		}
		st.body, st.cuts, st.pooled = nil, nil, nil
	}()
	dest, rank, code, msg := p.pick(ctx, st)
	if code != 0 {
		return st.srv.Send(immediate(code, msg))
	}
	mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(DestinationHeader, dest)}}
	if rank >= 0 {
		mut.SetHeaders = append(mut.SetHeaders, setHeader(RankHeader, strconv.Itoa(rank)))
	}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{DestinationKey: structpb.NewStringValue(dest)}}),
	}}
	common := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}
	if headersOnly || p.opts.BodyMode == FullDuplex {
		if err := st.srv.Send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
			DynamicMetadata: meta,
		}); err != nil || headersOnly {
			return err
		}
		// The body, unchanged, in the chunks it came in.
		from := 0
		for i, to := range st.cuts {
			if err := st.srv.Send(bodyResponse(false, st.body[from:to], i == len(st.cuts)-1)); err != nil {
				return err
			}
			from = to
		}
		if len(st.cuts) == 0 {
			return st.srv.Send(bodyResponse(false, nil, true))
		}
		return nil
	}
	return st.srv.Send(&extprocv3.ProcessingResponse{
		Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}},
		DynamicMetadata: meta,
	})
}

// bodyResponse answers a request or response body chunk: with data set
// (full duplex), the chunk to send on; else an empty answer, leaving the
// body as it is.
func bodyResponse(response bool, data []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{}
	if data != nil || eos {
		br.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: data, EndOfStream: eos},
		}}}
	}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
}

func immediate(code typev3.StatusCode, msg string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: code},
		Body:    []byte(msg + "\n"),
		Details: msg,
	}}}
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// header returns the value of key in hs ("" if absent); Envoy sends
// values as raw_value, older ones as value.
func header(hs *corev3.HeaderMap, key string) string {
	for _, h := range hs.GetHeaders() {
		if strings.EqualFold(h.GetKey(), key) {
			if rv := h.GetRawValue(); rv != nil {
				return string(rv)
			}
			return h.GetValue()
		}
	}
	return ""
}

// servedBy returns the endpoint the gateway reports served the request.
func servedBy(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[MetadataNamespace].GetFields()[ServedKey].GetStringValue()
}

// subset returns the gateway's subset hint, nil without one.
func subset(md *corev3.Metadata) []string {
	ns, ok := md.GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil
	}
	out := []string{}
	for _, e := range v.GetListValue().GetValues() {
		if s := strings.TrimSpace(e.GetStringValue()); s != "" {
			out = append(out, s)
		}
	}
	return out
}
