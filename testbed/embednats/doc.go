// Package embednats runs a nats-server inside a testbed process, with
// JetStream on (the agents' registry) and its store in a temporary
// directory, on a free loopback port, with the server's defaults
// otherwise, as a deployment's.
//
// A build with -tags noembednats (make demo's) links no nats-server: Start
// fails, naming the tag.
package embednats
