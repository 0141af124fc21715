package indexer

// Digest returns an order-independent digest of the worker's resident
// set, the (content key, media mask) pairs of the keys it holds (a key's
// mask is the union over its blocks): the sum, modulo 2^64, of a 64-bit
// mix of each pair. A source worker and every replica restored or fed
// from it (see Delta) have equal digests when they hold the same keys in
// the same media; when they do not, the digests differ but for a chance
// of about 2^-64 (keys are hashes, and the mix is a bijection of the key
// for each mask). Store and block counts are not part of it. An empty
// worker's digest is 0.
//
// It is taken under the worker's mutex, so it is the digest of the state
// after some batch. Cost: O(blocks) and no allocation; a keyed worker's
// engine map holds the keys themselves, while a worker fed engine events
// reads each block's key in the tree, taking a node lock where the
// block's node differs from the previous one's (most blocks: the engine
// map is in hash order). BenchmarkDigest (docs/benchmarks.md): 20 ns per
// block fed engine events, 3.3 ns keyed.
func (w *Worker) Digest() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d uint64
	if w.info.Keyed {
		// A replica's sync check: inline, a call per key costs a sixth.
		for slot := range w.engine.All() {
			d += digestTerm(Key(w.engine.Hash(slot)), w.entry(slot).media())
		}
		return d
	}
	w.eachResidentLocked(func(k Key, media uint8) { d += digestTerm(k, media) })
	return d
}

// eachResidentLocked calls f with each key the worker holds and its media
// mask (the union over its blocks at the key), once per key. Callers hold
// w.mu. Cost: O(blocks); a keyed worker's engine map holds the keys
// themselves, while a worker fed engine events reads each block's key in
// the tree.
func (w *Worker) eachResidentLocked(f func(k Key, media uint8)) {
	if w.info.Keyed {
		for slot := range w.engine.All() {
			f(Key(w.engine.Hash(slot)), w.entry(slot).media())
		}
		return
	}
	for slot := range w.engine.All() {
		e := w.entry(slot)
		l := w.locOf(e)
		if w.aliases != nil && w.aliases[l] != nil {
			continue // once per key, below
		}
		f(w.cur.keyAt(l), e.media())
	}
	for l, a := range w.aliases {
		f(w.cur.keyAt(l), mediaOf(&a.media))
	}
	w.cur.finish()
}

// digestTerm is a key's term in a digest: a bijective mix (a multiply,
// xor-shift and multiply, as in splitmix64's finaliser) of the key offset
// by its media mask, so that a key in other media is another term.
func digestTerm(k Key, media uint8) uint64 {
	x := uint64(k) + (uint64(media)+1)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
