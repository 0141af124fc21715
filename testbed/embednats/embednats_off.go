//go:build noembednats

package embednats

import "fmt"

// Server is the embedded nats-server a build with -tags noembednats
// lacks.
type Server struct{}

// Start fails: the build has no nats-server.
func Start(name string) (*Server, error) {
	return nil, fmt.Errorf("%s: built with -tags noembednats, without an embedded nats-server (make demo-fleet builds one in)", name)
}

// URL is "": there is no server.
func (*Server) URL() string { return "" }

// SlowConsumers is -1: there is no server.
func (*Server) SlowConsumers() int64 { return -1 }

// Close does nothing: there is no server.
func (*Server) Close() {}
