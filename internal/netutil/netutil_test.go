package netutil

import (
	"fmt"
	"net"
	"testing"
)

func TestFreePortsAreConsecutiveAndFree(t *testing.T) {
	base, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
		if err != nil {
			t.Fatalf("port %d: %v", base+i, err)
		}
		l.Close()
	}
}
