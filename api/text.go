package api

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/tokenize"
)

// Tokenizer turns a text prompt into the engine's token ids (the daemon's is
// a tokenize.Client); the server reads the ids only during the call.
type Tokenizer interface {
	// Tokenize returns req's token ids; errors wrap tokenize's sentinels.
	Tokenize(ctx context.Context, req tokenize.Request) ([]uint32, error)
}

// tokenize returns the token ids of req's prompt or messages.
func (s *Server) tokenize(ctx context.Context, req *kvindexv1.ScoreRequest) ([]uint32, error) {
	field := "prompt"
	treq := tokenize.Request{Model: req.GetModel(), Prompt: req.GetPrompt()}
	if msgs := req.GetMessages(); len(msgs) > 0 {
		field = "messages"
		treq.Messages = make([]tokenize.Message, len(msgs))
		for i, m := range msgs {
			if m.GetRole() == "" {
				return nil, status.Errorf(codes.InvalidArgument, "messages[%d].role: required", i)
			}
			treq.Messages[i] = tokenize.Message{Role: m.GetRole(), Content: m.GetContent()}
		}
	}
	if s.opts.Tokenizer == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: this server tokenizes no model (configure models[].tokenizer_urls), send token_ids", field)
	}
	toks, err := s.opts.Tokenizer.Tokenize(ctx, treq)
	if err == nil {
		return toks, nil
	}
	code := codes.Unavailable
	switch {
	case errors.Is(err, tokenize.ErrNoTokenizer):
		code = codes.FailedPrecondition
	case errors.Is(err, tokenize.ErrRejected), errors.Is(err, tokenize.ErrTooLarge):
		code = codes.InvalidArgument
	case errors.Is(err, tokenize.ErrBusy):
		code = codes.ResourceExhausted
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return nil, status.Errorf(code, "%s: %v", field, err)
}
