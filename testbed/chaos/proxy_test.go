package chaos

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func newLink(t *testing.T) (*Net, *Link) {
	t.Helper()
	n := NewNet()
	t.Cleanup(n.Close)
	l, err := n.Add("test", "127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	return n, l
}

func dial(t *testing.T, l *Link) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", l.Listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and returns its echo and how long it took.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) (string, time.Duration) {
	t.Helper()
	t0 := time.Now()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read echo of %q: %v", line, err)
	}
	return got[:len(got)-1], time.Since(t0)
}

// A latency toxic delays each direction by its latency; removing it
// restores the path.
func TestLinkLatency(t *testing.T) {
	_, l := newLink(t)
	c, r := dial(t, l)
	if got, _ := roundTrip(t, c, r, "warm"); got != "warm" {
		t.Fatalf("echo %q", got)
	}
	if err := l.AddToxic(Toxic{Name: "lat", Type: "latency", Stream: Downstream, Attrs: map[string]int64{"latency": 150}}); err != nil {
		t.Fatal(err)
	}
	if got, d := roundTrip(t, c, r, "slow"); got != "slow" || d < 140*time.Millisecond {
		t.Fatalf("echo %q after %v, want it after at least 150 ms", got, d)
	}
	if err := l.RemoveToxic("lat"); err != nil {
		t.Fatal(err)
	}
	if got, d := roundTrip(t, c, r, "fast"); got != "fast" || d > 100*time.Millisecond {
		t.Fatalf("echo %q after %v without the toxic", got, d)
	}
	if err := l.RemoveToxic("lat"); err == nil {
		t.Fatal("removing a removed toxic succeeded")
	}
}

// A hold delivers nothing while it lasts and everything, in order and
// whole, once it is removed.
func TestLinkHoldLosesNothing(t *testing.T) {
	_, l := newLink(t)
	c, r := dial(t, l)
	roundTrip(t, c, r, "warm")
	if err := l.AddToxic(Toxic{Name: "hole", Type: "hold", Stream: Upstream}); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	go func() {
		for i := range n {
			if _, err := c.Write([]byte(strconv.Itoa(i) + "\n")); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := r.ReadString('\n'); !isTimeout(err) || got != "" {
		t.Fatalf("read %q, %v through a hold, want a timeout", got, err)
	}
	if err := l.RemoveToxic("hole"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i := range n {
		got, err := r.ReadString('\n')
		if err != nil || got != strconv.Itoa(i)+"\n" {
			t.Fatalf("line %d after the hold: %q, %v", i, got, err)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A reset_peer toxic ends the connection; a new one works once it is
// removed.
func TestLinkReset(t *testing.T) {
	_, l := newLink(t)
	c, r := dial(t, l)
	roundTrip(t, c, r, "warm")
	if err := l.AddToxic(Toxic{Name: "rst", Type: "reset_peer", Stream: Upstream, Attrs: map[string]int64{"timeout": 0}}); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("x\n"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read through a reset")
	}
	if err := l.RemoveToxic("rst"); err != nil {
		t.Fatal(err)
	}
	c2, r2 := dial(t, l)
	if got, _ := roundTrip(t, c2, r2, "again"); got != "again" {
		t.Fatalf("echo %q", got)
	}
}

// A link that is down refuses connections and has closed its own; up, it
// serves on the same address.
func TestLinkDownUp(t *testing.T) {
	_, l := newLink(t)
	c, r := dial(t, l)
	roundTrip(t, c, r, "warm")
	l.Down()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("connection survived the link going down")
	}
	if c, err := net.DialTimeout("tcp", l.Listen, time.Second); err == nil {
		c.Close()
		t.Fatal("a down link accepted a connection")
	}
	if err := l.Up(); err != nil {
		t.Fatal(err)
	}
	c2, r2 := dial(t, l)
	if got, _ := roundTrip(t, c2, r2, "up"); got != "up" {
		t.Fatalf("echo %q", got)
	}
}

// A bandwidth toxic caps the rate: 64 KiB at 32 KB/s takes about two
// seconds.
func TestLinkBandwidth(t *testing.T) {
	_, l := newLink(t)
	c, r := dial(t, l)
	roundTrip(t, c, r, "warm")
	if err := l.AddToxic(Toxic{Name: "bw", Type: "bandwidth", Stream: Downstream, Attrs: map[string]int64{"rate": 32}}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 64<<10)
	for i := range payload {
		payload[i] = 'a'
	}
	payload[len(payload)-1] = '\n'
	t0 := time.Now()
	go func() { _, _ = c.Write(payload) }()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || len(got) != len(payload) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if d := time.Since(t0); d < 1500*time.Millisecond {
		t.Fatalf("64 KiB through a 32 KB/s cap in %v", d)
	}
}
