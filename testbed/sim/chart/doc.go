// Package chart writes small, dependency-free SVG charts for kvsim's
// reports: line charts with linear or logarithmic axes (TTFT CDFs, hit rate
// against cache size) and grouped bar charts. The SVG is plain text meant
// to be committed and read in a browser or on GitHub.
//
// Functions are pure; nothing is shared between calls.
package chart
