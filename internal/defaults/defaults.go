// Package defaults fills option fields left unset. It has no state.
package defaults

import "cmp"

// Positive sets *v to def unless *v is positive: for options whose zero (or
// negative) value means "the default".
func Positive[T cmp.Ordered](v *T, def T) {
	var zero T
	if *v <= zero {
		*v = def
	}
}

// Zero sets *v to def when *v is the zero value: for options whose
// negative values mean something of their own.
func Zero[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
