package soak

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/events"
)

// Kinds of hostile input the garbage sender sends, as the summary counts
// them.
const (
	GarbageRawTCP        = "raw_tcp"          // random bytes (or a ZMTP greeting then junk) on a TCP connection
	GarbageFrames        = "wrong_frames"     // 1, 2, 4 or 5 frames, or a 7-byte seq
	GarbageRandom        = "random_payload"   // random bytes as the payload
	GarbageMalformed     = "malformed"        // truncated or mistyped msgpack
	GarbageHugeLength    = "huge_length"      // containers and strings declaring 4 GiB
	GarbageOversize      = "oversize"         // a message over max_message_bytes
	GarbageNoPod         = "no_pod_topic"     // topics that name no pod
	GarbagePullInjection = "pull_injection"   // kv@<pull pod>@<any model>, configured ranks
	GarbageOtherListener = "other_listener"   // the allowlisted listener's pod, on the open one
	GarbageOtherModel    = "other_model"      // a garbage pod under another model
	GarbageDPRank        = "dp_rank"          // data_parallel_rank outside [0, 1024)
	GarbageNewPod        = "new_pod"          // a new pod name each time, past max_workers
	GarbageKnownBad      = "known_worker_bad" // an undecodable payload for a garbage worker
	GarbageAddress       = "refused_address"  // a connection from outside the allowlist
	GarbageNeighbour     = "neighbour"        // published on ports next to a pull pod's
	GarbagePullRank      = "pull_rank"        // kv@<pull pod>@<its model>, a rank it does not have
)

// fixedGarbagePod is the garbage pod created first in every daemon
// process, for the other-model and known-worker probes.
const fixedGarbagePod = "evil-fixed"

// Garbage sends hostile input at the daemon: at its push listeners, its
// gRPC and metrics ports, and from ports next to the pull pods'. It owns
// its ZeroMQ sockets; Run's goroutine is the only one that uses them.
type Garbage struct {
	fleet *Fleet
	rng   *rand.Rand
	view  DaemonView

	zctx       *zmq4.Context
	open       *zmq4.Socket // XPUB connected to the open listener
	refused    *zmq4.Socket // XPUB connected to the allowlisted listener from 127.0.0.1, new for each probe
	neighbours []*zmq4.Socket
	listening  []*zmq4.Socket // neighbour XPUBs and ROUTERs: a daemon that reached one is caught
	newPods    int
	seq        uint64

	mu       sync.Mutex
	counts   map[string]int64
	problems []string
}

// DaemonView is what the garbage sender knows of the daemon, from the
// soak's ListWorkers samples.
type DaemonView interface {
	// Process returns the current daemon process's number.
	Process() int
	// Listed reports whether ListWorkers of daemon process n has shown
	// pod (rank 0) created by the push listener at endpoint.
	Listed(n int, pod, endpoint string) bool
}

// NewGarbage opens the garbage sockets: one connected to the open push
// listener, and one XPUB or ROUTER bound on each neighbour port.
func NewGarbage(f *Fleet, seed uint64, view DaemonView) (*Garbage, error) {
	g := &Garbage{fleet: f, rng: rand.New(rand.NewPCG(seed, stringSeed("garbage"))), view: view, counts: map[string]int64{}}
	var err error
	if g.zctx, err = zmq4.NewContext(); err != nil {
		return nil, fmt.Errorf("soak: garbage zmq context: %w", err)
	}
	fail := func(err error) (*Garbage, error) {
		g.Close()
		return nil, err
	}
	if g.open, err = g.xpub(f.OpenPushAddr(), false, 100*time.Millisecond); err != nil {
		return fail(err)
	}
	pubs, replays := f.Neighbours()
	for _, ep := range pubs {
		s, err := g.xpub(ep, true, 0)
		if err != nil {
			return fail(err)
		}
		g.neighbours = append(g.neighbours, s)
		g.listening = append(g.listening, s)
	}
	for _, ep := range replays {
		s, err := g.zctx.NewSocket(zmq4.ROUTER)
		if err == nil {
			_ = s.SetLinger(0)
			if err = s.Bind(ep); err != nil {
				s.Close()
			}
		}
		if err != nil {
			return fail(fmt.Errorf("soak: garbage ROUTER on %s: %w", ep, err))
		}
		g.listening = append(g.listening, s)
	}
	return g, nil
}

func (g *Garbage) xpub(ep string, bind bool, reconnect time.Duration) (*zmq4.Socket, error) {
	s, err := g.zctx.NewSocket(zmq4.XPUB)
	if err != nil {
		return nil, fmt.Errorf("soak: garbage socket for %s: %w", ep, err)
	}
	_ = s.SetLinger(0)
	_ = s.SetXpubVerbose(1)
	_ = s.SetSndhwm(10_000)
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

// Counts returns the messages (and connections) sent by kind.
func (g *Garbage) Counts() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.counts)
}

// Problems returns what the garbage sender saw that it must not: a
// daemon that subscribed to or asked a replay of a neighbour port.
func (g *Garbage) Problems() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.problems...)
}

func (g *Garbage) count(kind string) {
	g.mu.Lock()
	g.counts[kind]++
	g.mu.Unlock()
}

// Run sends one probe every interval until ctx is done.
func (g *Garbage) Run(ctx context.Context, interval time.Duration) {
	every(ctx, interval, func(i int) bool {
		g.watch()
		g.probe(ctx, i)
		return true
	})
}

