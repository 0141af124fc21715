package zmq_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/testbed/enginepub"
)

// lockedBuffer is a log sink safe for the subscriber's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// payloadWith is a map-era payload of evs with the raw event extra spliced
// in at position at.
func payloadWith(t *testing.T, evs []events.Event, at int, extra []byte) []byte {
	return payloadIn(t, events.EncodingMap, evs, at, extra)
}

// payloadIn is payloadWith in the era enc.
func payloadIn(t *testing.T, enc events.Encoding, evs []events.Event, at int, extra []byte) []byte {
	t.Helper()
	p := []byte{0x93, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0, byte(0x90 | (len(evs) + 1))}
	for i, ev := range evs {
		if i == at {
			p = append(p, extra...)
		}
		one, err := events.AppendPayload(nil, &events.Batch{Timestamp: 2.5, Events: []events.Event{ev}},
			events.EncodeOptions{Encoding: enc, Envelope: events.EnvelopeArray2})
		if err != nil {
			t.Fatal(err)
		}
		p = append(p, one[11:]...) // after 92, the float64 ts and 91
	}
	if at == len(evs) {
		p = append(p, extra...)
	}
	return append(p, 0xc0)
}

// A batch with an event of an unknown type and media no table knows: the
// rest is applied, both are counted (names kept) and logged, configured
// names go to their class, and the worker stays OK.
func TestUnknownEventsAndMedia(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: ep, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ix := indexer.New(indexer.Config{})
	w := newWorker(t, ix, "a")
	var logs lockedBuffer
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Tiers:  events.NewTiers(map[string]events.Medium{"CPU_TIER3": events.MediumDisk}, events.MediumStorage),
	}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: ep, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	tokens := func(base uint32) []uint32 {
		out := make([]uint32, 16)
		for i := range out {
			out[i] = base + uint32(i)
		}
		return out
	}
	future := []byte("\x82\xa4type\xabFutureEvent\xa4data\x92\x01\x81\xa1x\xc0") // {"type": "FutureEvent", "data": [1, {"x": nil}]}
	first := payloadWith(t, []events.Event{
		{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: tokens(0), BlockSize: 16, MediumName: "ZZZ_TIER"},
		{Kind: events.KindBlockStored, BlockHashes: []uint64{2}, TokenIDs: tokens(100), BlockSize: 16},
	}, 1, future)
	second := payloadWith(t, []events.Event{
		{Kind: events.KindBlockRemoved, BlockHashes: []uint64{1}, MediumName: "ZZZ_TIER"},
		{Kind: events.KindBlockStored, BlockHashes: []uint64{3}, TokenIDs: tokens(200), BlockSize: 16, MediumName: "cpu_tier3"},
		{Kind: events.KindBlockStored, BlockHashes: []uint64{4}, TokenIDs: tokens(300), BlockSize: 16, MediumName: "CPU", Locality: events.LocalityRemote},
	}, 3, future)
	for _, p := range [][]byte{first, second} {
		if _, err := pub.PublishRaw(p); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both batches", func() bool { return statsOf(sub, "a").Batches == 2 })
	st := statsOf(sub, "a")
	if st.UnknownEvents != 2 || st.UnknownTag != "FutureEvent" || st.UnknownMediumEvents != 2 ||
		!slices.Equal(st.UnknownMedia, []string{"ZZZ_TIER"}) {
		t.Errorf("unknown events %d (%q), media %d %q; want 2 FutureEvent, 2 [ZZZ_TIER]",
			st.UnknownEvents, st.UnknownTag, st.UnknownMediumEvents, st.UnknownMedia)
	}
	if st.Health != events.HealthOK || st.ApplyErrors != 0 || st.DecodeErrors != 0 || st.Events != 5 {
		t.Errorf("health %v (%s), %d apply and %d decode errors, %d events; want OK, none, 5 applied",
			st.Health, st.HealthReason, st.ApplyErrors, st.DecodeErrors, st.Events)
	}
	ws := w.Stats()
	var want [events.NumMedia]int64
	want[events.MediumGPU], want[events.MediumDisk], want[events.MediumExternal] = 1, 1, 1
	if ws.ResidentByMedium != want || ws.BlocksStored != 4 || ws.BlocksRemoved != 1 || ws.InvalidEvents != 0 {
		t.Errorf("index: resident %v, stored %d, removed %d, invalid %d; want %v, 4, 1, 0",
			ws.ResidentByMedium, ws.BlocksStored, ws.BlocksRemoved, ws.InvalidEvents, want)
	}
	out := logs.String()
	for _, s := range []string{"kv events of an unknown type skipped", "type=FutureEvent", "worker=a/0",
		"medium=ZZZ_TIER", "held_as=STORAGE"} {
		if !strings.Contains(out, s) {
			t.Errorf("the log lacks %q:\n%s", s, out)
		}
	}
}

