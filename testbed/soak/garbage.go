package soak

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/events"
)

// fixedGarbagePod is the garbage pod created first in every daemon
// process, for the other-model and known-worker probes.
const fixedGarbagePod = "evil-fixed"

// Garbage sends hostile input at the daemon (the soak probes of
// docs/reliability.md, counted by kind): at its push listeners, its gRPC
// and metrics ports, and from ports next to the pull pods'. Only run's
// goroutine uses its ZeroMQ sockets.
type Garbage struct {
	r   *runner
	rng *rand.Rand

	zctx       *zmq4.Context
	open       *zmq4.Socket // XPUB connected to the open listener
	refused    *zmq4.Socket // XPUB connected to the allowlisted listener from 127.0.0.1, new for each probe
	neighbours []*zmq4.Socket
	listening  []*zmq4.Socket // neighbour XPUBs and ROUTERs: a daemon that reached one is caught
	newPods    int
	seq        uint64
	counts     counters
}

// newGarbage opens the garbage sockets: one connected to the open push
// listener, and one XPUB or ROUTER bound on each neighbour port.
func newGarbage(r *runner) (*Garbage, error) {
	g := &Garbage{r: r, rng: rand.New(rand.NewPCG(r.opts.Seed, stringSeed("garbage")))}
	var err error
	if g.zctx, err = zmq4.NewContext(); err != nil {
		return nil, fmt.Errorf("soak: garbage zmq context: %w", err)
	}
	if g.open, err = g.socket(zmq4.XPUB, r.fleet.OpenPushAddr(), false, 100*time.Millisecond); err != nil {
		g.Close()
		return nil, err
	}
	pubs, replays := r.fleet.Neighbours()
	for i, ep := range append(pubs, replays...) {
		t := zmq4.XPUB
		if i >= len(pubs) {
			t = zmq4.ROUTER
		}
		s, err := g.socket(t, ep, true, 0)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.listening = append(g.listening, s)
	}
	g.neighbours = g.listening[:len(pubs)]
	return g, nil
}

func (g *Garbage) socket(t zmq4.Type, ep string, bind bool, reconnect time.Duration) (*zmq4.Socket, error) {
	s, err := g.zctx.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("soak: garbage socket for %s: %w", ep, err)
	}
	_ = s.SetLinger(0)
	if t == zmq4.XPUB {
		_ = s.SetXpubVerbose(1)
		_ = s.SetSndhwm(10_000)
	}
	if reconnect > 0 {
		_ = s.SetReconnectIvl(reconnect)
	}
	if bind {
		err = s.Bind(ep)
	} else {
		err = s.Connect(ep)
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("soak: garbage socket on %s: %w", ep, err)
	}
	return s, nil
}

// Close closes every garbage socket.
func (g *Garbage) Close() {
	for _, s := range append([]*zmq4.Socket{g.open, g.refused}, g.listening...) {
		if s != nil {
			s.Close()
		}
	}
	if g.zctx != nil {
		g.zctx.Term()
	}
}

func (g *Garbage) run(ctx context.Context) {
	every(ctx, garbageInterval, func(i int) {
		g.watch()
		g.probe(ctx, i)
	})
}

// watch drains the open socket's subscriptions (which only show the
// daemon's reconnections) and the neighbour sockets, where any message
// at all is a daemon reading a port it was never given (a failure).
func (g *Garbage) watch() {
	for {
		if _, err := g.open.RecvBytes(zmq4.DONTWAIT); err != nil {
			break
		}
	}
	for _, s := range g.listening {
		ep, _ := s.GetLastEndpoint()
		for {
			frames, err := s.RecvMessageBytes(zmq4.DONTWAIT)
			if err != nil {
				break
			}
			g.r.fail.Add("neighbour_reached", "neighbour port %s received %d frames: the daemon reached a port it was not configured with", ep, len(frames))
		}
	}
}

