package zmq

// IsPullPod reports whether pod is a pull-mode pod, refused by push listeners.
func (s *Subscriber) IsPullPod(pod string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pullPods[pod]
}
