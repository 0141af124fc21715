package natsbus

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// deltaQueue is one replica worker's queue of deltas waiting to be
// applied, at most max. Not a channel: its memory grows with what waits,
// where a channel's max pointers (512 KiB a worker by default) are
// allocated and scanned by every collection from the start.
//
// # Concurrency
//
// mu guards items and head; ready has room for one signal, sent when a
// push finds the queue empty, so that the popper, which drains the queue
// before waiting again, never misses one.
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

// pop removes and returns the oldest message, or nil when there is none.
// Cost: amortised O(1); the waiting messages move to the front of the
// slice once its head passes half of it, and an emptied queue of more
// than 1,024 slots gives its memory back.
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
