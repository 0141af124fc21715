package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// H2Conn is a minimal gRPC client over one HTTP/2 connection, made to load
// a server while taking little CPU from it: a benchmark on a small machine
// shares its cores with the generator, and grpc-go's client costs about as
// much per call as the server it measures. It does what h2load does for
// HTTP/2: requests are pre-encoded (one HPACK header block for every call,
// one gRPC-framed message per prompt), a call is one locked write of a
// HEADERS and a DATA frame, and one reader goroutine completes the calls.
//
// It speaks enough of HTTP/2 to be correct against any gRPC server:
// SETTINGS (acknowledged, frame size and window honoured), connection and
// stream flow control in both directions, PING acknowledgements,
// RST_STREAM and GOAWAY; grpc-status decides each call's outcome. It has
// no TLS, compression, retries or streaming.
type H2Conn struct {
	conn   net.Conn
	fr     *http2.Framer // writes under wmu, reads in the reader goroutine
	bw     *bufio.Writer
	header []byte // HPACK block of every call's request headers

	wmu    sync.Mutex // the write side: fr's writes, bw, nextID; never held while waiting for mu's cond
	nextID uint32

	mu       sync.Mutex // below, and cond
	cond     *sync.Cond // signalled when the send window grows or the connection fails
	connWin  int64      // bytes the server lets us send on the connection
	streamW  int64      // the server's initial stream window
	maxFrame int        // the server's max frame size
	calls    map[uint32]*h2Call
	err      error // why the connection failed; set once

	done chan struct{} // closed when the reader stops
}

// h2Call is one call in flight. The reader goroutine fills it until it
// signals done; a call given up on (its context ended) may still be
// written by the reader, so calls are never reused.
type h2Call struct {
	resp    []byte // gRPC-framed response, accumulated from DATA frames
	status  int    // grpc-status, -1 until the trailers arrive
	message string // grpc-message
	err     error  // transport failure
	done    chan struct{}
}

// h2 settings a H2Conn announces: a large receive window, so the server
// never waits for WINDOW_UPDATEs; we give connection window back in steps.
const (
	h2RecvWindow = 1 << 24
	h2ConnRefill = 1 << 20
)

