// Package quote renders values a client sent for error messages and logs,
// capped: a request may carry a megabyte-long model or pod name, and an
// error must not echo it back (or write it to a log) whole.
//
// The functions are pure and safe for concurrent use.
package quote

import (
	"strconv"
	"unicode/utf8"
)

// Max is the most bytes of a value an echo shows.
const Max = 64

// Q returns s quoted as %q would, cut to its first Max bytes (at a rune
// boundary) with the full length noted when longer.
func Q(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	cut := Max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// S returns s unquoted, cut as Q cuts it: for values printed bare, such
// as a worker's "pod/rank".
func S(s string) string {
	if len(s) <= Max {
		return s
	}
	cut := Max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "... (" + strconv.Itoa(len(s)) + " bytes)"
}
