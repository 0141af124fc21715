package indexer

import "golang.org/x/sys/unix"

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
