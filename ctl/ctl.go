package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// DefaultAddr is the kvindex gRPC address kvindexctl talks to by default.
const DefaultAddr = "localhost:50051"

// Config is what every kvindexctl command shares: where the server is, how
// long to wait, and how to print.
type Config struct {
	Addr string // the kvindex gRPC address (host:port)
	// Timeout bounds each command's call; 0 means no limit beyond ctx.
	Timeout time.Duration
	// JSON prints the server's answer as protojson instead of a table.
	JSON  bool
	Out   io.Writer
	Stdin io.Reader // read for --tokens-file -
	// Now is the clock for ages like "3s ago"; nil means time.Now.
	Now   func() time.Time
	TLS   TLS
	Token string // a bearer token sent with every call ("" for none)
}

// TLS are kvindexctl's TLS settings.
type TLS struct {
	// On turns TLS on (implied by any file).
	On bool
	// CAFile, CertFile, KeyFile and ServerName: see api.ClientTLS.
	CAFile, CertFile, KeyFile, ServerName string
}

// Enabled reports whether the connection uses TLS.
func (t TLS) Enabled() bool { return t.On || t.CAFile != "" || t.CertFile != "" }

func (t TLS) client() api.ClientTLS {
	return api.ClientTLS{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName}
}

// CallError is a failed call (the command, "workers" or "score") to the
// server at Addr, with the server's own status. Its message is what
// kvindexctl prints.
type CallError struct {
	Call, Addr string
	Status     *status.Status
	err        error
}

// Error renders "score at host:port: InvalidArgument: model: required",
// followed, for a refusal or an unreachable server, by what to do about it
// ("Unavailable: ... (the server cannot be reached: check --addr, ...)").
func (e *CallError) Error() string {
	msg := fmt.Sprintf("%s at %s: %s: %s", e.Call, e.Addr, e.Status.Code(), e.Status.Message())
	if h := hint(e.Status.Code()); h != "" {
		msg += " (" + h + ")"
	}
	return msg
}

// Unwrap returns the client's error.
func (e *CallError) Unwrap() error { return e.err }

// GRPCStatus lets status.Code and status.FromError see the server's status.
func (e *CallError) GRPCStatus() *status.Status { return e.Status }

// callError wraps a failed call of the client.
func callError(call, addr string, err error) error {
	var ce *CallError
	if errors.As(err, &ce) {
		return err // already named
	}
	st, ok := api.ServerStatus(err) // looks through wrapping
	if !ok {
		st = status.Convert(err)
	}
	return &CallError{Call: call, Addr: addr, Status: st, err: err}
}

// writeJSONValue prints v (not a protobuf message) as JSON: indented, or
// on one line (a JSON-lines stream).
func writeJSONValue(w io.Writer, v any, indent bool) error {
	marshal := json.Marshal
	if indent {
		marshal = func(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }
	}
	b, err := marshal(v)
	if err != nil {
		return fmt.Errorf("render JSON: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// deadline bounds ctx by cfg.Timeout, when set.
func (cfg Config) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if cfg.Timeout > 0 {
		return context.WithTimeout(ctx, cfg.Timeout)
	}
	return ctx, func() {}
}

// withClient dials cfg.Addr, runs f under cfg.Timeout, and closes the client.
func withClient(ctx context.Context, cfg Config, f func(context.Context, *api.Client) error) error {
	ctx, cancel := cfg.deadline(ctx)
	defer cancel()
	var opts []grpc.DialOption
	if cfg.TLS.Enabled() {
		o, err := cfg.TLS.client().DialOption()
		if err != nil {
			return err
		}
		opts = append(opts, o)
	}
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(api.NewBearerToken(cfg.Token, cfg.TLS.Enabled())))
	}
	c, err := api.Dial(ctx, cfg.Addr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(ctx, c)
}

func (cfg Config) now() time.Time {
	if cfg.Now != nil {
		return cfg.Now()
	}
	return time.Now()
}

// Workers lists the server's workers (of model, when not empty) on cfg.Out.
func Workers(ctx context.Context, cfg Config, model string) error {
	return printCall(ctx, cfg, "workers", func(ctx context.Context, c *api.Client) (*kvindexv1.ListWorkersResponse, error) {
		return c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Model: model, Digests: true})
	}, func(w io.Writer, resp *kvindexv1.ListWorkersResponse) error { return RenderWorkers(w, resp, cfg.now()) })
}

// printCall makes one call through call and prints its answer: as JSON
// with cfg.JSON, otherwise by render. name names the call in its error.
func printCall[R proto.Message](ctx context.Context, cfg Config, name string, call func(context.Context, *api.Client) (R, error), render func(io.Writer, R) error) error {
	return withClient(ctx, cfg, func(ctx context.Context, c *api.Client) error {
		resp, err := call(ctx, c)
		if err != nil {
			return callError(name, cfg.Addr, err)
		}
		if cfg.JSON {
			return WriteJSON(cfg.Out, resp)
		}
		return render(cfg.Out, resp)
	})
}

// PromptArgs are the prompt flags score, lookup and diagnose share: the
// model, and one of Tokens ("1,2,3"), TokensFile (see ParseTokens),
// Prompt (text the server tokenizes) and MessagesFile (an OpenAI messages
// list); the files "-" for cfg.Stdin.
type PromptArgs struct {
	Model, Tokens, TokensFile, Prompt, MessagesFile string
	LoRA, CacheSalt                                 string // "" for none
}