// watch drains the open socket's subscriptions (which only show the
// daemon's reconnections) and the neighbour sockets, where any message
// at all is a daemon reading a port it was never given.
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
			g.mu.Lock()
			if len(g.problems) < 20 {
				g.problems = append(g.problems, fmt.Sprintf("neighbour port %s received %d frames: the daemon reached a port it was not configured with", ep, len(frames)))
			}
			g.mu.Unlock()
		}
	}
}

// probe sends one probe, chosen by turn.
func (g *Garbage) probe(ctx context.Context, i int) {
	gen := g.view.Process()
	// Until a daemon process lists the fixed garbage pod, every probe
	// creates it (before new pod names take the listener's slots).
	if !g.view.Listed(gen, fixedGarbagePod, g.fleet.OpenPushAddr()) {
		g.send(GarbageNewPod, g.open, "kv@"+fixedGarbagePod+"@"+GarbageModel, g.validPayload(0))
		return
	}
	for _, s := range g.neighbours {
		g.send(GarbageNeighbour, s, "kv@neighbour@"+ModelA, g.validPayload(0))
	}
	switch i % 14 {
	case 0:
		g.rawTCP(ctx)
	case 1:
		g.wrongFrames()
	case 2:
		g.send(GarbageRandom, g.open, g.evilTopic(), g.randomBytes(1+g.rng.IntN(512)))
	case 3:
		g.send(GarbageMalformed, g.open, g.evilTopic(), g.malformed())
	case 4:
		g.send(GarbageHugeLength, g.open, g.evilTopic(), g.hugeLength())
	case 5:
		if i%(14*10) == 5 { // 2 MiB, every tenth round
			g.send(GarbageOversize, g.open, g.evilTopic(), g.randomBytes(2*MaxMessageBytes))
		} else {
			g.send(GarbageMalformed, g.open, g.evilTopic(), g.malformed())
		}
	case 6:
		topics := []string{"garbage", "kv@", "kv@@" + ModelA, "kv@pod-only", "", "kv@x@", string(g.randomBytes(2048))}
		g.send(GarbageNoPod, g.open, topics[g.rng.IntN(len(topics))], g.validPayload(0))
	case 7:
		p := g.fleet.Pods[g.rng.IntN(len(g.fleet.Pods))]
		models := []string{p.Model, ModelA, ModelB, GarbageModel, "unheard/of"}
		g.send(GarbagePullInjection, g.open, "kv@"+p.Name+"@"+models[g.rng.IntN(len(models))], g.validPayload(g.rng.IntN(p.DPSize)))
	case 8:
		if g.view.Listed(gen, PushPod, g.fleet.AllowPushAddr()) {
			g.send(GarbageOtherListener, g.open, "kv@"+PushPod+"@"+ModelA, g.validPayload(0))
		}
	case 9:
		g.send(GarbageOtherModel, g.open, "kv@"+fixedGarbagePod+"@"+ModelB, g.validPayload(0))
	case 10:
		ranks := []int{-1, 1024, 1 << 20, -(1 << 40)}
		g.send(GarbageDPRank, g.open, "kv@evil-rank@"+GarbageModel, g.validPayload(ranks[g.rng.IntN(len(ranks))]))
	case 11:
		g.newPods++
		g.send(GarbageNewPod, g.open, "kv@evil-"+strconv.Itoa(g.newPods)+"@"+GarbageModel, g.validPayload(0))
	case 12:
		g.send(GarbageKnownBad, g.open, "kv@"+fixedGarbagePod+"@"+GarbageModel, g.malformed())
	case 13:
		// A new connection each time: the listener refuses each at the
		// handshake, and libzmq may not retry one it refused.
		if g.refused != nil {
			g.refused.Close()
			g.refused = nil
		}
		if s, err := g.xpub(g.fleet.AllowPushAddr(), false, time.Second); err == nil {
			g.refused = s
			g.send(GarbageAddress, g.refused, "kv@evil-refused@"+GarbageModel, g.validPayload(0))
		}
		p := g.fleet.Pods[g.rng.IntN(len(g.fleet.Pods))]
		g.send(GarbagePullRank, g.open, "kv@"+p.Name+"@"+p.Model, g.validPayload(p.DPSize))
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

// send sends [topic, seq, payload] on s, without blocking.
func (g *Garbage) send(kind string, s *zmq4.Socket, topic string, payload []byte) {
	g.seq++
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], g.seq)
	_, _ = s.SendMessageDontwait(topic, seq[:], payload)
	g.count(kind)
}

// wrongFrames sends a message that is not [topic, 8-byte seq, payload].
func (g *Garbage) wrongFrames() {
	topic := g.evilTopic()
	seq := make([]byte, 8)
	var parts []any
	switch g.rng.IntN(5) {
	case 0:
		parts = []any{topic}
	case 1:
		parts = []any{topic, seq}
	case 2:
		parts = []any{topic, seq[:7], g.validPayload(0)}
	case 3:
		parts = []any{topic, seq, g.validPayload(0), []byte("extra")}
	default:
		parts = []any{topic, seq, g.validPayload(0), seq, seq}
	}
	_, _ = g.open.SendMessageDontwait(parts...)
	g.count(GarbageFrames)
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
		"127.0.0.1:" + strconv.Itoa(g.fleet.OpenPush),
		"127.0.0.1:" + strconv.Itoa(g.fleet.AllowPush),
		g.fleet.GRPCAddr(),
		g.fleet.MetricsAddr(),
	}
	sort.Strings(targets)
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
	g.count(GarbageRawTCP)
}
