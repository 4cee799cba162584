package chaos

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPlanFaults: every run meets every kind of fault, a SIGSTOP first, in
// an order its seed draws (the same seed, the same plan); the tiny run each
// kind once, the full run at least its SIGSTOPs and the rest at random.
func TestPlanFaults(t *testing.T) {
	t.Setenv("KUBETASK_CHAOS_FAULTS", "")
	cases := map[string]struct {
		sz         size
		len, stops int
		eachOnce   bool
	}{
		"tiny: each kind once": {sz: tiny, len: len(faultKinds), stops: 1, eachOnce: true},
		"full":                 {sz: full, len: full.stops + full.faults, stops: full.stops},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			plan := func(seed uint64) []string { return planFaults(t, rand.New(rand.NewPCG(seed, seed)), c.sz) }
			p := plan(1)
			if len(p) != c.len || p[0] != faultStop {
				t.Fatalf("plan %v: %d faults, want %d, a SIGSTOP first", p, len(p), c.len)
			}
			for _, k := range faultKinds {
				n := len(slices.DeleteFunc(slices.Clone(p), func(f string) bool { return f != k }))
				switch {
				case k == faultStop && (n < c.stops || c.eachOnce && n != c.stops):
					t.Errorf("%d SIGSTOPs, want %d", n, c.stops)
				case n == 0, c.eachOnce && n != 1:
					t.Errorf("%q %d times", k, n)
				}
			}
			if !slices.Equal(plan(1), p) {
				t.Errorf("seed 1 planned %v, then %v", p, plan(1))
			}
			differs := false
			for seed := uint64(2); seed < 10 && !differs; seed++ {
				differs = !slices.Equal(plan(seed), p)
			}
			if !differs {
				t.Errorf("seeds 1-9 all planned %v", p)
			}
		})
	}
}
