// Package api serves kvindex's gRPC contract (kvindex.v1.IndexService) over
// an indexer.Index, and gives Go routers a small client for it.
//
// Server validates requests (every rejection is InvalidArgument with a
// message starting with the field at fault), keys the prompt, and ranks the
// workers with scoring; it registers gRPC health and reflection, so grpcurl
// and Kubernetes probes work. Client wraps a grpc.ClientConn for routers and
// kvindexctl. A text or chat prompt is tokenized by Options.Tokenizer (the
// model's own vLLM server, cached), inside admission control like any Score.
// The operator's calls (Lookup, Dump, Diagnose, Watch; inspect.go) are
// bounded, read-only and off the Score path; their logic lives in indexer.
//
// Server.GRPCOptions install Codec, a fixed pool of stream workers and fixed
// flow-control windows (Dial sets up clients the same way; the wire is
// standard protobuf); Server.HTTPHandler serves the unary calls as JSON.
//
// Server and Client are safe for concurrent use. Score holds one shard read
// lock at a time, so an event applied during a Score may be seen for some
// blocks and not others. The package keeps no global state.
package api
