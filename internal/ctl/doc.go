// Package ctl is the logic behind kvindexctl, kvindex's debug CLI: it
// calls a kvindex server through api.Client and renders the answers as
// aligned tables for people or as protojson for scripts, and it parses the
// CLI's token and worker arguments. cmd/kvindexctl only wires cobra flags
// to the functions here.
//
// # Concurrency
//
// Functions keep no state between calls; each command dials its own
// connection and closes it before returning. Rendering functions only write
// to the io.Writer they are given.
package ctl
