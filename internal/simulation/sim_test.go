//go:debug randautoseed=0
//go:debug randseednop=0

package simulation

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/cryptotest"
	"time"
)

var (
	budget = flag.Duration("sim.budget", 0, "how long TestSimulation runs fresh seeds (default $KUBETASK_SIM_BUDGET or 20s)")
	seeds  = flag.Int("sim.seeds", 0, "run this many seeds instead of a time budget ($KUBETASK_SIM_SEEDS)")
)

// runSeed runs one seed with the crypto/rand stream (the records' nonces)
// drawn from it too.
func runSeed(t *testing.T, opt Options) *Result {
	t.Helper()
	cryptotest.SetGlobalRandom(t, uint64(opt.Seed))
	return Run(t, opt)
}

func replayLine(opt Options) string {
	return fmt.Sprintf("KUBETASK_SIM_SEED=%d KUBETASK_SIM_TASKS=%d KUBETASK_SIM_FAULTS=%d KUBETASK_SIM_NOADOPT=%v go test ./internal/simulation -run 'TestSimulation$' -count=1 -v",
		opt.Seed, opt.Tasks, opt.FaultLevel, opt.NoAdoption)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// TestSimulation runs fresh random seeds for a fixed time budget (or
// KUBETASK_SIM_SEEDS of them), or replays KUBETASK_SIM_SEED. A failing seed
// is shrunk and printed with its replay command and a short trace.
func TestSimulation(t *testing.T) {
	if s := os.Getenv("KUBETASK_SIM_SEED"); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		opt := Options{Seed: seed, Tasks: envInt("KUBETASK_SIM_TASKS", 0), FaultLevel: envInt("KUBETASK_SIM_FAULTS", -1),
			NoAdoption: os.Getenv("KUBETASK_SIM_NOADOPT") == "true"}
		res := runSeed(t, opt)
		t.Logf("seed %d: %d steps, %d events\n%s", seed, res.Steps, len(res.History.Events), res.History.String())
		if os.Getenv("KUBETASK_SIM_LOGS") != "" {
			t.Log(res.Logs)
		}
		report(t, res)
		return
	}
	n := *seeds
	if n == 0 {
		n = envInt("KUBETASK_SIM_SEEDS", 0)
	}
	d := *budget
	if d == 0 {
		d = 30 * time.Second
		if v, err := time.ParseDuration(os.Getenv("KUBETASK_SIM_BUDGET")); err == nil {
			d = v
		}
		if os.Getenv("KUBETASK_SIM_BUDGET") == "0" {
			t.Skip("KUBETASK_SIM_BUDGET=0")
		}
	}
	base := time.Now().UnixNano()
	start := time.Now()
	var ran, steps int
	for i := 0; n > 0 && i < n || n == 0 && time.Since(start) < d; i++ {
		seed := base + int64(i)
		// The adoption scenario still finds open defects on main (tasks
		// the adopted instance finished keep their pods' finalizer, a
		// cancellation sent to the adopter is never applied:
		// docs/simulation.md); it runs with KUBETASK_SIM_ADOPT=1 (make sim).
		res := runSeed(t, Options{Seed: seed, FaultLevel: -1, NoAdoption: os.Getenv("KUBETASK_SIM_ADOPT") != "1"})
		ran++
		steps += res.Steps
		if len(res.Violations) > 0 || len(res.Unknown) > 0 {
			t.Logf("seed %d fails; shrinking", seed)
			report(t, shrink(t, res))
			break
		}
	}
	el := time.Since(start)
	t.Logf("%d seeds (%d..%d) in %s: %.1f seeds/s, %.0f steps/s", ran, base, base+int64(ran)-1, el.Round(time.Millisecond),
		float64(ran)/el.Seconds(), float64(steps)/el.Seconds())
}

