package task_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubetask/kubetask/pkg/task"
)

// airflowKey is an Airflow task-instance key: DAG ID, task ID, run ID, try.
const airflowKey = "etl_dag.Extract_Users.scheduled__2026-12-01T00:00:00+00:00.1"

func TestValidateID(t *testing.T) {
	for id, ok := range map[string]bool{
		"nightly-2026-12-02":               true,
		airflowKey:                         true,
		strings.Repeat("k", 63):            true,
		strings.Repeat("k", 64):            true,
		strings.Repeat("k", 512):           true,
		"with spaces inside":               true,
		"percent%20and?query#fragment":     true,
		"Ünïcödé ✓ 任务":                     true,
		"a.b:c+d@e=f,g;h[i]{j}(k)'l\"m\\n": true,
		"...":                              true,
		".hidden":                          true,
		"":                                 false,
		strings.Repeat("k", 513):           false,
		"a/b":                              false,
		"/":                                false,
		".":                                false,
		"..":                               false,
		" leading":                         false,
		"trailing ":                        false,
		"trailing\u00a0":                   false,
		"tab\tinside":                      false,
		"new\nline":                        false,
		"nul\x00":                          false,
		"del\x7f":                          false,
		"c1\u0085":                         false,
		"line\u2028separator":              false,
		"invalid \xff UTF-8":               false,
	} {
		err := task.ValidateID(id)
		if (err == nil) != ok {
			t.Errorf("ValidateID(%q) = %v, want ok %v", id, err, ok)
		}
	}
}

// TestRunLabelValue: an ID that is a label value is its own label value, as
// before IDs could be longer (pods running across an upgrade keep their
// labels); any other ID gets a label value derived from all of it.
func TestRunLabelValue(t *testing.T) {
	for _, id := range []string{"nightly-2026-12-02", "t01j9z3k4m5n6p7q8r9s0t1v2w3", "A.b_c", strings.Repeat("k", 63)} {
		if got := task.RunLabelValue(id); got != id {
			t.Errorf("RunLabelValue(%q) = %q, want the ID itself", id, got)
		}
	}
	seen := map[string]string{}
	for _, id := range []string{
		airflowKey, strings.Replace(airflowKey, ".1", ".2", 1), strings.Repeat("k", 64), strings.Repeat("k", 65),
		strings.Repeat("k", 512), "with spaces", "Ünïcödé ✓ 任务", "-leading-dash", "trailing-dash-", "?",
	} {
		got := task.RunLabelValue(id)
		if msgs := validation.IsValidLabelValue(got); len(msgs) > 0 {
			t.Errorf("RunLabelValue(%q) = %q is not a label value: %v", id, got, msgs)
		}
		if got != task.RunLabelValue(id) {
			t.Errorf("RunLabelValue(%q) is not deterministic", id)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("RunLabelValue(%q) = RunLabelValue(%q) = %q", id, prev, got)
		}
		seen[got] = id
	}
	if got := task.RunLabelValue(airflowKey); !strings.HasPrefix(got, "etl-dag-extract-users-scheduled") {
		t.Errorf("RunLabelValue(%q) = %q: want the ID's start readable in it", airflowKey, got)
	}
}

// TestSchedulerIDRoundTripsThroughThePod: a pod built for an ID that is not
// a label value carries the exact ID in its annotation and derived values in
// its name and labels, and its identity reads back exact.
func TestSchedulerIDRoundTripsThroughThePod(t *testing.T) {
	tk := load(t, "hello-task.yaml")
	for _, runID := range []string{airflowKey, strings.Repeat("k", 512), "Ünïcödé ✓ 任务"} {
		ident := task.Identity{Namespace: "jobs", Name: tk.Name, RunID: runID, Executor: "exec-a"}
		pod, err := task.BuildPod(tk, ident, 1)
		if err != nil {
			t.Fatalf("BuildPod(%q): %v", runID, err)
		}
		if errs := validation.IsDNS1123Label(pod.Name); len(errs) > 0 {
			t.Errorf("pod name %q: %v", pod.Name, errs)
		}
		for k, v := range pod.Labels {
			if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
				t.Errorf("label %s=%q: %v", k, v, msgs)
			}
		}
		if pod.Annotations[task.AnnotationRun] != runID || pod.Labels[task.LabelRun] != task.RunLabelValue(runID) {
			t.Errorf("annotation %q, label %q", pod.Annotations[task.AnnotationRun], pod.Labels[task.LabelRun])
		}
		got, n, err := task.IdentityFromPod(pod)
		if err != nil || got != ident || n != 1 {
			t.Errorf("IdentityFromPod() = %+v, %d, %v; want %+v", got, n, err, ident)
		}
		if !task.RunSelector(ident).Matches(labelsOf(pod)) {
			t.Error("RunSelector does not match the pod")
		}
	}
}

// TestPodNamesOfLabelValueIDsAreUnchanged: the pod of a task whose ID is a
// label value has the name and labels it had before IDs could be longer, so
// pods running across an upgrade are adopted (name from docs/api.md's
// recorded session: task hello-cli, name hello, namespace default).
func TestPodNamesOfLabelValueIDsAreUnchanged(t *testing.T) {
	ident := task.Identity{Namespace: "default", Name: "hello", RunID: "hello-cli", Executor: "serve"}
	if got := task.PodName(ident, 0); got != "hello-fqjm3cxwvg-0" {
		t.Errorf("PodName = %q, want hello-fqjm3cxwvg-0", got)
	}
	if got := task.PodLabels(ident, 0)[task.LabelRun]; got != "hello-cli" {
		t.Errorf("run label %q, want hello-cli", got)
	}
}
