// Package ctl is the logic behind kvindexctl, kvindex's operator CLI: it
// calls a kvindex server through api.Client and renders the answers as
// aligned tables for people or as JSON for scripts, and it parses the
// CLI's token, hash and worker arguments. A failed call is a CallError
// carrying the server's status and a hint for refusals.
//
// Functions keep no state between calls; each command dials its own
// connection (Diff two) and closes it before returning.
package ctl
