package fleetbench

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsServer is a nats-server embedded in a generator process, with
// JetStream on (the agents' registry) and its store in a temporary
// directory, on a free loopback port. Its options are the server's
// defaults otherwise, as a deployment's: 1 MiB payloads, 64 MiB pending
// per client before it is cut off as a slow consumer.
type natsServer struct {
	s   *server.Server
	dir string
}

func startNATS() (*natsServer, error) {
	dir, err := os.MkdirTemp("", "kvfleetbench-nats-")
	if err != nil {
		return nil, fmt.Errorf("fleetbench: nats-server store: %w", err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("fleetbench: nats-server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("fleetbench: nats-server not ready within 10 s")
	}
	return &natsServer{s: s, dir: dir}, nil
}

func (n *natsServer) url() string { return n.s.ClientURL() }

// slowConsumers returns the clients the server has cut off as slow
// consumers so far.
func (n *natsServer) slowConsumers() int64 {
	v, err := n.s.Varz(nil)
	if err != nil {
		return -1
	}
	return v.SlowConsumers
}

func (n *natsServer) close() {
	n.s.Shutdown()
	n.s.WaitForShutdown()
	_ = os.RemoveAll(n.dir)
}

// connect opens a plain client connection (the generator's agents; the
// replicas use fleet.Connect, as kvindex serve does).
func connect(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("fleetbench: connect %s: %w", url, err)
	}
	return nc, nil
}
