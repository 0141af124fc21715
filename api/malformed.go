package api

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// grpc-go turns a codec's decode error into Internal, which tells a client
// nothing. So the server's codec notes an undecodable request here and
// returns nil, and the first interceptor answers InvalidArgument naming the
// field. Clients' codecs (NewCodec) return errors as usual. Cost: one atomic
// load per call while the set is empty.

// malformedSet holds undecodable requests by pointer, each for at most one
// call, until the interceptor takes them.
type malformedSet struct {
	n atomic.Int64
	m sync.Map // proto.Message -> error
}

func (s *malformedSet) add(v any, err error) {
	s.m.Store(v, err)
	s.n.Add(1)
}

// take returns and forgets the decode error noted for v, if any.
func (s *malformedSet) take(v any) error {
	if s == nil || s.n.Load() == 0 {
		return nil
	}
	e, ok := s.m.LoadAndDelete(v)
	if !ok {
		return nil
	}
	s.n.Add(-1)
	return e.(error)
}

// maxMalformedMessage caps the decode error's text in the status message.
const maxMalformedMessage = 256

// malformedStatus is the InvalidArgument answer to m's encoding b failing
// with err, naming the field at fault when badField finds one.
func malformedStatus(m proto.Message, b []byte, err error) error {
	md := m.ProtoReflect().Descriptor()
	msg := fmt.Sprintf("malformed %s", md.Name())
	if f := badField(b, md, "", 0); f != "" {
		msg += ": field " + f
	}
	text := err.Error()
	if len(text) > maxMalformedMessage {
		text = text[:maxMalformedMessage] + "..."
	}
	return status.Error(codes.InvalidArgument, msg+": "+text)
}

// maxBadFieldDepth bounds badField's recursion (requests nest a few levels).
const maxBadFieldDepth = 32

// badField returns the path ("candidates[2].pod", unknown fields by number)
// of the first field of b, a message md, that cannot be decoded: a bad tag or
// value, invalid UTF-8, a bad packed value (another wire type is kept as
// unknown, as protobuf-go does); "" for none. It names no field in an
// encoding protobuf-go accepts (FuzzBadField), and allocates only the path.
// depth counts the enclosing messages.
func badField(b []byte, md protoreflect.MessageDescriptor, prefix string, depth int) string {
	if depth > maxBadFieldDepth {
		return ""
	}
	var seen map[protowire.Number]int
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			if prefix == "" {
				return "(tag)"
			}
			return prefix
		}
		var fd protoreflect.FieldDescriptor
		if md != nil {
			fd = md.Fields().ByNumber(num)
		}
		// Elements of message and string lists are numbered.
		name := fieldPath(prefix, fd, num)
		if fd != nil && fd.IsList() && wireTypeOf(fd.Kind()) == protowire.BytesType {
			if seen == nil {
				seen = map[protowire.Number]int{}
			}
			name += "[" + strconv.Itoa(seen[num]) + "]"
			seen[num]++
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return name
		}
		if fd != nil {
			if p := badValue(b[n:n+m], fd, typ, name, depth); p != "" {
				return p
			}
		}
		b = b[n+m:]
	}
	return ""
}

// badValue checks one field's value v (wire type typ) against fd.
func badValue(v []byte, fd protoreflect.FieldDescriptor, typ protowire.Type, name string, depth int) string {
	k := fd.Kind()
	want := wireTypeOf(k)
	if typ == want {
		if typ != protowire.BytesType {
			return ""
		}
		body, _ := protowire.ConsumeBytes(v)
		switch k {
		case protoreflect.StringKind:
			if !utf8.Valid(body) {
				return name + " (invalid UTF-8)"
			}
		case protoreflect.MessageKind:
			return badField(body, fd.Message(), name, depth+1)
		}
		return ""
	}
	// A packed list of scalars arrives as bytes; another wire type is kept
	// as unknown, not an error.
	if typ == protowire.BytesType && fd.IsList() && want != protowire.BytesType {
		body, _ := protowire.ConsumeBytes(v)
		for len(body) > 0 {
			n := protowire.ConsumeFieldValue(fd.Number(), want, body)
			if n < 0 {
				return name
			}
			body = body[n:]
		}
	}
	return ""
}

// fieldPath joins prefix and the field's name (or number when unknown).
func fieldPath(prefix string, fd protoreflect.FieldDescriptor, num protowire.Number) string {
	name := "#" + strconv.Itoa(int(num))
	if fd != nil {
		name = string(fd.Name())
	}
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// wireTypeOf is a kind's wire type when not packed.
func wireTypeOf(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Sfixed32Kind, protoreflect.Fixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Sfixed64Kind, protoreflect.Fixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	default: // bool, enum and the varint integers
		return protowire.VarintType
	}
}