// DialH2 opens a connection to the gRPC server at addr (plaintext HTTP/2
// with prior knowledge, as gRPC without TLS) and completes the HTTP/2
// handshake. authority is the :authority of the calls; path the method
// ("/package.Service/Method") every call invokes.
func DialH2(ctx context.Context, addr, path string) (*H2Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("loadgen: h2 dial %s: %w", addr, err)
	}
	c := &H2Conn{
		conn:     conn,
		bw:       bufio.NewWriterSize(conn, 64<<10),
		nextID:   1,
		connWin:  65535, // RFC 9113 initial values until the server says otherwise
		streamW:  65535,
		maxFrame: 16384,
		calls:    make(map[uint32]*h2Call),
		done:     make(chan struct{}),
	}
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(conn, 64<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20

	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	// No dynamic table: every call's block is the same bytes.
	enc.SetMaxDynamicTableSizeLimit(0)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path},
		{Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	} {
		if err := enc.WriteField(f); err != nil {
			conn.Close()
			return nil, fmt.Errorf("loadgen: h2 encode headers: %w", err)
		}
	}
	c.header = hb.Bytes()

	if _, err := c.bw.WriteString(http2.ClientPreface); err == nil {
		err = c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2RecvWindow},
			http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0},
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		)
		if err == nil {
			err = c.fr.WriteWindowUpdate(0, h2RecvWindow-65535)
		}
		if err == nil {
			err = c.bw.Flush()
		}
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("loadgen: h2 handshake with %s: %w", addr, err)
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// The server's SETTINGS come first; apply them before any call.
	f, err := c.fr.ReadFrame()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("loadgen: h2 handshake with %s: %w", addr, err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		conn.Close()
		return nil, fmt.Errorf("loadgen: h2 handshake with %s: first frame is %v, not SETTINGS", addr, f.Header().Type)
	}
	if err := c.applySettings(sf); err != nil {
		conn.Close()
		return nil, fmt.Errorf("loadgen: h2 handshake with %s: %w", addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	go c.read()
	return c, nil
}

// applySettings takes the server's settings and acknowledges them.
func (c *H2Conn) applySettings(sf *http2.SettingsFrame) error {
	c.mu.Lock()
	err := sf.ForeachSetting(func(s http2.Setting) error {
		switch s.ID {
		case http2.SettingInitialWindowSize:
			c.streamW = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		}
		return nil
	})
	c.mu.Unlock()
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.fr.WriteSettingsAck(); err != nil {
		return err
	}
	return c.bw.Flush()
}

// Call sends one pre-framed request (NewGRPCMessage) and waits for its
// gRPC-framed response. A non-OK grpc-status is an error. Safe for
// concurrent use; msg is only read.
//
// Cost: three small allocations (the call, its channel, the response)
// and, on an idle connection, one write and one read system call.
func (c *H2Conn) Call(ctx context.Context, msg []byte) ([]byte, error) {
	call := &h2Call{status: -1, done: make(chan struct{}, 1)}

	// Reserve connection window first, without the write lock: the reader
	// takes that lock to acknowledge SETTINGS and PINGs, and may have to
	// before it reads the WINDOW_UPDATE this call waits for.
	c.mu.Lock()
	if int64(len(msg)) > c.streamW {
		c.mu.Unlock()
		return nil, fmt.Errorf("loadgen: h2: request of %d bytes is larger than the server's stream window (%d); flow control across frames of one request is not implemented", len(msg), c.streamW)
	}
	if c.err == nil && c.connWin < int64(len(msg)) {
		// Wait for a WINDOW_UPDATE, or for ctx to end.
		stop := context.AfterFunc(ctx, func() {
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
		for c.err == nil && ctx.Err() == nil && c.connWin < int64(len(msg)) {
			c.cond.Wait()
		}
		stop()
	}
	if c.err != nil || ctx.Err() != nil {
		err := c.err
		if err == nil {
			err = ctx.Err()
		}
		c.mu.Unlock()
		return nil, err
	}
	c.connWin -= int64(len(msg))
	maxFrame := c.maxFrame
	c.mu.Unlock()

	// Stream ids must reach the server in increasing order: take one and
	// write under the same lock.
	c.wmu.Lock()
	id := c.nextID
	c.nextID += 2
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.wmu.Unlock()
		return nil, err
	}
	c.calls[id] = call
	c.mu.Unlock()

	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.header, EndHeaders: true})
	for rest := msg; err == nil; {
		n := min(len(rest), maxFrame)
		err = c.fr.WriteData(id, n == len(rest), rest[:n])
		if rest = rest[n:]; len(rest) == 0 {
			break
		}
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("loadgen: h2 write: %w", err))
	}

	select {
	case <-call.done:
	case <-ctx.Done():
		c.mu.Lock()
		_, pending := c.calls[id]
		delete(c.calls, id)
		c.mu.Unlock()
		if pending {
			c.wmu.Lock()
			_ = c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			_ = c.bw.Flush()
			c.wmu.Unlock()
			return nil, ctx.Err()
		}
		<-call.done // the reader completed it meanwhile
	}
	switch {
	case call.err != nil:
		return nil, call.err
	case call.status != 0:
		// A status error, so that status.Code (and Run's count of
		// refusals) sees the code.
		return nil, fmt.Errorf("loadgen: h2: %w", status.Error(codes.Code(call.status), call.message))
	}
	return call.resp, nil
}

