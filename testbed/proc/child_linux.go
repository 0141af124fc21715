package proc

import (
	"os/exec"
	"syscall"
)

// setChildAttrs makes the child die with this process: the kernel sends
// it SIGKILL when the thread that started it exits, which for a Go
// program (whose runtime keeps its threads) is when the process exits.
func setChildAttrs(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
