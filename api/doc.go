// Package api serves kvindex's gRPC contract (kvindex.v1.IndexService) over
// an indexer.Index, and gives Go routers a small client for it.
//
// Server validates requests (every rejection is codes.InvalidArgument with
// a message that starts with the field at fault), computes a prompt's block
// keys with indexer.PromptKeys, and turns indexer.Index.Match into per-worker
// scores. It also registers the standard gRPC health service and server
// reflection, so that grpcurl and Kubernetes probes work out of the box.
// Client wraps a grpc.ClientConn for routers and for kvindexctl.
//
// A prompt may also come as text (ScoreRequest.prompt) or as a chat
// (messages): Options.Tokenizer, the daemon's tokenize.Client, has the
// model's own vLLM server tokenize it (cached), so the token ids are the
// engine's. The call then waits for that round trip on a cache miss,
// inside the admission control's bounds like any Score.
//
// The operator's calls (Lookup, Dump, Diagnose, Watch; inspect.go) sit
// beside the router's: each is bounded (holder entries, page size, queue
// and stream count), read-only, and off the Score path. Their logic lives
// in indexer (Index.Lookup, Worker.Resident, Index.Diagnose, observers);
// the server validates, converts and streams. A Watch never makes the
// index wait: its observer drops and counts what a slow reader cannot
// take.
//
// # HTTP/JSON
//
// Server.HTTPHandler serves the same unary calls as JSON over HTTP with
// Connect's protocol (POST /kvindex.v1.IndexService/Score), for curl,
// scripts and routers without gRPC: the same methods answer, behind the
// same Auth scopes and admission control, with errors as HTTP statuses
// (InvalidArgument 400, ResourceExhausted 429). JSON decoding makes a
// 2,048-token Score several times as costly as over gRPC
// (BenchmarkScoreJSON).
//
// # Serving fast
//
// Build the grpc.Server with Server.GRPCOptions. They install Codec, which
// decodes a ScoreRequest's token ids (nearly all of its bytes) by hand into
// pooled memory, about 3x faster than protobuf-go and without an 8 KB
// allocation per call, plus a fixed pool of stream workers and fixed
// flow-control windows. Dial sets up clients the same way. The wire format
// is standard protobuf either way: routers in any language need nothing
// special.
//
// # Concurrency
//
// Server and Client are safe for concurrent use by any number of
// goroutines. Score never blocks event ingest for longer than one shard
// read lock at a time, so an answer reflects each block as of the moment it
// was read: an event applied while a Score runs may be seen for some blocks
// of the prompt and not for others. The package keeps no global state.
package api
