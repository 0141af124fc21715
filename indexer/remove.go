package indexer

// Gen returns the generation of the worker's id (see WorkerID).
func (w *Worker) Gen() uint32 { return w.gen }

// retire clears the worker's blocks from the index, publishing the change,
// and makes the handle refuse further events. Callers hold ix.mu (never
// held with the others, so the lock order holds).
func (w *Worker) retire() {
	w.mu.Lock()
	before := w.res
	w.clearLocked()
	w.gone = true
	w.unlockThen(before, after{})
}
