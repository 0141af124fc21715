//go:build !linux

package proc

import "os/exec"

// setChildAttrs has nothing to set outside Linux.
func setChildAttrs(*exec.Cmd) {}
