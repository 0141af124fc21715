package vllmsim

import "github.com/kvindex/kvindex/tokenize/standin"

// Tokenizer is the handler of /tokenize and the render endpoints.
func (s *Server) Tokenizer() *standin.Handler { return s.tok }