// Without a table an unknown medium is held in OTHER, counted, and no
// problem: the worker stays OK through every batch naming it.
func TestUnknownMediumDoesNotDegrade(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: ep, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ix := indexer.New(indexer.Config{})
	w := newWorker(t, ix, "a")
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: ep, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		tokens := make([]uint32, 16)
		for j := range tokens {
			tokens[j] = uint32(100*i + j)
		}
		b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{uint64(i + 1)},
			TokenIDs: tokens, BlockSize: 16, Medium: events.MediumOther, MediumName: fmt.Sprintf("TIER_%d", i%2)}}}
		if _, err := pub.Publish(b); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three batches", func() bool { return statsOf(sub, "a").Batches == 3 })
	st := statsOf(sub, "a")
	if st.Health != events.HealthOK || st.ApplyErrors != 0 || st.LastError != "" || st.UnknownMediumEvents != 3 ||
		!slices.Equal(st.UnknownMedia, []string{"TIER_0", "TIER_1"}) {
		t.Errorf("health %v (%s), %d apply errors, unknown media %d %q; want OK, none, 3 [TIER_0 TIER_1]",
			st.Health, st.HealthReason, st.ApplyErrors, st.UnknownMediumEvents, st.UnknownMedia)
	}
	if s := w.Stats(); s.ResidentByMedium[events.MediumOther] != 3 {
		t.Errorf("resident in OTHER %d, want 3", s.ResidentByMedium[events.MediumOther])
	}
}

// [store, an event of an unknown type, remove] in either era: the store and
// the removal are applied, the unknown event counted.
func TestUnknownEventBetweenStoreAndRemove(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: ep, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ix := indexer.New(indexer.Config{})
	w := newWorker(t, ix, "a")
	sub, err := zmq.NewSubscriber(zmq.SubscriberOptions{}, zmq.Endpoint{Worker: events.WorkerRef{Pod: "a"}, Address: ep, Sink: w})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := pub.WaitForSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 16)
	for i, enc := range []events.Encoding{events.EncodingMap, events.EncodingArray} {
		future := map[events.Encoding][]byte{
			events.EncodingMap:   []byte("\x82\xa4type\xabFutureEvent\xa4data\x92\x01\x81\xa1x\xc0"), // {"type": "FutureEvent", "data": [1, {"x": nil}]}
			events.EncodingArray: []byte("\x93\xabFutureEvent\x92\x01\x02\x80"),                      // ["FutureEvent", [1, 2], {}]
		}[enc]
		p := payloadIn(t, enc, []events.Event{
			{Kind: events.KindBlockStored, BlockHashes: []uint64{9}, TokenIDs: tokens, BlockSize: 16, MediumName: "GPU"},
			{Kind: events.KindBlockRemoved, BlockHashes: []uint64{9}, MediumName: "GPU"},
		}, 1, future)
		if _, err := pub.PublishRaw(p); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the batch", func() bool { return statsOf(sub, "a").Batches == int64(i+1) })
		st, ws := statsOf(sub, "a"), w.Stats()
		if st.UnknownEvents != int64(i+1) || st.UnknownTag != "FutureEvent" || st.Events != int64(2*(i+1)) || st.DecodeErrors != 0 || st.Health != events.HealthOK {
			t.Errorf("%v: stream %+v", enc, st)
		}
		if ws.BlocksStored != int64(i+1) || ws.BlocksRemoved != int64(i+1) || ws.ResidentBlocks != 0 {
			t.Errorf("%v: index stored %d, removed %d, resident %d; want %d, %d, 0", enc, ws.BlocksStored, ws.BlocksRemoved, ws.ResidentBlocks, i+1, i+1)
		}
	}
}
