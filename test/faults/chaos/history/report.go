package history

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Table is the report as a Markdown table: the counts, then one row per
// invariant with its violations.
func (r *Report) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| history | count |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| tasks (records) | %d |\n", r.Tasks)
	fmt.Fprintf(&b, "| attempt outcomes recorded | %d |\n", r.Outcomes)
	fmt.Fprintf(&b, "| pods created / ran (bound) | %d / %d |\n", r.PodsCreated, r.PodsRan)
	fmt.Fprintf(&b, "| created, never ran: fenced (gated) / other | %d / %d |\n", r.Fenced, r.NotRun)
	fmt.Fprintf(&b, "| attempts with several pods created / run | %d / %d |\n", r.SeveralCreates, r.SeveralRuns)
	fmt.Fprintf(&b, "| pods created after their attempt's outcome | %d |\n", r.CreatedAfterOutcome)
	fmt.Fprintf(&b, "| creates answered AlreadyExists (after the attempt's outcome) | %d (%d) |\n", r.Refused, r.RefusedAfterOutcome)
	fmt.Fprintf(&b, "| pods that ran seen stopped by | %s |\n", counts(r.Stopped))
	fmt.Fprintf(&b, "| logs archived (ending in a marker) | %d (%s) |\n", r.Logs, counts(r.Markers))
	if r.Lost > 0 {
		fmt.Fprintf(&b, "| attempts declared lost with their cluster (not judged by 3, 4, 6) | %d |\n", r.Lost)
	}
	fmt.Fprintf(&b, "\n| invariant | violations |\n| --- | --- |\n")
	for _, inv := range Invariants {
		fmt.Fprintf(&b, "| %s | %d |\n", inv, r.Count(inv))
	}
	return b.String()
}

// Examples lists up to n violations of each invariant, one a line.
func (r *Report) Examples(n int) string {
	var b strings.Builder
	shown := map[Invariant]int{}
	for _, v := range r.Violations {
		if shown[v.Invariant]++; shown[v.Invariant] <= n {
			fmt.Fprintln(&b, v)
		}
	}
	for _, inv := range Invariants {
		if k := shown[inv]; k > n {
			fmt.Fprintf(&b, "... and %d more of [%s]\n", k-n, inv)
		}
	}
	return b.String()
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
