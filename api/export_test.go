package api

// Refusals returns all listeners' refusals: unauthenticated and denied.
func (a *Auth) Refusals() (unauthenticated, denied int64) {
	for _, r := range a.RefusalsByListener() {
		if r.Reason == RefusedUnauthenticated {
			unauthenticated += r.N
		} else {
			denied += r.N
		}
	}
	return unauthenticated, denied
}
