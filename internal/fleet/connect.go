package fleet

import (
	"fmt"
	"log/slog"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/redact"
)

// Connect opens the NATS connection of c for a process named name. It
// reconnects forever (a replica or agent is useless without NATS, and
// every disconnection is visible: the source resyncs, the agent's
// registrations expire), and logs each disconnection and reconnection.
// The URL is logged redacted (it may carry a password).
func Connect(c config.NATS, name string, log *slog.Logger) (*natsgo.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	url := redact.URL(c.URL)
	opts := []natsgo.Option{
		natsgo.Name(name),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(250 * time.Millisecond),
		natsgo.RetryOnFailedConnect(true),
		// A partition closes nothing: pings find a dead connection in
		// 10-15 s rather than nats.go's 4 min (replicas meanwhile stop
		// trusting workers whose registrations stop arriving).
		natsgo.PingInterval(5 * time.Second),
		natsgo.MaxPingsOutstanding(2),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			log.Warn("NATS disconnected", "url", url, "err", err)
		}),
		natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
			log.Info("NATS reconnected", "url", redact.URL(nc.ConnectedUrl()))
		}),
	}
	if c.CredsFile != "" {
		opts = append(opts, natsgo.UserCredentials(c.CredsFile))
	}
	nc, err := natsgo.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("fleet: connecting to NATS at %s: %w", url, err)
	}
	return nc, nil
}