func (g *Garbage) probe(ctx context.Context, i int) {
	gen := g.r.Process()
	// Until a daemon process lists the fixed garbage pod, every probe
	// creates it (before new pod names take the listener's slots).
	if !g.r.Listed(gen, fixedGarbagePod, g.r.fleet.OpenPushAddr()) {
		g.send("new_pod", g.open, "kv@"+fixedGarbagePod+"@"+GarbageModel, g.validPayload(0))
		return
	}
	for _, s := range g.neighbours {
		g.send("neighbour", s, "kv@neighbour@"+ModelA, g.validPayload(0))
	}
	switch i % 14 {
	case 0:
		g.rawTCP(ctx)
	case 1:
		g.wrongFrames()
	case 2:
		g.send("random_payload", g.open, g.evilTopic(), g.randomBytes(1+g.rng.IntN(512)))
	case 3:
		g.send("malformed", g.open, g.evilTopic(), g.malformed())
	case 4:
		g.send("huge_length", g.open, g.evilTopic(), g.hugeLength())
	case 5:
		if i%(14*10) == 5 { // 2 MiB, every tenth round
			g.send("oversize", g.open, g.evilTopic(), g.randomBytes(2*MaxMessageBytes))
		} else {
			g.send("malformed", g.open, g.evilTopic(), g.malformed())
		}
	case 6:
		topics := []string{"garbage", "kv@", "kv@@" + ModelA, "kv@pod-only", "", "kv@x@", string(g.randomBytes(2048))}
		g.send("no_pod_topic", g.open, topics[g.rng.IntN(len(topics))], g.validPayload(0))
	case 7:
		p := g.r.fleet.Pods[g.rng.IntN(len(g.r.fleet.Pods))]
		models := []string{p.Model, ModelA, ModelB, GarbageModel, "unheard/of"}
		g.send("pull_injection", g.open, "kv@"+p.Name+"@"+models[g.rng.IntN(len(models))], g.validPayload(g.rng.IntN(p.DPSize)))
	case 8:
		if g.r.Listed(gen, PushPod, g.r.fleet.AllowPushAddr()) {
			g.send("other_listener", g.open, "kv@"+PushPod+"@"+ModelA, g.validPayload(0))
		}
	case 9:
		g.send("other_model", g.open, "kv@"+fixedGarbagePod+"@"+ModelB, g.validPayload(0))
	case 10:
		ranks := []int{-1, 1024, 1 << 20, -(1 << 40)}
		g.send("dp_rank", g.open, "kv@evil-rank@"+GarbageModel, g.validPayload(ranks[g.rng.IntN(len(ranks))]))
	case 11:
		g.newPods++
		g.send("new_pod", g.open, "kv@evil-"+strconv.Itoa(g.newPods)+"@"+GarbageModel, g.validPayload(0))
	case 12:
		g.send("known_worker_bad", g.open, "kv@"+fixedGarbagePod+"@"+GarbageModel, g.malformed())
	case 13:
		// A new connection each time: the listener refuses each at the
		// handshake, and libzmq may not retry one it refused.
		if g.refused != nil {
			g.refused.Close()
			g.refused = nil
		}
		if s, err := g.socket(zmq4.XPUB, g.r.fleet.AllowPushAddr(), false, time.Second); err == nil {
			g.refused = s
			g.send("refused_address", g.refused, "kv@evil-refused@"+GarbageModel, g.validPayload(0))
		}
		p := g.r.fleet.Pods[g.rng.IntN(len(g.r.fleet.Pods))]
		g.send("pull_rank", g.open, "kv@"+p.Name+"@"+p.Model, g.validPayload(p.DPSize))
	}
}

// evilTopic is a garbage pod's topic: the fixed one (its worker exists,
// so the payload reaches a stream) or one of a few unknown ones.
func (g *Garbage) evilTopic() string {
	if g.rng.IntN(2) == 0 {
		return "kv@" + fixedGarbagePod + "@" + GarbageModel
	}
	return "kv@evil-unknown-" + strconv.Itoa(g.rng.IntN(4)) + "@" + GarbageModel
}

