package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
	"github.com/kvindex/kvindex/testbed/proc"
)

// startDaemon starts the next daemon process; an exit the soak did not
// ask for ends the run.
func (r *runner) startDaemon() error {
	n := r.Process() + 1
	c, err := proc.Start(fmt.Sprintf("daemon process %d", n), exec.Command(r.bin, "serve", "--config", r.cfgPath), r.logPath(n))
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.child, r.process = c, n
	clear(r.restarts)
	clear(r.reported)
	clear(r.flow)
	r.mu.Unlock()
	go func() {
		<-c.Done()
		if c.Stopping() {
			return
		}
		r.abort("daemon_died", "daemon process %d (pid %d) exited by itself: %v; log %s", n, c.Pid(), c.Err(), r.logPath(n))
	}()
	r.log.Info("daemon started", "process", n, "pid", c.Pid(), "log", r.logPath(n))
	return nil
}

func (r *runner) logPath(n int) string {
	return filepath.Join(r.opts.Dir, fmt.Sprintf("daemon-%d.log", n))
}

func (r *runner) waitReady(ctx context.Context, timeout time.Duration) error {
	c, n := r.currentChild()
	err := c.WaitReady(ctx, timeout, func(ctx context.Context) error {
		_, err := r.client.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{})
		return err
	})
	if err != nil {
		return fmt.Errorf("soak: ListWorkers: %w (log %s)", err, r.logPath(n))
	}
	return nil
}

// stopDaemon stops the current daemon with sig and checks how it ended
// and its log.
func (r *runner) stopDaemon(sig syscall.Signal) {
	c, n := r.currentChild()
	if err := c.Stop(sig, 15*time.Second); err != nil {
		r.fail.Add("daemon_stop", "%v (log %s)", err, r.logPath(n))
	}
	lines, crash, err := ScanLog(r.logPath(n))
	if err != nil {
		r.fail.Add("daemon_log", "%v", err)
	}
	if crash != "" {
		r.fail.Add("daemon_crash", "daemon process %d logged %.200q (log %s)", n, crash, r.logPath(n))
	}
	r.mu.Lock()
	r.errorLines += lines
	r.mu.Unlock()
}

// squat tries to claim PushPod's name on the open listener before its
// engine sends: only the allowlisted listener that routes PushPod may
// create it, so the open one must refuse it (other_listener).
func (r *runner) squat(ctx context.Context) {
	pub, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: r.fleet.OpenPushAddr(), Topic: "kv@" + PushPod + "@" + ModelA})
	if err != nil {
		r.fail.Add("squat", "%v", err)
		return
	}
	defer pub.Close()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pub.WaitForSubscribers(wctx, 1); err != nil {
		r.fail.Add("squat", "%v", err)
		return
	}
	b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: make([]uint32, 16), BlockSize: 16}}, HasDPRank: true}
	if _, err := pub.Publish(b); err != nil {
		r.fail.Add("squat", "%v", err)
		return
	}
	time.Sleep(300 * time.Millisecond)
}

// ScanLog reads a daemon log and returns how many lines were logged at
// level ERROR and the first line that shows a crash (a Go panic or fatal
// error), "" if none.
func ScanLog(path string) (errorLines int, crash string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", fmt.Errorf("soak: read daemon log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"level":"ERROR"`) {
			errorLines++
		}
		if crash == "" && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") || strings.Contains(line, "broken invariant")) {
			crash = line
		}
	}
	return errorLines, crash, sc.Err()
}

// Scrape fetches and parses http://addr/metrics.
func Scrape(ctx context.Context, client *http.Client, addr string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("soak: scrape %s: %w", addr, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("soak: scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("soak: scrape %s: %s", addr, resp.Status)
	}
	s, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("soak: scrape %s: %w", addr, err)
	}
	return s, nil
}

// Metrics are the metric families of one /metrics page, by name.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics reads the Prometheus text format (what the daemon's
// /metrics serves).
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("soak: parse metrics: %w", err)
	}
	return fams, nil
}

// Each calls f with the labels and value of every sample of the counter,
// gauge or untyped metric name.
func (ms Metrics) Each(name string, f func(labels map[string]string, v float64)) {
	for _, m := range ms[name].GetMetric() {
		labels := make(map[string]string, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		f(labels, m.GetCounter().GetValue()+m.GetGauge().GetValue()+m.GetUntyped().GetValue())
	}
}

// Metric returns the sum of the samples named name whose labels include
// every pair of match (nil matches all), and whether any matched.
func Metric(ms Metrics, name string, match map[string]string) (sum float64, found bool) {
	ms.Each(name, func(labels map[string]string, v float64) {
		for k, want := range match {
			if labels[k] != want {
				return
			}
		}
		sum, found = sum+v, true
	})
	return sum, found
}
