//go:build !linux

package soak

import "os/exec"

// setChildAttrs has nothing to set outside Linux.
func setChildAttrs(*exec.Cmd) {}
