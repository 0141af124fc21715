//go:build nokubernetes

package config

import "errors"

// checkSelector refuses every selector: a build with -tags nokubernetes
// has no Kubernetes discovery to give it to.
func checkSelector(string) error {
	return errors.New("this kvindex is built with -tags nokubernetes, without Kubernetes discovery")
}
