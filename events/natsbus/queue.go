package natsbus

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// deltaQueue is a replica worker's queue of at most max deltas. Not a
// channel: memory grows with what waits, where a channel's 512 KiB of
// pointers would be allocated and scanned from the start. mu guards items
// and head; ready is signalled when a push finds the queue empty, and the
// popper drains before waiting again, so none is missed.
type deltaQueue struct {
	mu    sync.Mutex
	items []*nats.Msg // items[head:] wait, oldest first
	head  int
	max   int
	ready chan struct{}
}

func newDeltaQueue(max int) *deltaQueue {
	return &deltaQueue{max: max, ready: make(chan struct{}, 1)}
}

// push appends m and reports whether there was room.
func (q *deltaQueue) push(m *nats.Msg) bool {
	q.mu.Lock()
	n := len(q.items) - q.head
	if n >= q.max {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, m)
	q.mu.Unlock()
	if n == 0 {
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// pop returns the oldest message or nil. Amortised O(1): waiting messages
// move to the front once head passes half, and an emptied queue of more than
// 1,024 slots gives its memory back.
func (q *deltaQueue) pop() *nats.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.items) {
		return nil
	}
	m := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	switch {
	case q.head == len(q.items):
		if cap(q.items) > 1024 {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
		q.head = 0
	case q.head > len(q.items)/2:
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return m
}

// len returns the number of waiting messages.
func (q *deltaQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) - q.head
}
