package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times.
const clockTicks = 100

// CPU returns the user plus system CPU time process pid has used.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("proc: CPU of pid %d: %w", pid, err)
	}
	return parseStatCPU(string(b), pid)
}

func parseStatCPU(stat string, pid int) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc: CPU of pid %d: malformed stat %.80q", pid, stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("proc: CPU of pid %d: stat has %d fields after the name", pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proc: CPU of pid %d: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(u+s) * time.Second / clockTicks, nil
}

// Memory is a process's resident set size now and at its peak, in bytes.
type Memory struct{ RSS, Peak int64 }

// Mem returns process pid's VmRSS and VmHWM.
func Mem(pid int) (Memory, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Memory{}, fmt.Errorf("proc: memory of pid %d: %w", pid, err)
	}
	return parseStatus(string(b), pid)
}

func parseStatus(status string, pid int) (Memory, error) {
	var m Memory
	rss := false
	for _, line := range strings.Split(status, "\n") {
		name, rest, _ := strings.Cut(line, ":")
		var v *int64
		switch name {
		case "VmRSS":
			v, rss = &m.RSS, true
		case "VmHWM":
			v = &m.Peak
		default:
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("proc: memory of pid %d: line %q", pid, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("proc: memory of pid %d: line %q: %w", pid, line, err)
		}
		*v = kb << 10
	}
	if !rss {
		return m, fmt.Errorf("proc: memory of pid %d: no VmRSS line", pid)
	}
	return m, nil
}

// SelfCPU returns the CPU time (user and system) this process has used.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // fails only for a bad "who"
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// SelfPeakRSS returns this process's peak resident set size in bytes.
func SelfPeakRSS() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Maxrss << 10 // KiB on Linux
}

// BusyCPU returns the CPU time every process of the machine has used
// (user, nice, system, irq, softirq, steal of /proc/stat), to tell how
// much other processes ran during a measurement; 0 when unknown.
func BusyCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// LoadAvg returns /proc/loadavg's 1-, 5- and 15-minute load averages,
// each -1 when unknown.
func LoadAvg() [3]float64 {
	l := [3]float64{-1, -1, -1}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := range min(3, len(f)) {
		if v, err := strconv.ParseFloat(f[i], 64); err == nil {
			l[i] = v
		}
	}
	return l
}
