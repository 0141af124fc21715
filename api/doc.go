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
// # Concurrency
//
// Server and Client are safe for concurrent use by any number of
// goroutines. Score never blocks event ingest for longer than one shard
// read lock at a time, so an answer reflects each block as of the moment it
// was read: an event applied while a Score runs may be seen for some blocks
// of the prompt and not for others. The package keeps no global state.
package api
