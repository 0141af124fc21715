//go:build !nokubernetes

package config

import "k8s.io/apimachinery/pkg/labels"

// checkSelector parses a Kubernetes label selector as discovery will.
func checkSelector(s string) error {
	_, err := labels.Parse(s)
	return err
}
