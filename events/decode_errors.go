package events

import (
	"fmt"
	"strings"
)

func (d *Decoder) typeErr(off int, c byte, want string) error {
	return d.errorf(off, "want %s, got %s (0x%02x)", want, codeName(c), c)
}

// truncated reports a value at off whose header or body runs past the end
// of the payload.
func (d *Decoder) truncated(off int, c byte) error {
	return d.errorf(off, "payload ends inside %s (0x%02x)", codeName(c), c)
}

// errorf builds an error that wraps ErrMalformed and says where the decoder
// was and which bytes it was looking at. It is off the hot path: it runs
// once per failed Decode.
func (d *Decoder) errorf(off int, format string, args ...any) error {
	var sb strings.Builder
	if d.event >= 0 {
		fmt.Fprintf(&sb, "event %d", d.event)
		if d.kind != 0 {
			fmt.Fprintf(&sb, " (%s)", d.kind)
		}
	} else {
		sb.WriteString("envelope")
	}
	switch {
	case d.field != "":
		sb.WriteString(" field ")
		sb.WriteString(d.field)
	case d.key != nil:
		k := d.key
		if len(k) > 40 {
			k = k[:40]
		}
		fmt.Fprintf(&sb, " field %q", k)
	}
	if d.index >= 0 {
		fmt.Fprintf(&sb, "[%d]", d.index)
	}
	if d.field == fieldNames[fExtraKeys] {
		for _, i := range d.path {
			fmt.Fprintf(&sb, "[%d]", i)
		}
	}
	sb.WriteString(": ")
	fmt.Fprintf(&sb, format, args...)
	fmt.Fprintf(&sb, " at offset %d: %s", off, snippet(d.p, off))
	return fmt.Errorf("%w: %s", ErrMalformed, sb.String())
}

// snippet quotes up to 8 bytes either side of off in hex, the byte at off in
// brackets, in the spirit of nats-server quoting the bytes it choked on.
func snippet(p []byte, off int) string {
	const span = 8
	lo, hi := max(off-span, 0), min(off+span, len(p))
	var sb strings.Builder
	if lo > 0 {
		sb.WriteString("... ")
	}
	for i := lo; i < hi; i++ {
		if i > lo {
			sb.WriteByte(' ')
		}
		if i == off {
			fmt.Fprintf(&sb, "[%02x]", p[i])
		} else {
			fmt.Fprintf(&sb, "%02x", p[i])
		}
	}
	switch {
	case off >= len(p):
		if hi > lo {
			sb.WriteByte(' ')
		}
		sb.WriteString("[EOF]")
	case hi < len(p):
		sb.WriteString(" ...")
	}
	return sb.String()
}
