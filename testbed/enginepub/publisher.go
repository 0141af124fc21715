package enginepub

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/events"
)

// PublisherConfig sets up a Publisher: the PUB socket's endpoint, the
// topic of every message, the payload form, and the replay ROUTER's
// endpoint ("": none).
type PublisherConfig struct {
	Endpoint string
	Topic    string
	Encoding events.EncodeOptions
	// Bind forces a bind; otherwise the socket binds or connects by vLLM's
	// rule: bind when the endpoint contains "*" or "::" or is ipc:// or
	// inproc://, connect otherwise (push mode).
	Bind           bool
	ReplayEndpoint string
	// ReplayFrames is the reply form: 4 (["", topic, seq, payload], vLLM
	// v0.26+, the default) or 3 (["", seq, payload], older vLLM).
	ReplayFrames int
	// BufferSteps is how many recent batches replay can serve (vLLM's
	// buffer_steps); 0 means 10,000.
	BufferSteps int
}

// Publisher is the sending half of vLLM's ZMQ event stream (package doc),
// seq starting at 0. Its socket is an XPUB, which subscribers cannot tell
// from vLLM's PUB but which reports subscriptions, so WaitForSubscribers
// can avoid libzmq's slow-joiner loss without sleeping.
type Publisher struct {
	mu    sync.Mutex // guards sock, seq, buf, subs, ring
	zctx  *zmq4.Context
	sock  *zmq4.Socket
	topic string
	opts  events.EncodeOptions
	seq   uint64
	buf   []byte
	subs  int

	ring      []bufferedBatch // the last BufferSteps batches, oldest first
	ringSize  int
	frames    int
	replayEnd chan struct{} // closed by Close to stop the replay server
	replayWG  sync.WaitGroup
}

// bufferedBatch is one sent (or dropped) batch kept for replay.
type bufferedBatch struct {
	seq     uint64
	payload []byte
}

// NewPublisher opens the socket described by cfg.
func NewPublisher(cfg PublisherConfig) (_ *Publisher, err error) {
	p := &Publisher{topic: cfg.Topic, opts: cfg.Encoding, ringSize: cfg.BufferSteps, frames: cfg.ReplayFrames}
	if p.ringSize <= 0 {
		p.ringSize = 10_000
	}
	if p.frames == 0 {
		p.frames = 4
	}
	if p.frames != 3 && p.frames != 4 {
		return nil, fmt.Errorf("enginepub: publisher replay frames %d: want 3 or 4", p.frames)
	}
	if p.zctx, err = zmq4.NewContext(); err != nil {
		return nil, fmt.Errorf("enginepub: publisher zmq context: %w", err)
	}
	var router *zmq4.Socket
	defer func() {
		if err != nil {
			for _, s := range []*zmq4.Socket{p.sock, router} {
				if s != nil {
					s.Close()
				}
			}
			p.zctx.Term()
		}
	}()
	sock, err := p.zctx.NewSocket(zmq4.XPUB)
	if err != nil {
		return nil, fmt.Errorf("enginepub: publisher socket: %w", err)
	}
	p.sock = sock
	_ = sock.SetLinger(0)
	_ = sock.SetSndhwm(100_000)
	_ = sock.SetXpubVerbose(1)
	ep := cfg.Endpoint
	if cfg.Bind || strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
		err = sock.Bind(cfg.Endpoint)
	} else {
		err = sock.Connect(cfg.Endpoint)
	}
	if err != nil {
		return nil, fmt.Errorf("enginepub: publisher on %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		r, err := p.zctx.NewSocket(zmq4.ROUTER)
		if err == nil {
			router = r
			_ = router.SetLinger(0)
			err = router.Bind(cfg.ReplayEndpoint)
		}
		if err != nil {
			return nil, fmt.Errorf("enginepub: publisher replay socket on %s: %w", cfg.ReplayEndpoint, err)
		}
		p.replayEnd = make(chan struct{})
		p.replayWG.Add(1)
		go p.serveReplay(router)
	}
	return p, nil
}

