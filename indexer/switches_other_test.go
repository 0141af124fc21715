//go:build !linux

package indexer

import "time"

// threadSwitches is not measured outside Linux.
func threadSwitches() int64 { return 0 }

// threadCPU is not measured outside Linux.
func threadCPU() (time.Duration, bool) { return 0, false }