// prompt builds the ScoreRequest of the prompt alone, reading the tokens
// or messages file if one is named.
func (a PromptArgs) prompt(stdin io.Reader) (*kvindexv1.ScoreRequest, error) {
	var tokens []uint32
	var err error
	given := 0
	for _, f := range []string{a.Tokens, a.TokensFile, a.Prompt, a.MessagesFile} {
		if f != "" {
			given++
		}
	}
	if given > 1 && (a.Prompt != "" || a.MessagesFile != "") {
		return nil, fmt.Errorf("--tokens, --tokens-file, --prompt, --messages-file: give exactly one")
	}
	var msgs []*kvindexv1.ChatMessage
	switch {
	case a.Tokens != "" && a.TokensFile != "":
		return nil, fmt.Errorf("--tokens, --tokens-file: give exactly one")
	case a.Prompt != "":
	case a.MessagesFile != "":
		if msgs, err = readMessages(a.MessagesFile, stdin); err != nil {
			return nil, err
		}
	case a.Tokens != "":
		if tokens, err = ParseTokens(a.Tokens); err != nil {
			return nil, fmt.Errorf("--tokens: %w", err)
		}
	case a.TokensFile != "":
		if tokens, err = ReadTokensFile(a.TokensFile, stdin); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("--tokens or --tokens-file: required (or --prompt or --messages-file)")
	}
	if len(tokens) == 0 && a.Prompt == "" && len(msgs) == 0 {
		return nil, fmt.Errorf("no tokens given")
	}
	return &kvindexv1.ScoreRequest{Model: a.Model, TokenIds: tokens, Prompt: a.Prompt, Messages: msgs, LoraName: a.LoRA, CacheSalt: a.CacheSalt}, nil
}

// ScoreArgs are kvindexctl score's arguments: the prompt's and its own.
type ScoreArgs struct {
	PromptArgs
	Workers []string // candidate workers as "pod/rank" (or "pod" for rank 0)
	Explain bool     // the ranking breakdown per worker
	// Policy and Guard select the ranking ("" for the server's default);
	// setting either ranks every worker of the model.
	Policy, Guard string
}

// Request builds the ScoreRequest that args describe, reading the tokens
// or messages file if one is named.
func (a ScoreArgs) Request(stdin io.Reader) (*kvindexv1.ScoreRequest, error) {
	req, err := a.prompt(stdin)
	if err != nil {
		return nil, err
	}
	req.Explain = a.Explain
	if a.Policy != "" || a.Guard != "" {
		req.Policy = &kvindexv1.ScorePolicy{Name: a.Policy, Guard: a.Guard}
	}
	for _, s := range a.Workers {
		r, err := ParseWorker(s)
		if err != nil {
			return nil, fmt.Errorf("--worker: %w", err)
		}
		req.Workers = append(req.Workers, r)
	}
	return req, nil
}

func readMessages(path string, stdin io.Reader) ([]*kvindexv1.ChatMessage, error) {
	data, err := readFile("--messages-file", path, stdin, maxMessagesBytes)
	if err != nil {
		return nil, err
	}
	if len(data) > maxMessagesBytes {
		return nil, fmt.Errorf("--messages-file %s: over %d bytes", path, maxMessagesBytes)
	}
	var in []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("--messages-file %s: want a JSON array of {\"role\", \"content\"}: %w", path, err)
	}
	if len(in) == 0 {
		return nil, fmt.Errorf("--messages-file %s: no messages", path)
	}
	out := make([]*kvindexv1.ChatMessage, len(in))
	for i, m := range in {
		out[i] = &kvindexv1.ChatMessage{Role: m.Role, Content: m.Content}
	}
	return out, nil
}

// maxMessagesBytes bounds --messages-file.
const maxMessagesBytes = 64 << 20

// Score scores one prompt and prints each worker's match on cfg.Out.
func Score(ctx context.Context, cfg Config, args ScoreArgs) error {
	req, err := args.Request(cfg.Stdin)
	if err != nil {
		return err
	}
	return printCall(ctx, cfg, "score", func(ctx context.Context, c *api.Client) (*kvindexv1.ScoreResponse, error) {
		return c.Score(ctx, req)
	}, func(w io.Writer, resp *kvindexv1.ScoreResponse) error {
		if args.Explain {
			return RenderExplain(w, req, resp)
		}
		return RenderScore(w, req, resp)
	})
}

// hint says what to do about a refused or failed call, by its code.
func hint(c codes.Code) string {
	switch c {
	case codes.Unavailable:
		return "the server cannot be reached: check --addr, that kvindex serve runs, and --tls for a TLS server"
	case codes.Unauthenticated:
		return "the server wants a token: give --token-file or $KVINDEX_TOKEN (or a client certificate)"
	case codes.PermissionDenied:
		return "the token lacks the scope this call needs (read, or route for Route/Release)"
	case codes.ResourceExhausted:
		return "the server is at a limit (overloaded, or too many watches): retry later"
	case codes.DeadlineExceeded:
		return "no answer in time: raise --timeout"
	}
	return ""
}