// read is the reader goroutine: it completes calls and answers the
// server's control frames until the connection fails or is closed.
func (c *H2Conn) read() {
	defer close(c.done)
	var unacked uint32 // DATA bytes received since the last connection WINDOW_UPDATE
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(fmt.Errorf("loadgen: h2 read: %w", err))
			return
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			if call := c.call(f.StreamID); call != nil {
				call.resp = append(call.resp, f.Data()...)
				if f.StreamEnded() { // gRPC always ends with trailers
					c.finish(f.StreamID, errors.New("loadgen: h2: response ended without trailers"))
				}
			}
			if unacked += f.Length; unacked >= h2ConnRefill {
				if err := c.control(func() error { return c.fr.WriteWindowUpdate(0, unacked) }); err != nil {
					c.fail(err)
					return
				}
				unacked = 0
			}
		case *http2.MetaHeadersFrame:
			call := c.call(f.StreamID)
			if call == nil {
				continue
			}
			for _, hf := range f.Fields {
				switch hf.Name {
				case "grpc-status":
					if v, err := strconv.Atoi(hf.Value); err == nil {
						call.status = v
					}
				case "grpc-message":
					call.message = hf.Value
				}
			}
			if f.StreamEnded() {
				var err error
				if call.status < 0 {
					err = fmt.Errorf("loadgen: h2: stream %d ended without grpc-status (:status %s)", f.StreamID, f.PseudoValue("status"))
				}
				c.finish(f.StreamID, err)
			}
		case *http2.RSTStreamFrame:
			c.finish(f.StreamID, fmt.Errorf("loadgen: h2: server reset stream %d: %v", f.StreamID, f.ErrCode))
		case *http2.WindowUpdateFrame:
			c.mu.Lock()
			if f.StreamID == 0 {
				c.connWin += int64(f.Increment)
				c.cond.Broadcast()
			}
			c.mu.Unlock()
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := c.applySettings(f); err != nil {
					c.fail(err)
					return
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := c.control(func() error { return c.fr.WritePing(true, f.Data) }); err != nil {
					c.fail(err)
					return
				}
			}
		case *http2.GoAwayFrame:
			c.fail(fmt.Errorf("loadgen: h2: server sent GOAWAY (%v, %q)", f.ErrCode, f.DebugData()))
			return
		}
	}
}

// control writes a control frame from the reader goroutine.
func (c *H2Conn) control(write func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := write(); err != nil {
		return fmt.Errorf("loadgen: h2 write: %w", err)
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("loadgen: h2 write: %w", err)
	}
	return nil
}

func (c *H2Conn) call(id uint32) *h2Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

// finish completes call id (once) with err.
func (c *H2Conn) finish(id uint32, err error) {
	c.mu.Lock()
	call := c.calls[id]
	delete(c.calls, id)
	c.mu.Unlock()
	if call != nil {
		call.err = err
		call.done <- struct{}{}
	}
}

// fail ends the connection: every pending and later call fails with err.
func (c *H2Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	calls := c.calls
	c.calls = make(map[uint32]*h2Call)
	c.cond.Broadcast()
	c.mu.Unlock()
	for _, call := range calls {
		call.err = err
		call.done <- struct{}{}
	}
	_ = c.conn.Close()
}

// Close closes the connection and waits for the reader to stop.
func (c *H2Conn) Close() error {
	c.fail(net.ErrClosed)
	<-c.done
	return nil
}

// NewGRPCMessage frames a marshalled protobuf message as gRPC sends it on
// a stream: an uncompressed flag byte and a 4-byte big-endian length.
func NewGRPCMessage(pb []byte) []byte {
	m := make([]byte, 5+len(pb))
	binary.BigEndian.PutUint32(m[1:5], uint32(len(pb)))
	copy(m[5:], pb)
	return m
}

// GRPCPayload returns the protobuf message inside a gRPC-framed response
// holding exactly one uncompressed message.
func GRPCPayload(framed []byte) ([]byte, error) {
	if len(framed) < 5 {
		return nil, fmt.Errorf("loadgen: h2: response of %d bytes has no gRPC message", len(framed))
	}
	if framed[0] != 0 {
		return nil, fmt.Errorf("loadgen: h2: compressed response (flag %d) not supported", framed[0])
	}
	n := binary.BigEndian.Uint32(framed[1:5])
	if int(n) != len(framed)-5 {
		return nil, fmt.Errorf("loadgen: h2: gRPC message length %d, %d bytes received", n, len(framed)-5)
	}
	return framed[5:], nil
}