// send sends [topic, seq, payload] on s without blocking.
func (g *Garbage) send(kind string, s *zmq4.Socket, topic string, payload []byte) {
	g.seq++
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], g.seq)
	_, _ = s.SendMessageDontwait(topic, seq[:], payload)
	g.counts.add(kind)
}

// wrongFrames sends a message that is not [topic, 8-byte seq, payload]:
// 1, 2, 4 or 5 frames, or a 7-byte seq.
func (g *Garbage) wrongFrames() {
	topic, seq, p := g.evilTopic(), make([]byte, 8), g.validPayload(0)
	forms := [][]any{{topic}, {topic, seq}, {topic, seq[:7], p}, {topic, seq, p, []byte("extra")}, {topic, seq, p, seq, seq}}
	_, _ = g.open.SendMessageDontwait(forms[g.rng.IntN(len(forms))]...)
	g.counts.add("wrong_frames")
}

// validPayload is a decodable batch storing 1..4 blocks of random tokens
// (the garbage model's block size) from DP rank rank.
func (g *Garbage) validPayload(rank int) []byte {
	n := 1 + g.rng.IntN(4)
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = g.rng.Uint64()
	}
	b := &events.Batch{
		Timestamp: float64(time.Now().UnixNano()) / 1e9,
		Events:    []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: randomTokens(g.rng, n*16), BlockSize: 16}},
		DPRank:    rank, HasDPRank: true,
	}
	out, err := events.AppendPayload(nil, b, events.EncodeOptions{Encoding: events.EncodingMap})
	if err != nil {
		return []byte{0xc1}
	}
	return out
}

// malformed is a valid payload cut short, with a byte flipped, or with
// msgpack's reserved byte 0xc1 inside it.
func (g *Garbage) malformed() []byte {
	p := g.validPayload(0)
	switch g.rng.IntN(3) {
	case 0:
		return p[:g.rng.IntN(len(p))]
	case 1:
		p[g.rng.IntN(len(p))] ^= byte(1 + g.rng.IntN(255))
		return p
	default:
		p[g.rng.IntN(len(p))] = 0xc1
		return p
	}
}

// hugeLength is a payload whose containers, strings or bins declare up to
// 4 GiB that never follow.
func (g *Garbage) hugeLength() []byte {
	forms := [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff},                                                 // array32 of 2^32-1
		{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},             // [ts, events: array32 huge, ...]
		{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x9b, 0xdb, 0xff, 0xff, 0xff, 0xff}, // an event whose tag is a huge str32
		{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x9b, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0xc6, 0xff, 0xff, 0xff, 0xff}, // a bin32 hash of 4 GiB
		{0xdf, 0xff, 0xff, 0xff, 0xff}, // map32 of 2^32-1 pairs
		{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x9b, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0x01, 0xc0, 0xdd, 0x7f, 0xff, 0xff, 0xff}, // token_ids of 2^31-1
	}
	f := forms[g.rng.IntN(len(forms))]
	return append(append([]byte(nil), f...), g.randomBytes(g.rng.IntN(64))...)
}

func (g *Garbage) randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.rng.Uint32())
	}
	return b
}

// rawTCP opens a TCP connection to one of the daemon's ports and writes
// random bytes, or a ZMTP greeting's signature followed by junk.
func (g *Garbage) rawTCP(ctx context.Context) {
	targets := []string{
		"127.0.0.1:" + strconv.Itoa(g.r.fleet.OpenPush),
		"127.0.0.1:" + strconv.Itoa(g.r.fleet.AllowPush),
		g.r.fleet.GRPCAddr(),
		g.r.fleet.MetricsAddr(),
	}
	addr := targets[g.rng.IntN(len(targets))]
	data := g.randomBytes(1 + g.rng.IntN(4096))
	if g.rng.IntN(2) == 0 {
		greeting := []byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0}
		data = append(greeting, data...)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return // the daemon is restarting
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	_, _ = conn.Write(data)
	g.counts.add("raw_tcp")
}