// shrink looks for a smaller run of the same seed that still breaks the
// same invariant: fewer tasks, fewer faults, no adoption.
func shrink(t *testing.T, res *Result) *Result {
	inv := res.Violations
	if len(inv) == 0 {
		return res
	}
	want := inv[0].Invariant
	best := res
	still := func(opt Options) bool {
		r := runSeed(t, opt)
		for _, v := range r.Violations {
			if v.Invariant == want {
				if len(r.History.Events) < len(best.History.Events) {
					best = r
				}
				return true
			}
		}
		return false
	}
	opt := best.Options
	if !opt.NoAdoption {
		o := opt
		o.NoAdoption = true
		if still(o) {
			opt = o
		}
	}
	for n := 1; n < 8; n++ {
		o := opt
		o.Tasks = n
		if still(o) {
			opt = o
			break
		}
	}
	for l := 0; l < opt.FaultLevel; l++ {
		o := opt
		o.FaultLevel = l
		if still(o) {
			break
		}
	}
	return best
}

// report fails t with res's violations, its replay command and the trace of
// the tasks involved.
func report(t *testing.T, res *Result) {
	t.Helper()
	if len(res.Unknown) > 0 {
		t.Errorf("requests the simulated API server does not model: %v", res.Unknown)
	}
	if len(res.Violations) == 0 {
		return
	}
	var b strings.Builder
	for i, v := range res.Violations {
		if i == 10 {
			fmt.Fprintf(&b, "... and %d more\n", len(res.Violations)-10)
			break
		}
		b.WriteString(v.String() + "\n")
	}
	fmt.Fprintf(&b, "replay: %s\ntrace of %s:\n%s", replayLine(res.Options), res.Violations[0].Task, trace(res, res.Violations[0].Task))
	t.Errorf("seed %d: %d violations:\n%s", res.Options.Seed, len(res.Violations), b.String())
}

// trace is the part of the history a person reads first: the task's events,
// the faults and the processes' lives.
func trace(res *Result, taskID string) string {
	var b strings.Builder
	for _, e := range res.History.Events {
		if e.Task == taskID || e.Task == "" {
			b.WriteString(e.String() + "\n")
		}
	}
	return b.String()
}

// TestSameSeedSameHistory: a seed decides everything; two runs of one seed
// write the same history, byte for byte.
func TestSameSeedSameHistory(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		opt := Options{Seed: seed, FaultLevel: -1}
		a := runSeed(t, opt).History.String()
		b := runSeed(t, opt).History.String()
		if a != b {
			al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
			for i := range min(len(al), len(bl)) {
				if al[i] != bl[i] {
					t.Errorf("seed %d: the histories differ from line %d:\n  %s\n  %s", seed, i+1, al[i], bl[i])
					break
				}
			}
			if len(al) != len(bl) {
				t.Errorf("seed %d: %d lines, then %d", seed, len(al), len(bl))
			}
		}
	}
}

// TestHunt runs KUBETASK_SIM_HUNT fresh seeds without stopping at a failure
// and tells, for each invariant, how many seeds broke it and after how many
// seeds it first broke: how the simulator finds a defect by itself.
func TestHunt(t *testing.T) {
	n := envInt("KUBETASK_SIM_HUNT", 0)
	if n == 0 {
		t.Skip("KUBETASK_SIM_HUNT=N runs N seeds and counts the violations by invariant")
	}
	base := int64(envInt("KUBETASK_SIM_BASE", int(time.Now().UnixNano())))
	type tally struct {
		seeds int
		first int
		seed  int64
		msg   string
	}
	found := map[string]*tally{}
	start := time.Now()
	for i := range n {
		seed := base + int64(i)
		res := runSeed(t, Options{Seed: seed, FaultLevel: -1})
		seen := map[string]bool{}
		for _, v := range res.Violations {
			if seen[v.Invariant] {
				continue
			}
			seen[v.Invariant] = true
			f := found[v.Invariant]
			if f == nil {
				f = &tally{first: i + 1, seed: seed, msg: v.String()}
				found[v.Invariant] = f
			}
			f.seeds++
		}
	}
	el := time.Since(start)
	t.Logf("%d seeds from %d in %s (%.1f seeds/s)", n, base, el.Round(time.Millisecond), float64(n)/el.Seconds())
	for _, inv := range []string{InvOneRun, InvAfter, InvConcurrent, InvOutcome, InvLeft, InvLiveness, InvValid, InvOwnPod} {
		if f := found[inv]; f != nil {
			t.Logf("%-60s %4d seeds; first at seed #%d (KUBETASK_SIM_SEED=%d): %s", inv, f.seeds, f.first, f.seed, f.msg)
		} else {
			t.Logf("%-60s    0 seeds", inv)
		}
	}
}