// serveReplay answers replay requests until Close; it owns router.
func (p *Publisher) serveReplay(router *zmq4.Socket) {
	defer p.replayWG.Done()
	defer router.Close()
	poller := zmq4.NewPoller()
	poller.Add(router, zmq4.POLLIN)
	for {
		select {
		case <-p.replayEnd:
			return
		default:
		}
		polled, err := poller.Poll(20 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		frames, err := router.RecvMessageBytes(0)
		if err != nil || len(frames) != 3 || len(frames[2]) != 8 {
			continue // not a replay request
		}
		id := frames[0]
		start := binary.BigEndian.Uint64(frames[2])
		p.mu.Lock()
		var out []bufferedBatch
		for _, b := range p.ring {
			if b.seq >= start {
				out = append(out, b)
			}
		}
		topic := p.topic
		p.mu.Unlock()
		// The 4-frame form puts the topic before the seq; the end marker
		// is seq 2^64-1 with an empty topic and payload.
		send := func(topic string, seq uint64, payload []byte) error {
			seqb := binary.BigEndian.AppendUint64(nil, seq)
			if p.frames == 4 {
				_, err := router.SendMessage(id, []byte{}, topic, seqb, payload)
				return err
			}
			_, err := router.SendMessage(id, []byte{}, seqb, payload)
			return err
		}
		for _, b := range out {
			if send(topic, b.seq, b.payload) != nil {
				break
			}
		}
		_ = send("", ^uint64(0), []byte{})
	}
}

// keepLocked stores a sent batch for replay. Callers hold p.mu.
func (p *Publisher) keepLocked(seq uint64, payload []byte) {
	if p.replayEnd == nil {
		return
	}
	if len(p.ring) >= p.ringSize {
		copy(p.ring, p.ring[1:])
		p.ring = p.ring[:len(p.ring)-1]
	}
	p.ring = append(p.ring, bufferedBatch{seq: seq, payload: append([]byte(nil), payload...)})
}

// WaitForSubscribers blocks until n subscriptions have reached the socket
// (counted since it opened) or ctx is done.
func (p *Publisher) WaitForSubscribers(ctx context.Context, n int) error {
	for {
		p.mu.Lock()
		for p.subs < n {
			msg, err := p.sock.RecvBytes(zmq4.DONTWAIT)
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
			return fmt.Errorf("enginepub: waiting for %d subscribers (have %d): %w", n, got, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Publish encodes b and sends it with the next seq, which it returns.
func (p *Publisher) Publish(b *events.Batch) (uint64, error) {
	return p.publish("", b, nil, true)
}

// PublishLost encodes b and takes the next seq for it, keeps it for replay,
// but does not send it: a message lost between PUB and SUB, as a full
// high-water mark loses it.
func (p *Publisher) PublishLost(b *events.Batch) (uint64, error) {
	return p.publish("", b, nil, false)
}

// PublishRaw sends payload as is with the next seq, e.g. a malformed
// payload in a test.
func (p *Publisher) PublishRaw(payload []byte) (uint64, error) {
	return p.publish("", nil, payload, true)
}

// publish takes the next seq for b (encoded) or payload (as is), keeps it
// for replay, and sends it unless lost, on topic ("": the publisher's).
func (p *Publisher) publish(topic string, b *events.Batch, payload []byte, send bool) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	if b != nil {
		var err error
		if p.buf, err = events.AppendPayload(p.buf[:0], b, p.opts); err != nil {
			return 0, fmt.Errorf("enginepub: publish seq %d: %w", seq, err)
		}
		payload = p.buf
	}
	if send {
		var seqb [8]byte
		binary.BigEndian.PutUint64(seqb[:], seq)
		if _, err := p.sock.SendMessage(cmp.Or(topic, p.topic), seqb[:], payload); err != nil {
			return 0, fmt.Errorf("enginepub: publish seq %d: %w", seq, err)
		}
	}
	p.keepLocked(seq, payload)
	p.seq++
	return seq, nil
}

// ForgetReplay drops every buffered batch with seq < before, as an engine
// whose replay buffer has moved past them would.
func (p *Publisher) ForgetReplay(before uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := 0
	for i < len(p.ring) && p.ring[i].seq < before {
		i++
	}
	p.ring = append(p.ring[:0], p.ring[i:]...)
}

// SetTopic changes the topic of the messages sent from now on, as an
// engine that names its process in the topic (SGLang's epoch suffix) does
// on restart; seq and the replay buffer are unchanged.
func (p *Publisher) SetTopic(topic string) {
	p.mu.Lock()
	p.topic = topic
	p.mu.Unlock()
}

// PublishOn sends b with the next seq on another topic, once, as SGLang
// sends a snapshot barrier on a barrier topic within its live sequence.
func (p *Publisher) PublishOn(topic string, b *events.Batch) (uint64, error) {
	return p.publish(topic, b, nil, true)
}

// SetSeq sets the seq of the next message: 0 simulates an engine restart
// (and empties the replay buffer, as a new process has none), skipping
// ahead simulates messages lost beyond replay.
func (p *Publisher) SetSeq(seq uint64) {
	p.mu.Lock()
	if seq < p.seq {
		p.ring = p.ring[:0]
	}
	p.seq = seq
	p.mu.Unlock()
}

// Close closes the socket.
func (p *Publisher) Close() error {
	if p.replayEnd != nil {
		close(p.replayEnd)
		p.replayWG.Wait()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.sock.Close()
	p.zctx.Term()
	return err
}
