// Package fleetbench measures fleet mode end to end.
package fleetbench
