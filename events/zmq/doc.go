// Package zmq is kvindex's ZeroMQ transport for vLLM's KV events: SUB
// sockets connected to each engine's PUB (pull mode) or bound for engines to
// connect to (push mode), per-worker seq tracking, gap and restart
// detection, and replay from the engine's ROUTER socket. It is the daemon's
// only cgo (pebbe/zmq4 over libzmq).
//
// # Wire format
//
// A message is three frames: topic, an 8-byte big-endian seq, and the
// msgpack payload package events decodes. A replay request is a DEALER
// message [“”, 8-byte start seq]; the engine answers one reply per buffered
// batch from that seq ([“”, seq, payload], or [“”, topic, seq, payload]
// since vLLM v0.26) and an end marker with seq ff..ff.
//
// # Concurrency
//
// A Subscriber runs one receiver goroutine per socket (owning the socket and
// a decoder; a push listener has a socket per DP rank), one goroutine per worker stream (which alone applies that
// worker's batches, in seq order), bounded replay fetches, and one health
// checker. WorkerStats and Health may be called from any goroutine.
package zmq
