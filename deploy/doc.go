// Package deploy holds no code: its tests keep kvindex's deployment files
// honest. They load docker-compose.yaml with compose-spec's Go loader,
// render the Helm chart (deploy/helm/kvindex) with Helm's Go SDK and decode
// every manifest strictly into Kubernetes API types, parse and validate
// every kvindex configuration those mount, run promtool on the alert rules,
// check that every metric a rule or dashboard panel names exists in the
// /metrics of live daemons, agents and engines, and that the Dockerfile
// builds as `make build` does.
//
// It is a module of its own (deploy/go.mod, with a replace of the service's
// module) so that the Helm SDK and the compose loader, test-only and heavy,
// stay out of the service's go.mod. `make test` and `make lint` cover it.
package deploy
