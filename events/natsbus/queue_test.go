package natsbus

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestDeltaQueue checks the queue's order, its bound, its ready signal and
// that an emptied queue gives its memory back.
func TestDeltaQueue(t *testing.T) {
	q := newDeltaQueue(3)
	if q.pop() != nil || q.len() != 0 {
		t.Fatal("a new queue is not empty")
	}
	msgs := make([]*nats.Msg, 4)
	for i := range msgs {
		msgs[i] = &nats.Msg{Subject: strconv.Itoa(i)}
	}
	for i := range 3 {
		if !q.push(msgs[i]) {
			t.Fatalf("push %d refused below the bound", i)
		}
	}
	if q.push(msgs[3]) {
		t.Fatal("push over the bound accepted")
	}
	select {
	case <-q.ready:
	default:
		t.Fatal("no ready signal after a push into an empty queue")
	}
	select {
	case <-q.ready:
		t.Fatal("a second ready signal for pushes into a non-empty queue")
	default:
	}
	if m := q.pop(); m != msgs[0] || q.len() != 2 {
		t.Fatalf("pop: %v, %d left", m, q.len())
	}
	if !q.push(msgs[3]) {
		t.Fatal("push refused after a pop made room")
	}
	for _, want := range msgs[1:] {
		if m := q.pop(); m != want {
			t.Fatalf("pop %v, want %v", m, want)
		}
	}
	if q.pop() != nil || q.len() != 0 {
		t.Fatal("the drained queue is not empty")
	}
	big := newDeltaQueue(1 << 20)
	for range 5000 {
		big.push(msgs[0])
	}
	for big.pop() != nil {
	}
	if big.items != nil {
		t.Fatalf("an emptied queue keeps %d slots", cap(big.items))
	}
}

// TestDeltaQueueConcurrent: a pusher and a popper that waits on ready as
// the worker's goroutine does see every message, in order.
func TestDeltaQueueConcurrent(t *testing.T) {
	const n = 20000
	q := newDeltaQueue(n)
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		msgs[i] = &nats.Msg{}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, m := range msgs {
			if !q.push(m) {
				t.Errorf("push %d refused", i)
				return
			}
			if i%100 == 0 {
				time.Sleep(time.Microsecond)
			}
		}
	}()
	timeout := time.After(10 * time.Second)
	for got := 0; got < n; {
		for m := q.pop(); m != nil; m = q.pop() {
			if m != msgs[got] {
				t.Fatalf("message %d out of order", got)
			}
			got++
		}
		if got == n {
			break
		}
		select {
		case <-q.ready:
		case <-timeout:
			t.Fatalf("stalled after %d of %d messages", got, n)
		}
	}
	wg.Wait()
}
