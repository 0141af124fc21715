//go:build !linux

package indexer

// threadSwitches is not measured outside Linux.
func threadSwitches() int64 { return 0 }
