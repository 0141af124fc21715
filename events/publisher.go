package events

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// PublisherConfig sets up a Publisher.
type PublisherConfig struct {
	// Endpoint is where the PUB socket binds or connects.
	Endpoint string
	// Topic is sent as every message's first frame.
	Topic string
	// Encoding selects the payload form (array or map era, hash form, envelope).
	Encoding EncodeOptions
	// Bind forces a bind; otherwise the socket binds or connects by vLLM's
	// rule: bind when the endpoint contains "*" or "::" or is ipc:// or
	// inproc://, connect otherwise (push mode).
	Bind bool
}

// Publisher is the sending half of vLLM's ZMQ event stream: it sends
// [topic, seq, payload] messages exactly as vLLM's ZmqEventPublisher does,
// seq starting at 0. kvindex uses it for simulated engines, the demo and
// tests; it is not on the daemon's path.
//
// The socket is an XPUB, which subscribers cannot tell from vLLM's PUB but
// which reports subscriptions, so WaitForSubscribers can avoid libzmq's
// slow-joiner loss without sleeping.
//
// # Concurrency
//
// All methods may be called from several goroutines; sends are serialised.
type Publisher struct {
	mu    sync.Mutex // guards sock, seq, buf, subs
	zctx  *zmq.Context
	sock  *zmq.Socket
	topic string
	opts  EncodeOptions
	seq   uint64
	buf   []byte
	subs  int
}

// NewPublisher opens the socket described by cfg.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("events: publisher zmq context: %w", err)
	}
	sock, err := zctx.NewSocket(zmq.XPUB)
	if err != nil {
		zctx.Term()
		return nil, fmt.Errorf("events: publisher socket: %w", err)
	}
	_ = sock.SetLinger(0)
	_ = sock.SetSndhwm(100_000)
	_ = sock.SetXpubVerbose(1)
	if cfg.Bind || BindsEndpoint(cfg.Endpoint) {
		err = sock.Bind(cfg.Endpoint)
	} else {
		err = sock.Connect(cfg.Endpoint)
	}
	if err != nil {
		sock.Close()
		zctx.Term()
		return nil, fmt.Errorf("events: publisher on %s: %w", cfg.Endpoint, err)
	}
	return &Publisher{zctx: zctx, sock: sock, topic: cfg.Topic, opts: cfg.Encoding}, nil
}

// BindsEndpoint reports whether vLLM binds (rather than connects) its PUB
// socket for endpoint.
func BindsEndpoint(ep string) bool {
	for i := 0; i < len(ep); i++ {
		if ep[i] == '*' || (ep[i] == ':' && i+1 < len(ep) && ep[i+1] == ':') {
			return true
		}
	}
	return hasPrefix(ep, "ipc://") || hasPrefix(ep, "inproc://")
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// WaitForSubscribers blocks until n subscriptions have reached the socket
// (counted since it opened) or ctx is done.
func (p *Publisher) WaitForSubscribers(ctx context.Context, n int) error {
	for {
		p.mu.Lock()
		for p.subs < n {
			msg, err := p.sock.RecvBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			if len(msg) > 0 && msg[0] == 1 {
				p.subs++
			}
		}
		got := p.subs
		p.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("events: waiting for %d subscribers (have %d): %w", n, got, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Publish encodes b and sends it with the next seq, which it returns.
func (p *Publisher) Publish(b *Batch) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	p.buf, err = AppendPayload(p.buf[:0], b, p.opts)
	if err != nil {
		return 0, fmt.Errorf("events: publish seq %d: %w", p.seq, err)
	}
	seq := p.seq
	if err := p.sendLocked(seq, p.buf); err != nil {
		return 0, err
	}
	p.seq++
	return seq, nil
}

// PublishRaw sends payload as is with the next seq, e.g. a malformed
// payload in a test.
func (p *Publisher) PublishRaw(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	if err := p.sendLocked(seq, payload); err != nil {
		return 0, err
	}
	p.seq++
	return seq, nil
}

func (p *Publisher) sendLocked(seq uint64, payload []byte) error {
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	if _, err := p.sock.SendMessage(p.topic, seqb[:], payload); err != nil {
		return fmt.Errorf("events: publish seq %d: %w", seq, err)
	}
	return nil
}

// SetSeq sets the seq of the next message: 0 simulates an engine restart,
// skipping ahead simulates lost messages.
func (p *Publisher) SetSeq(seq uint64) {
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
}

// Close closes the socket.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.sock.Close()
	p.zctx.Term()
	return err
}
