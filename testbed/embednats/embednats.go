//go:build !noembednats

package embednats

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an embedded nats-server; Close stops it and removes its store.
type Server struct {
	s   *server.Server
	dir string
}

// Start starts a server whose store directory is named after name (the
// caller, for a leftover directory's sake) and waits until it accepts
// clients.
func Start(name string) (*Server, error) {
	dir, err := os.MkdirTemp("", name+"-nats-")
	if err != nil {
		return nil, fmt.Errorf("%s: nats-server store: %w", name, err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: nats-server: %w", name, err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: nats-server not ready within 10 s", name)
	}
	return &Server{s: s, dir: dir}, nil
}

// URL is the server's client URL.
func (n *Server) URL() string { return n.s.ClientURL() }

// SlowConsumers returns the clients the server has cut off as slow
// consumers so far (-1 when it cannot tell).
func (n *Server) SlowConsumers() int64 {
	v, err := n.s.Varz(nil)
	if err != nil {
		return -1
	}
	return v.SlowConsumers
}

// Close stops the server and removes its store.
func (n *Server) Close() {
	n.s.Shutdown()
	n.s.WaitForShutdown()
	_ = os.RemoveAll(n.dir)
}
