package soak

import (
	"os/exec"
	"syscall"
)

// setChildAttrs makes the daemon die with the soak, so that an
// interrupted soak leaves no daemon holding its ports: the kernel sends it
// SIGKILL when the thread that started it exits, which for a Go program
// (whose runtime keeps its threads) is when the process exits.
func setChildAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
