package indexer

// Digest returns an order-independent digest of the worker's resident set,
// its (content key, media mask) pairs (a key's mask is the union over its
// blocks) and its side groups' (group, held key) pairs: the sum, modulo
// 2^64, of a bijective mix of each pair. A source
// and its replicas have equal digests exactly when they hold the same keys
// in the same media, but for a chance of about 2^-64; counts are not part
// of it, and an empty worker's digest is 0. Taken under the worker's mutex.
// Cost: O(blocks), no allocation (BenchmarkDigest).
func (w *Worker) Digest() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.sideDigestLocked()
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

// eachResidentLocked calls f once for each key the worker holds, with its
// media mask. Cost: O(blocks); a worker fed engine events reads each
// block's key in the tree.
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

// digestTerm is a key's term in a digest: splitmix64's finaliser of the
// key offset by its media mask.
func digestTerm(k Key, media uint8) uint64 {
	x := uint64(k) + (uint64(media)+1)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
