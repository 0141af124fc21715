package soak

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
)

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
