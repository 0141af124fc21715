// Package netutil finds free loopback ports for the demo, the simulator and
// tests, which run real sockets side by side on one machine.
//
// Its functions are safe for concurrent use; a port found free may still be
// taken by another process before the caller binds it, so callers bind
// promptly and tests retry.
package netutil

import (
	"fmt"
	"net"
)

// FreePorts returns the first of n consecutive TCP ports that are free on
// 127.0.0.1 (vLLM's data-parallel ranks publish on consecutive ports).
func FreePorts(n int) (int, error) {
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("netutil: listen on loopback: %w", err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for i := 1; i < n && ok; i++ {
			li, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				ok = false
				continue
			}
			ls = append(ls, li)
		}
		for _, li := range ls {
			li.Close()
		}
		if ok {
			return base, nil
		}
	}
	return 0, fmt.Errorf("netutil: no %d consecutive free loopback ports after 50 tries", n)
}
