package picker

import (
	"encoding/json"
	"strings"

	"github.com/kvindex/kvindex/tokenize"
)

// scanBody reads the fields the picker needs from an OpenAI body in one
// pass: model, the raw prompt, and each message's role and raw content.
// It returns ok false for anything it does not follow (the caller then
// decodes with encoding/json, which words the errors). Values are sliced
// from b, not copied: it replaces encoding/json, the bulk of a decision's
// cost (docs/benchmarks.md).
func scanBody(b []byte) (out body, ok bool) {
	s := scanner{b: b}
	ok = s.object(func(key []byte) bool {
		if odd(string(key), "model", "prompt", "messages") {
			return false
		}
		switch string(key) {
		case "model":
			v, ok := s.str()
			if ok {
				out.Model, ok = unquoteString(v)
			}
			return ok
		case "prompt":
			v, ok := s.value()
			out.Prompt = json.RawMessage(v)
			return ok
		case "messages":
			s.ws()
			if s.peek() == 'n' {
				_, ok := s.value()
				return ok
			}
			out.Messages = []tokenize.WireMessage{}
			return s.array(func() bool {
				var m tokenize.WireMessage
				ok := s.object(func(key []byte) bool {
					if odd(string(key), "role", "content") {
						return false
					}
					switch string(key) {
					case "role":
						v, ok := s.str()
						if ok {
							m.Role, ok = unquoteString(v)
						}
						return ok
					case "content":
						v, ok := s.value()
						m.Content = json.RawMessage(v)
						return ok
					}
					_, ok := s.value()
					return ok
				})
				out.Messages = append(out.Messages, m)
				return ok
			})
		}
		_, ok := s.value()
		return ok
	})
	s.ws()
	return out, ok && s.i == len(b)
}

// odd reports a key that encoding/json would match to one of names but
// this scanner would not: another case, or escapes. The caller then
// leaves the body to encoding/json.
func odd(key string, names ...string) bool {
	if strings.IndexByte(key, '\\') >= 0 {
		return true
	}
	for _, n := range names {
		if key != n && strings.EqualFold(key, n) {
			return true
		}
	}
	return false
}

// unquoteString decodes a JSON string literal.
func unquoteString(q []byte) (string, bool) {
	m := tokenize.WireMessage{Content: q}
	s, err := m.Text()
	return s, err == nil
}

// scanner is a cursor over JSON text.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// list consumes open, elements read by elem and separated by commas, and
// close.
func (s *scanner) list(open, close byte, elem func() bool) bool {
	s.ws()
	if s.peek() != open {
		return false
	}
	s.i++
	s.ws()
	if s.peek() == close {
		s.i++
		return true
	}
	for {
		if !elem() {
			return false
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case close:
			s.i++
			return true
		default:
			return false
		}
	}
}

// object calls field for each key, with the cursor before its value,
// which field must consume.
func (s *scanner) object(field func(key []byte) bool) bool {
	return s.list('{', '}', func() bool {
		k, ok := s.str()
		if !ok {
			return false
		}
		s.ws()
		if s.peek() != ':' {
			return false
		}
		s.i++
		return field(k[1 : len(k)-1])
	})
}

// array calls elem for each element, with the cursor before it.
func (s *scanner) array(elem func() bool) bool { return s.list('[', ']', elem) }

// str consumes a string literal and returns it, quotes included.
func (s *scanner) str() ([]byte, bool) {
	s.ws()
	if s.peek() != '"' {
		return nil, false
	}
	start := s.i
	for s.i++; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			s.i++
		case '"':
			s.i++
			return s.b[start:s.i], true
		}
	}
	return nil, false
}

// value consumes any value and returns its text.
func (s *scanner) value() ([]byte, bool) {
	s.ws()
	start := s.i
	switch c := s.peek(); {
	case c == '"':
		return s.str()
	case c == '{':
		ok := s.object(func([]byte) bool { _, ok := s.value(); return ok })
		return s.b[start:s.i], ok
	case c == '[':
		ok := s.array(func() bool { _, ok := s.value(); return ok })
		return s.b[start:s.i], ok
	case c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n':
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return s.b[start:s.i], s.i > start
			}
			s.i++
		}
		return s.b[start:s.i], true
	}
	return nil, false
}
