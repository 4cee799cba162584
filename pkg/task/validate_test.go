package task_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// base is a valid task; rows replace parts of it.
const base = `apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata: {name: t1}
spec:
  template:
    spec:
      containers:
        - {name: base, image: busybox}
`

func withSpec(spec string) string {
	return "apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: t1}\nspec:\n" + spec
}

// TestLoadErrors lists every error Load reports, each with its field path and the
// advice it gives.
func TestLoadErrors(t *testing.T) {
	cases := map[string]struct {
		doc  string
		want []string // fragments of the error, in order of appearance; the first is the field path
	}{
		"unknown field in spec": {
			doc:  strings.Replace(base, "spec:\n", "spec:\n  retrys: {limit: 1}\n", 1),
			want: []string{`spec.retrys: Forbidden: unknown field`, "check its spelling"},
		},
		"unknown field deep in the pod template": {
			doc:  strings.Replace(base, "image: busybox", "image: busybox, comand: [ls]", 1),
			want: []string{`spec.template.spec.containers[0].comand: Forbidden: unknown field`},
		},
		"unknown field in a plain pod is reported at the pod's path": {
			doc:  "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: busybox, imagee: x}]\n",
			want: []string{`spec.containers[0].imagee: Forbidden: unknown field`},
		},
		"duplicate key": {
			doc:  strings.Replace(base, "metadata: {name: t1}", "metadata: {name: t1, name: t2}", 1),
			want: []string{"decoding task", `"name" already set`},
		},
		"wrong type": {
			doc:  withSpec("  retries: {limit: two}\n  template: {spec: {containers: [{name: base, image: busybox}]}}\n"),
			want: []string{`spec.retries.limit: Invalid value: "string": must be a whole number`},
		},
		"wrong kind": {
			doc:  "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n",
			want: []string{`kind: Invalid value: "Job": must be kind Task with apiVersion kubetask.dev/v1alpha1, or kind Pod with apiVersion v1`},
		},
		"several documents": {
			doc:  base + "---\n" + base,
			want: []string{"several YAML documents"},
		},
		"empty document": {
			doc:  "\n# nothing\n",
			want: []string{"decoding task"},
		},
		"missing name": {
			doc:  strings.Replace(base, "metadata: {name: t1}", "metadata: {}", 1),
			want: []string{"metadata.name: Required value: name the task"},
		},
		"bad name": {
			doc:  strings.Replace(base, "name: t1", "name: T_1", 1),
			want: []string{`metadata.name: Invalid value: "T_1"`, "lowercase"},
		},
		"no containers": {
			doc:  withSpec("  template: {spec: {containers: []}}\n"),
			want: []string{"spec.template.spec.containers: Required value: add at least one container"},
		},
		"several containers and no main named": {
			doc:  withSpec("  template: {spec: {containers: [{name: app, image: a}, {name: envoy, image: e}]}}\n"),
			want: []string{"spec.mainContainer: Required value", "none is named base or main", "kubetask.dev/main-container", "--main-container", "one of app, envoy"},
		},
		"main container not found": {
			doc:  withSpec("  mainContainer: app\n  template: {spec: {containers: [{name: base, image: a}, {name: envoy, image: e}]}}\n"),
			want: []string{`spec.mainContainer: Invalid value: "app": no container named "app"`, "one of base, envoy"},
		},
		"main container is an init container": {
			doc:  withSpec("  mainContainer: setup\n  template: {spec: {initContainers: [{name: setup, image: a}], containers: [{name: base, image: a}, {name: x, image: e}]}}\n"),
			want: []string{`spec.mainContainer: Invalid value: "setup": "setup" is an init container`},
		},
		"unknown cleanup": {
			doc:  withSpec("  cleanup: Never\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.cleanup: Unsupported value: "Never": supported values: "Delete", "DeleteSucceeded", "Keep"`},
		},
		"bad duration": {
			doc:  withSpec("  timeouts: {run: 5 minutes}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.timeouts.run: Invalid value: "5 minutes": must be a duration such as 90s, 5m or 1h30m`},
		},
		"negative duration": {
			doc:  withSpec("  timeouts: {schedule: -5m}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.timeouts.schedule: Invalid value: "-5m": must not be negative; use 0s for no limit`},
		},
		"negative retry limit": {
			doc:  withSpec("  retries: {limit: -1}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.retries.limit: Invalid value: -1: must be between 0 (no retries) and 100`},
		},
		"bad backoff": {
			doc:  withSpec("  retries: {backoff: soon}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.retries.backoff: Invalid value: "soon": must be a duration`},
		},
		"unknown retryOn": {
			doc:  withSpec("  retries: {retryOn: [Always]}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.retries.retryOn[0]: Unsupported value: "Always"`, `"Infrastructure"`, `"ExitCode"`},
		},
		"a cancelled task is never retried": {
			doc:  withSpec("  retries: {retryOn: [Cancelled]}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.retries.retryOn[0]: Unsupported value: "Cancelled"`},
		},
		"result without from": {
			doc:  withSpec("  result: {path: /out/r.json}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{"spec.result.from: Required value: say where the result comes from: File or TerminationMessage"},
		},
		"file result without path": {
			doc:  withSpec("  result: {from: File}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{"spec.result.path: Required value: give the absolute path"},
		},
		"file result with a relative path": {
			doc:  withSpec("  result: {from: File, path: out/r.json}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.path: Invalid value: "out/r.json": must be an absolute, clean file path`},
		},
		"file result in the root directory": {
			doc:  withSpec("  result: {from: File, path: /r.json}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.path: Invalid value: "/r.json": the result file needs a directory of its own`},
		},
		"file result on a read-only volume": {
			doc:  withSpec("  result: {from: File, path: /config/r.json}\n  template: {spec: {containers: [{name: base, image: a, volumeMounts: [{name: cfg, mountPath: /config, readOnly: true}]}], volumes: [{name: cfg, configMap: {name: c}}]}}\n"),
			want: []string{`spec.result.path: Invalid value: "/config/r.json": the main container mounts volume "cfg" read-only at /config`},
		},
		"file result directory would hide a volume": {
			doc:  withSpec("  result: {from: File, path: /data/r.json}\n  template: {spec: {containers: [{name: base, image: a, volumeMounts: [{name: d, mountPath: /data/in}]}], volumes: [{name: d, emptyDir: {}}]}}\n"),
			want: []string{`spec.result.path: Invalid value: "/data/r.json": kubetask mounts a shared volume at /data, which would hide volume "d"`},
		},
		"file result too large": {
			doc:  withSpec("  result: {from: File, path: /out/r.json, maxBytes: 1Gi}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.maxBytes: Invalid value: "1Gi": must be between 1 and 67108864 bytes`},
		},
		"malformed maxBytes": {
			doc:  withSpec("  result: {from: File, path: /out/r.json, maxBytes: lots}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.maxBytes: Invalid value: "lots": must be a byte count such as 4096, 64Ki or 1Mi`},
		},
		"termination message result too large": {
			doc:  withSpec("  result: {from: TerminationMessage, maxBytes: 8Ki}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.maxBytes: Invalid value: "8Ki"`, "use from: File for larger results"},
		},
		"termination message path disagrees with the container": {
			doc:  withSpec("  result: {from: TerminationMessage, path: /tmp/out}\n  template: {spec: {containers: [{name: base, image: a, terminationMessagePath: /dev/other}]}}\n"),
			want: []string{`spec.result.path: Invalid value: "/tmp/out": the main container's terminationMessagePath is /dev/other`},
		},
		"unknown result source": {
			doc:  withSpec("  result: {from: Stdout}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.from: Unsupported value: "Stdout"`},
		},
		"logs of an unknown container": {
			doc:  withSpec("  logs: {containers: [base, proxy]}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.logs.containers[1]: Not found: "proxy"`},
		},
		"restartPolicy Always never completes": {
			doc:  withSpec("  template: {spec: {restartPolicy: Always, containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "Never (default)", "OnFailure"`},
		},
		"reserved label": {
			doc:  withSpec("  template: {metadata: {labels: {kubetask.dev/task: x}}, spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.template.metadata.labels[kubetask.dev/task]: Invalid value: "kubetask.dev/task": label keys under kubetask.dev/`},
		},
		"reserved container name": {
			doc:  withSpec("  mainContainer: base\n  template: {spec: {containers: [{name: base, image: a}, {name: kubetask-result, image: a}]}}\n"),
			want: []string{`spec.template.spec.containers[1].name: Invalid value: "kubetask-result": this container name is reserved`},
		},
		// Rejected by the API server's own validation, reported at the task's paths.
		"API server: missing image": {
			doc:  withSpec("  template: {spec: {containers: [{name: base}]}}\n"),
			want: []string{"spec.template.spec.containers[0].image: Required value"},
		},
		"API server: bad container name": {
			doc:  withSpec("  template: {spec: {containers: [{name: Base_1, image: a}]}}\n"),
			want: []string{`spec.template.spec.containers[0].name: Invalid value: "Base_1"`},
		},
		"API server: mount of an undefined volume": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, volumeMounts: [{name: nope, mountPath: /x}]}]}}\n"),
			want: []string{`spec.template.spec.containers[0].volumeMounts[0].name: Not found: "nope"`},
		},
		"API server: requests above limits": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, resources: {requests: {cpu: 2}, limits: {cpu: 1}}}]}}\n"),
			want: []string{`spec.template.spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to cpu limit`},
		},
		"API server: plain pod errors at the pod's paths": {
			doc:  "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: busybox, ports: [{containerPort: 70000}]}]\n",
			want: []string{`spec.containers[0].ports[0].containerPort: Invalid value: 70000`},
		},
		"API server: invalid result holder image": {
			doc:  withSpec("  result: {from: File, path: /out/r.json, image: ' busybox'}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.image: Invalid value: " busybox": must not have leading or trailing whitespace`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := task.Parse([]byte(tc.doc))
			if err == nil {
				t.Fatal("Parse() succeeded; want an error")
			}
			msg := err.Error()
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error does not contain %q (in order):\n%s", w, msg)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestInvalidErrorListsEveryProblem(t *testing.T) {
	_, err := task.Parse([]byte(withSpec("  cleanup: Sometimes\n  timeouts: {run: x, startup: -1s}\n  retries: {limit: -3}\n  template: {spec: {containers: [{name: base, image: a}]}}\n")))
	var inv *task.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("error %v is not an *InvalidError", err)
	}
	if len(inv.Errs) != 4 {
		t.Errorf("got %d errors, want 4:\n%v", len(inv.Errs), err)
	}
	if inv.Name != "t1" {
		t.Errorf("Name = %q, want t1", inv.Name)
	}
}
