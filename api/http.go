package api

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/proto/kvindex/v1/kvindexv1connect"
)

// ListenerHTTP names the HTTP/JSON API's refusal counts
// (AuthRefusal.Listener).
const ListenerHTTP = "http"

// HTTPHandler serves the IndexService's unary calls over HTTP with
// Connect's protocol: POST /kvindex.v1.IndexService/<Method>, a JSON body
// (Content-Type: application/json, the message in proto3's JSON mapping)
// or binary protobuf (application/proto), and the answer in the same
// form; gRPC and gRPC-Web clients are served too. An error is an HTTP
// status from its code (InvalidArgument 400, Unauthenticated 401,
// PermissionDenied 403, ResourceExhausted 429, Unavailable 503) and a JSON
// body {"code", "message", "details"}, the message the one gRPC gives.
// Watch, a stream, stays gRPC's.
//
// Every call runs the methods gRPC runs, so validation, limits and answers
// are the same, behind the same guards: auth, when not nil, with the
// scopes of the gRPC methods (refusals counted under ListenerHTTP), and
// the admission control of Score, Route and the inspection calls (a call
// is counted pending from its headers to its answer, as on gRPC, and an
// overload refusal is 429 with the OVERLOADED ErrorInfo detail). A body
// is read up to MaxJSONBytes.
//
// Cost: proto3 JSON is decoded by protobuf-go's reflection (protojson),
// ~0.4 µs a token id, where the gRPC codec takes 2 ns: a 2,048-token
// Score is several times a gRPC one (BenchmarkScoreJSON; benchmarks.md,
// "Score over HTTP/JSON"). It is the API for scripts, curl and routers
// without gRPC; a router on the hot path should speak gRPC.
func (s *Server) HTTPHandler(auth *Auth) http.Handler {
	path, h := kvindexv1connect.NewIndexServiceHandler(connectService{s},
		connect.WithReadMaxBytes(s.MaxJSONBytes()),
		// A Score's answer (a few KB) is sent as it is: gzip costs more
		// than its bytes take on a data-centre link. Large answers
		// (ListWorkers, Dump pages) are compressed when the client
		// accepts gzip.
		connect.WithCompressMinBytes(32<<10),
		connect.WithInterceptors(connect.UnaryInterceptorFunc(s.connectUnary)))
	mux := http.NewServeMux()
	mux.Handle(path, h)
	var l *listenerRefusals
	if auth != nil {
		l = auth.listener(ListenerHTTP)
	}
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if auth != nil {
			name, err := auth.authorize(l, r.URL.Path, r.Header.Values("Authorization"), func() (string, bool) { return certName(r.TLS) })
			if err != nil {
				if status.Code(err) == codes.Unauthenticated {
					w.Header().Set("WWW-Authenticate", `Bearer realm="kvindex"`)
				}
				_ = errw.Write(w, r, toConnect(err))
				return
			}
			ctx = WithIdentity(ctx, name)
		}
		if a := s.admission; a != nil {
			var err error
			if ctx, err = a.tap(ctx, &tap.Info{FullMethodName: r.URL.Path}); err != nil {
				_ = errw.Write(w, r, toConnect(err))
				return
			}
			if cs, ok := ctx.Value(arrivalKey{}).(*callState); ok {
				cs.wire.Store(r.ContentLength) // -1, small, when not announced
			}
			defer a.done(ctx)
		}
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// MaxJSONBytes is the largest request body HTTPHandler reads: the largest
// ScoreRequest the limits allow in JSON (a token id takes at most 11 bytes
// with its comma, a block key, a quoted uint64, 23) plus 1 MiB for
// candidates, loads and extra keys.
func (s *Server) MaxJSONBytes() int {
	return 11*s.opts.MaxTokens + 23*s.opts.MaxBlockKeys + 1<<20
}

// connectUnary runs a Connect call inside the admission control's
// concurrency bound and queueing budget, as the gRPC interceptor does, and
// turns the gRPC status a call fails with into the Connect error of the
// same code, message and details.
func (s *Server) connectUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		var resp connect.AnyResponse
		call := func(ctx context.Context, _ any) (any, error) {
			var err error
			resp, err = next(ctx, req)
			return resp, err
		}
		var err error
		if s.admission != nil {
			_, err = s.admission.interceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: req.Spec().Procedure}, call)
		} else {
			_, err = call(ctx, nil)
		}
		return resp, toConnect(err)
	}
}

// toConnect converts a gRPC status error to a *connect.Error (the codes
// are the same numbers); other errors are returned as they are.
func toConnect(err error) error {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return err
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	ce = connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
	for _, d := range st.Proto().GetDetails() {
		if cd, err := connect.NewErrorDetail(d); err == nil {
			ce.AddDetail(cd)
		}
	}
	return ce
}

// connectService adapts Server to Connect's handler interface: the same
// unary methods; Watch, a stream, stays gRPC's.
type connectService struct{ *Server }

func (connectService) Watch(context.Context, *kvindexv1.WatchRequest, *connect.ServerStream[kvindexv1.WatchResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("kvindex.v1.IndexService.Watch is not implemented"))
}
