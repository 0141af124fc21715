package loadgen

import (
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// sleeper sleeps until a given time with tens of µs of precision, where
// Go's timers wake an idle process up to 1 ms late (the netpoller waits in
// whole milliseconds). A nanosleep(2) on a locked thread would keep its P
// from the server under test; a timerfd read through os.File parks the
// goroutine in the netpoller without a P, and an idle epoll_wait returns
// when the fd fires.
type sleeper struct {
	f   *os.File
	fd  int
	buf [8]byte
}

func newSleeper() (*sleeper, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("loadgen: timerfd: %w", err)
	}
	return &sleeper{f: os.NewFile(uintptr(fd), "loadgen-timerfd"), fd: fd}, nil
}

// sleepUntil returns at t or soon after.
func (s *sleeper) sleepUntil(t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if err := unix.TimerfdSettime(s.fd, 0, &spec, nil); err != nil {
		return fmt.Errorf("loadgen: arm timerfd: %w", err)
	}
	if _, err := s.f.Read(s.buf[:]); err != nil {
		return fmt.Errorf("loadgen: wait on timerfd: %w", err)
	}
	return nil
}

// every arms the timer to expire first after first, then every interval.
func (s *sleeper) every(first, interval time.Duration) error {
	spec := unix.ItimerSpec{
		Value:    unix.NsecToTimespec(max(int64(first), 1)), // 0 would disarm it
		Interval: unix.NsecToTimespec(int64(interval)),
	}
	if err := unix.TimerfdSettime(s.fd, 0, &spec, nil); err != nil {
		return fmt.Errorf("loadgen: arm timerfd: %w", err)
	}
	return nil
}

// ticks waits for the timer armed by every to expire and returns how many
// times it has since the last call (more than 1 when the caller was late).
func (s *sleeper) ticks() (uint64, error) {
	if _, err := s.f.Read(s.buf[:]); err != nil {
		return 0, fmt.Errorf("loadgen: wait on timerfd: %w", err)
	}
	return binary.NativeEndian.Uint64(s.buf[:]), nil
}

func (s *sleeper) close() { _ = s.f.Close() }
