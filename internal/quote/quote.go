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
	head, more := cut(s)
	return strconv.Quote(head) + more
}

// S returns s unquoted, cut as Q cuts it: for values printed bare, such
// as a worker's "pod/rank".
func S(s string) string {
	head, more := cut(s)
	return head + more
}

// cut returns s's first Max bytes (at a rune boundary) and, when it is
// longer, the note of its full length.
func cut(s string) (head, more string) {
	if len(s) <= Max {
		return s, ""
	}
	n := Max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], "... (" + strconv.Itoa(len(s)) + " bytes)"
}
