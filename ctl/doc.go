// Package ctl is the logic behind kvindexctl, kvindex's operator CLI: it
// calls a kvindex server through api.Client and renders the answers as
// aligned tables for people or as JSON for scripts, and it parses the
// CLI's token, hash and worker arguments. Beside workers and score it has
// the inspection commands: Lookup, Dump, Diff (two servers, by digest then
// key by key), Diagnose, Watch (a stream, printed as it arrives) and Top
// (ListWorkers polled into rates). A failed call is a CallError carrying
// the server's status and a hint for refusals. cmd/kvindexctl only wires
// cobra flags to the functions here.
//
// # Concurrency
//
// Functions keep no state between calls; each command dials its own
// connection (Diff two) and closes it before returning. Rendering
// functions only write to the io.Writer they are given.
package ctl
