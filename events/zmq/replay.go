package zmq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// ErrReplay reports a replay that failed or returned something else than
// vLLM's replies.
var ErrReplay = errors.New("zmq: replay failed")

// errReplayCut reports an answer that stopped without its end marker: the
// engine's ROUTER dropped the rest at its send HWM (libzmq's default 1,000,
// vLLM sets none). What arrived is good; the rest is asked again.
var errReplayCut = errors.New("zmq: replay answer cut short")

// replayEnd is the seq of vLLM's end-of-replay marker.
const replayEnd = ^uint64(0)

// replayedBatch is one batch returned by an engine's replay socket.
type replayedBatch struct {
	seq     uint64
	payload []byte
}

// parseReplayReply reads one reply: "", then [seq, payload] (vLLM before
// v0.26) or [topic, seq, payload]; the end marker has seq ff..ff.
func parseReplayReply(frames [][]byte) (r replayedBatch, end bool, err error) {
	var seqFrame, payload []byte
	switch len(frames) {
	case 3:
		seqFrame, payload = frames[1], frames[2]
	case 4:
		seqFrame, payload = frames[2], frames[3]
	default:
		return r, false, fmt.Errorf("%w: reply has %d frames, want 3 ([\"\", seq, payload]) or 4 ([\"\", topic, seq, payload])", ErrReplay, len(frames))
	}
	if len(frames[0]) != 0 {
		return r, false, fmt.Errorf("%w: reply's first frame is %d bytes, want the empty delimiter", ErrReplay, len(frames[0]))
	}
	if len(seqFrame) != 8 {
		return r, false, fmt.Errorf("%w: reply's seq frame is %d bytes, want 8", ErrReplay, len(seqFrame))
	}
	seq := binary.BigEndian.Uint64(seqFrame)
	if seq == replayEnd {
		return r, true, nil
	}
	return replayedBatch{seq: seq, payload: payload}, false, nil
}

// fetchReplay asks an engine's replay ROUTER for every batch from start on
// until the end marker, giving up after timeout, maxBatches or ctx. Once
// batches arrived, a pause of idle (the engine answers in one loop: the rest
// was dropped) or maxBytes ends the answer with errReplayCut. maxMsg is the
// DEALER's ZMQ_MAXMSGSIZE.
func fetchReplay(ctx context.Context, zctx *zmq4.Context, endpoint string, start uint64, timeout, idle time.Duration, maxBatches int, maxBytes, maxMsg int64) ([]replayedBatch, error) {
	sock, err := zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		return nil, fmt.Errorf("%w: DEALER socket for %s: %w", ErrReplay, endpoint, err)
	}
	defer sock.Close()
	_ = sock.SetLinger(0)
	_ = sock.SetRcvhwm(0) // a replay is bounded by maxBatches and maxBytes, not by the HWM
	_ = sock.SetMaxmsgsize(maxMsg)
	if err := sock.Connect(endpoint); err != nil {
		return nil, fmt.Errorf("%w: connect %s: %w", ErrReplay, endpoint, err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if _, err := sock.SendMessage([]byte{}, req[:]); err != nil {
		return nil, fmt.Errorf("%w: send request to %s: %w", ErrReplay, endpoint, err)
	}
	deadline := time.Now().Add(timeout)
	last := time.Now()
	poller := zmq4.NewPoller()
	poller.Add(sock, zmq4.POLLIN)
	var out []replayedBatch
	var bytes int64
	for {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if len(out) > 0 && time.Since(last) >= idle {
			return out, fmt.Errorf("%w: %s sent %d batches from seq %d (last %d), then nothing for %v", errReplayCut, endpoint, len(out), start, out[len(out)-1].seq, idle)
		}
		left := time.Until(deadline)
		if left <= 0 {
			if len(out) > 0 {
				return out, fmt.Errorf("%w: %s sent %d batches from seq %d but no end marker within %v", errReplayCut, endpoint, len(out), start, timeout)
			}
			return out, fmt.Errorf("%w: %s sent nothing for seq %d on within %v", ErrReplay, endpoint, start, timeout)
		}
		polled, err := poller.Poll(min(left, 20*time.Millisecond))
		if err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EINTR) {
				continue
			}
			return out, fmt.Errorf("%w: poll %s: %w", ErrReplay, endpoint, err)
		}
		if len(polled) == 0 {
			continue
		}
		frames, err := sock.RecvMessageBytes(0)
		if err != nil {
			return out, fmt.Errorf("%w: receive from %s: %w", ErrReplay, endpoint, err)
		}
		r, end, err := parseReplayReply(frames)
		if err != nil {
			return out, fmt.Errorf("%s: %w", endpoint, err)
		}
		if end {
			return out, nil
		}
		if len(out) > 0 && r.seq <= out[len(out)-1].seq {
			return out, fmt.Errorf("%w: %s replayed seq %d after %d", ErrReplay, endpoint, r.seq, out[len(out)-1].seq)
		}
		last = time.Now()
		out = append(out, r)
		if bytes += int64(len(r.payload)); bytes >= maxBytes {
			return out, fmt.Errorf("%w: %s sent %d bytes in %d batches from seq %d, the most one answer may hold", errReplayCut, endpoint, bytes, len(out), start)
		}
		if len(out) >= maxBatches {
			return out, fmt.Errorf("%w: %s replayed more than %d batches", ErrReplay, endpoint, maxBatches)
		}
	}
}
