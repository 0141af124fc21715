package standin

// Vocab is the size of the token-id range the scheme's tokens fall into
// (Llama 3's vocabulary, 128,256 ids).
const Vocab = 128256

// Segment is a run of Len tokens whose content is named by ID: token i of
// the run is Token(ID, i). It is the scheme's unit of content, and the
// simulator's (testbed/sim/workload reuses it).
type Segment struct {
	// ID names the content; equal ids mean equal tokens.
	ID uint64
	// Len is the number of tokens used from the start of the content.
	Len int
}

// Token returns token off of the content named id: a pure function, so
// equal (id, off) give equal tokens everywhere.
func Token(id uint64, off int) uint32 {
	return uint32(Mix64(id^uint64(off)*0x9e3779b97f4a7c15) % Vocab)
}

// Mix64 is the splitmix64 finalizer the scheme derives token ids with: a
// bijection on uint64 that spreads every input bit over the output.
func Mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// AppendTokens appends the tokens [start, end) of the run segs to dst.
// Cost: one mix per token (about 1 ns).
func AppendTokens(dst []uint32, segs []Segment, start, end int) []uint32 {
	pos := 0
	for _, s := range segs {
		if pos >= end {
			break
		}
		lo, hi := max(start, pos), min(end, pos+s.Len)
		for t := lo; t < hi; t++ {
			dst = append(dst, Token(s.ID, t-pos))
		}
		pos += s.Len
	}
	return dst
}
