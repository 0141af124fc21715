package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// tier_weights, tier_names and unknown_tier parse into the policy and the
// medium table; the older weight keys stay aliases under tier_weights.
func TestParseTiers(t *testing.T) {
	c, err := Parse([]byte(`
scoring:
  cpu_weight: 0.7
  storage_weight: 0.4
  tier_weights: {gpu: 1, disk: 0.3, other: 0.1, external: 0}
  tier_names: {CPU_TIER3: disk, my_fs: storage, SHARED_STORAGE: external}
  unknown_tier: storage
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Policy()
	if err != nil {
		t.Fatal(err)
	}
	if want := [events.NumMedia]float64{1, 0.7, 0.4, 0.3, 0, 0.1}; p.Weights != want {
		t.Errorf("weights %v, want %v", p.Weights, want)
	}
	tiers, err := c.Tiers()
	if err != nil {
		t.Fatal(err)
	}
	b := &events.Batch{Events: []events.Event{
		{Kind: events.KindBlockStored, Medium: events.MediumOther, MediumName: "cpu_tier3"},
		{Kind: events.KindBlockStored, Medium: events.MediumOther, MediumName: "MY_FS"},
		{Kind: events.KindBlockRemoved, Medium: events.MediumStorage, MediumName: "SHARED_STORAGE"},
		{Kind: events.KindBlockRemoved, Medium: events.MediumOther, MediumName: "TAPE"},
	}}
	n, name := tiers.Classify(b)
	for i, want := range []events.Medium{events.MediumDisk, events.MediumStorage, events.MediumExternal, events.MediumStorage} {
		if b.Events[i].Medium != want {
			t.Errorf("%s: %v, want %v", b.Events[i].MediumName, b.Events[i].Medium, want)
		}
	}
	if n != 1 || name != "TAPE" {
		t.Errorf("unknown %d %q, want 1 TAPE", n, name)
	}
	// The defaults add nothing to the built-in table.
	if tiers, err := Default().Tiers(); tiers != nil || err != nil {
		t.Errorf("Default().Tiers() = %v, %v; want nil", tiers, err)
	}
}

// Bad tier settings are refused, naming the setting and the entry.
func TestTierSettingsInvalid(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"tier_weights: {cpu: -0.5}", "scoring: tier_weights.cpu: -0.5 must be a finite number from 0 to 1e6"},
		{"tier_weights: {gpu: .inf}", "scoring: tier_weights.gpu: +Inf must be"},
		{"tier_weights: {nvme: 1}", `scoring: tier_weights: unknown tier "nvme" (want gpu, cpu, storage, disk, external or other)`},
		{"tier_weights: {cpu: 1, CPU: 1}", "scoring: tier_weights.cpu: given twice"},
		{"tier_names: {FOO: fast}", `scoring: tier_names.FOO: "fast" is no tier (want gpu, cpu, storage, disk, external or other)`},
		{"tier_names: {FOO: cpu_pinned}", `scoring: tier_names.FOO: "cpu_pinned" is no tier`},
		{"tier_names: {'': cpu}", "scoring: tier_names: a medium name is empty"},
		{"tier_names: {foo: cpu, FOO: disk}", `scoring: tier_names: "FOO" and "foo" name the same medium`},
		{"unknown_tier: nowhere", `scoring: unknown_tier: "nowhere" is no tier`},
	} {
		_, err := Parse([]byte("scoring:\n  " + tc.yaml + "\n"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v\nwant it to contain %q", tc.yaml, err, tc.want)
		}
	}
}
