package indexer

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadSwitches returns how many times the kernel has switched the
// calling OS thread out involuntarily (ru_nivcsw of RUSAGE_THREAD): a
// thread switched out while it had work is a thread whose calls waited for
// a CPU. The caller must be locked to its thread.
func threadSwitches() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return ru.Nivcsw
}

// threadCPU returns the calling OS thread's CPU time in ns
// (CLOCK_THREAD_CPUTIME_ID), which time spent waiting for a CPU does not
// advance, and true; false when it cannot be read. The caller must be
// locked to its thread.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
