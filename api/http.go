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

// ListenerHTTP names the HTTP/JSON API's refusal counts.
const ListenerHTTP = "http"

// HTTPHandler serves the unary calls with Connect's protocol: POST
// /kvindex.v1.IndexService/<Method>, JSON (proto3 mapping) or binary
// protobuf, answered in kind; gRPC and gRPC-Web clients too. Errors are HTTP
// statuses from their code (400, 401, 403, 429, 503) with a JSON body
// {"code", "message", "details"}. Watch stays gRPC's.
//
// Calls run the gRPC methods behind the same guards: auth (when not nil;
// refusals under ListenerHTTP) and admission control (an overload is 429
// with the OVERLOADED detail). Bodies are read up to MaxJSONBytes. JSON costs
// ~0.4 µs a token id against the codec's 2 ns (BenchmarkScoreJSON): routers
// on the hot path should speak gRPC.
func (s *Server) HTTPHandler(auth *Auth) http.Handler {
	path, h := kvindexv1connect.NewIndexServiceHandler(connectService{s},
		connect.WithReadMaxBytes(s.MaxJSONBytes()),
		// A Score's few KB are cheaper sent than gzipped; large answers
		// (ListWorkers, Dump pages) are compressed.
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

// MaxJSONBytes is the largest body HTTPHandler reads: the largest JSON
// ScoreRequest the limits allow (11 bytes a token id, 23 a block key) plus 1 MiB.
func (s *Server) MaxJSONBytes() int {
	return 11*s.opts.MaxTokens + 23*s.opts.MaxBlockKeys + 1<<20
}

// connectUnary runs a Connect call inside admission control, as the gRPC
// interceptor does, and turns its gRPC status into a Connect error.
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

// toConnect converts a gRPC status error to a *connect.Error (same codes).
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

// connectService adapts Server to Connect's handler; Watch stays gRPC's.
type connectService struct{ *Server }

func (connectService) Watch(context.Context, *kvindexv1.WatchRequest, *connect.ServerStream[kvindexv1.WatchResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("kvindex.v1.IndexService.Watch is not implemented"))
}
