package indexer

// Gen returns the generation of the worker's id: a worker added in the
// place of a removed one has the same ID and a higher Gen.
func (w *Worker) Gen() uint32 { return w.gen }

// Removed reports whether RemoveWorker removed the worker.
func (w *Worker) Removed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gone
}

// retire clears every block of the worker from the index, publishing the
// change, and makes the handle refuse further events. Callers hold ix.mu
// (which is never held with the others, so taking w.mu here keeps the
// lock order: registration, then the worker).
func (w *Worker) retire() {
	w.mu.Lock()
	before := w.res
	w.clearLocked()
	w.gone = true
	w.unlockThen(before, after{})
}
