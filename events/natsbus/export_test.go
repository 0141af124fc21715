package natsbus

// Partial reports whether worker rank is marked partial (SetPartial).
func (a *Agent) Partial(rank int) bool {
	w := a.workers[rank]
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.partial
}
