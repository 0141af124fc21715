package api_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// populate sets every field of m, recursively into sub-messages (one level
// of each message type), to a value that is not the default, so that a
// field the hand codec does not know changes the bytes.
func populate(m protoreflect.Message, seen map[protoreflect.FullName]bool) {
	md := m.Descriptor()
	if seen[md.FullName()] {
		return
	}
	seen[md.FullName()] = true
	defer delete(seen, md.FullName())
	fs := md.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if fd.ContainingOneof() != nil && i > 0 && fs.Get(i-1).ContainingOneof() == fd.ContainingOneof() {
			continue // one member of each oneof
		}
		switch {
		case fd.IsMap():
			mv := m.Mutable(fd).Map()
			k := scalar(fd.MapKey())
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v := mv.NewValue()
				populate(v.Message(), seen)
				mv.Set(k.MapKey(), v)
			} else {
				mv.Set(k.MapKey(), scalar(fd.MapValue()))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				if fd.Kind() == protoreflect.MessageKind {
					v := l.NewElement()
					populate(v.Message(), seen)
					l.Append(v)
				} else {
					l.Append(scalar(fd))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			if fd.Message().FullName() == (&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName() {
				m.Set(fd, protoreflect.ValueOfMessage(timestamppb.New(timestamppb.Now().AsTime()).ProtoReflect()))
				continue
			}
			populate(m.Mutable(fd).Message(), seen)
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

// scalar is a non-default value of fd's kind.
func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(-7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(300)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(-70000)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1 << 40)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(2.25)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("s-" + string(fd.Name()))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("b-" + string(fd.Name())))
	}
	panic("scalar: kind " + fd.Kind().String())
}

// TestCodecKnowsEveryScoreField: a ScoreRequest and a ScoreResponse with
// every field set (recursively) are encoded by the hand codec byte for
// byte as protobuf-go does and decoded to equal messages. A field added to
// either message that the hand paths (appendScoreRequest,
// unmarshalScoreResponse) do not know fails here: extend them with it.
func TestCodecKnowsEveryScoreField(t *testing.T) {
	req := &kvindexv1.ScoreRequest{}
	populate(req.ProtoReflect(), map[protoreflect.FullName]bool{})
	got, err := marshalCodec(t, req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("hand-encoded ScoreRequest differs from protobuf-go's:\n%x\n%x", got, want)
	}
	var back kvindexv1.ScoreRequest
	if err := unmarshalCodec(want, &back); err != nil || !proto.Equal(&back, req) {
		t.Fatalf("ScoreRequest round trip: %v\n%v\n%v", err, &back, req)
	}
	resp := &kvindexv1.ScoreResponse{}
	populate(resp.ProtoReflect(), map[protoreflect.FullName]bool{})
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var rback kvindexv1.ScoreResponse
	if err := unmarshalCodec(b, &rback); err != nil || !proto.Equal(&rback, resp) {
		t.Fatalf("ScoreResponse round trip: %v\n%v\n%v", err, &rback, resp)
	}
}

// TestMarshalRefusesInvalidUTF8: a string field with invalid UTF-8, which
// protobuf-go refuses to encode, is refused by the hand codec too,
// whichever string field it is in.
func TestMarshalRefusesInvalidUTF8(t *testing.T) {
	for name, req := range map[string]*kvindexv1.ScoreRequest{
		"model":     {Model: "\xff", TokenIds: []uint32{1}},
		"lora_name": {Model: "m", LoraName: "\xff"},
		"salt":      {Model: "m", CacheSalt: "\xff"},
		"prompt":    {Model: "m", Prompt: "\xff"},
		"tenant":    {Model: "m", Tenant: "\xff"},
		"messages":  {Model: "m", Messages: []*kvindexv1.ChatMessage{{Role: "user", Content: "\xff"}}},
	} {
		if _, err := marshalCodec(t, req); err == nil {
			t.Errorf("%s: invalid UTF-8 encoded", name)
		}
	}
}
