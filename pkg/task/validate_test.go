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
		// The pod template, checked with the API server's rules (ValidateOnServer and
		// test/integration/cluster check the rest on a real API server).
		"missing image": {
			doc:  withSpec("  template: {spec: {containers: [{name: base}]}}\n"),
			want: []string{"spec.template.spec.containers[0].image: Required value"},
		},
		"bad container name": {
			doc:  withSpec("  template: {spec: {containers: [{name: Base_1, image: a}]}}\n"),
			want: []string{`spec.template.spec.containers[0].name: Invalid value: "Base_1"`},
		},
		"mount of an undefined volume": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, volumeMounts: [{name: nope, mountPath: /x}]}]}}\n"),
			want: []string{`spec.template.spec.containers[0].volumeMounts[0].name: Not found: "nope"`},
		},
		"requests above limits": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, resources: {requests: {cpu: 2}, limits: {cpu: 1}}}]}}\n"),
			want: []string{`spec.template.spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to cpu limit`},
		},
		"plain pod errors at the pod's paths": {
			doc:  "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: busybox, ports: [{containerPort: 70000}]}]\n",
			want: []string{`spec.containers[0].ports[0].containerPort: Invalid value: 70000`},
		},
		"invalid result holder image": {
			doc:  withSpec("  result: {from: File, path: /out/r.json, image: ' busybox'}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.result.image: Invalid value: " busybox": must not have leading or trailing whitespace`},
		},
		"container name used twice across init and regular containers": {
			doc:  withSpec("  template: {spec: {initContainers: [{name: base, image: a}], containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.template.spec.initContainers[0].name: Duplicate value: "base"`},
		},
		"missing container name": {
			doc:  withSpec("  template: {spec: {containers: [{image: a}]}}\n"),
			want: []string{`spec.template.spec.containers[0].name: Required value`},
		},
		"image with whitespace": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: 'busybox '}]}}\n"),
			want: []string{`spec.template.spec.containers[0].image: Invalid value: "busybox ": must not have leading or trailing whitespace`},
		},
		"unknown imagePullPolicy": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, imagePullPolicy: Sometimes}]}}\n"),
			want: []string{`spec.template.spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes"`},
		},
		"unknown terminationMessagePolicy": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, terminationMessagePolicy: Logs}]}}\n"),
			want: []string{`spec.template.spec.containers[0].terminationMessagePolicy: Unsupported value: "Logs"`},
		},
		"bad port name, protocol and host port": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, ports: [{name: Web_Port, containerPort: 80, hostPort: -1, protocol: HTTP}]}]}}\n"),
			want: []string{`ports[0].name: Invalid value: "Web_Port"`, `ports[0].hostPort: Invalid value: -1`, `ports[0].protocol: Unsupported value: "HTTP"`},
		},
		"env var with an = in its name": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, env: [{name: 'A=B', value: x}]}]}}\n"),
			want: []string{`spec.template.spec.containers[0].env[0].name: Invalid value: "A=B"`, "other than '='"},
		},
		"env var with value and valueFrom": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, env: [{name: A, value: x, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]}]}}\n"),
			want: []string{"spec.template.spec.containers[0].env[0].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"},
		},
		"env var from an unsupported pod field": {
			doc:  withSpec("  template: {spec: {initContainers: [{name: init, image: a, env: [{name: A, valueFrom: {fieldRef: {fieldPath: spec.hostname}}}]}], containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.template.spec.initContainers[0].env[0].valueFrom.fieldRef.fieldPath: Unsupported value: "spec.hostname"`},
		},
		"env var from a malformed label key": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, env: [{name: A, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['a b']\"}}}]}]}}\n"),
			want: []string{`spec.template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Invalid value: "metadata.labels['a b']"`},
		},
		"two mounts at one path": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, volumeMounts: [{name: d, mountPath: /d}, {name: d, mountPath: /d}]}], volumes: [{name: d, emptyDir: {}}]}}\n"),
			want: []string{`spec.template.spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/d": must be unique`},
		},
		"volume with two types": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a}], volumes: [{name: d, emptyDir: {}, configMap: {name: c}}]}}\n"),
			want: []string{`spec.template.spec.volumes[0]`, `Forbidden: may not specify more than 1 volume type`},
		},
		"duplicate volume and a bad volume name": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a}], volumes: [{name: d, emptyDir: {}}, {name: d, emptyDir: {}}, {name: D.1, emptyDir: {}}]}}\n"),
			want: []string{`spec.template.spec.volumes[1].name: Duplicate value: "d"`, `spec.template.spec.volumes[2].name: Invalid value: "D.1"`},
		},
		"negative quantity and a bad resource name": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, resources: {limits: {memory: -1Mi, 'a b': 1}}}]}}\n"),
			want: []string{`spec.template.spec.containers[0].resources.limits[a b]: Invalid value: "a b"`, `spec.template.spec.containers[0].resources.limits[memory]: Invalid value: "-1Mi": must be greater than or equal to 0`},
		},
		"malformed quantity": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a, resources: {limits: {cpu: lots}}}]}}\n"),
			want: []string{`spec.template.spec.containers[0].resources.limits[cpu]: Invalid value: "lots": quantities must match`},
		},
		"template label key and value, annotation key": {
			doc:  withSpec("  template: {metadata: {labels: {'a b': x, ok: 'not ok'}, annotations: {'-x': z}}, spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.template.metadata.labels[a b]: Invalid value: "a b"`, `spec.template.metadata.labels[ok]: Invalid value: "not ok"`, `spec.template.metadata.annotations[-x]: Invalid value: "-x"`},
		},
		"task label": {
			doc:  strings.Replace(base, "metadata: {name: t1}", "metadata: {name: t1, labels: {team: 'data team'}}", 1),
			want: []string{`metadata.labels[team]: Invalid value: "data team"`},
		},
		"placement names a cluster and selects clusters": {
			doc:  withSpec("  placement: {cluster: east, clusterSelector: {matchLabels: {region: eu}}}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.placement.clusterSelector: Invalid value`, "exclusive"},
		},
		"placement's cluster name": {
			doc:  withSpec("  placement: {cluster: East_1}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.placement.cluster: Invalid value: "East_1"`, "lowercase"},
		},
		"placement's cluster name too long": {
			doc:  withSpec("  placement: {cluster: " + strings.Repeat("e", 41) + "}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.placement.cluster: Invalid value`, "no more than 40 characters"},
		},
		"placement's lostAfter too short": {
			doc:  withSpec("  placement: {cluster: east, lostAfter: 30s}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.placement.lostAfter: Invalid value: "30s"`, "must be at least 1m0s"},
		},
		"placement's lostAfter not a duration": {
			doc:  withSpec("  placement: {lostAfter: soon}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.placement.lostAfter: Invalid value: "soon"`, "must be a duration"},
		},
		"placement's selector": {
			doc:  withSpec("  placement: {clusterSelector: {matchExpressions: [{key: region, operator: Near}]}}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{`spec.placement.clusterSelector: Invalid value`, `"Near" is not a valid label selector operator`},
		},
		"ephemeral containers": {
			doc:  withSpec("  template: {spec: {containers: [{name: base, image: a}], ephemeralContainers: [{name: dbg, image: a}]}}\n"),
			want: []string{`spec.template.spec.ephemeralContainers: Forbidden: cannot be set on create`},
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

// TestDecodingAndValidationProblemsTogether: strict decoding (unknown fields, values of
// the wrong type) does not hide validation problems, nor one wrong type another;
// docs/task-format.md promises every problem at once.
func TestDecodingAndValidationProblemsTogether(t *testing.T) {
	cases := map[string]struct {
		doc  string
		want []string // every error's field path and type, in this order
	}{
		"unknown field and a malformed duration": {
			doc: withSpec("  retrys: {limit: 1}\n  timeouts: {run: 5 minutes}\n  template: {spec: {containers: [{name: base, image: a}]}}\n"),
			want: []string{
				"spec.retrys: Forbidden",
				`spec.timeouts.run: Invalid value: "5 minutes"`,
			},
		},
		"wrong types, an unknown field and validation problems": {
			doc: withSpec("  retries: {limit: two}\n  cleanup: Never\n  template: {spec: {containers: [{name: base, image: a, comand: [ls], ports: [{containerPort: 80}, {containerPort: eighty}]}, {name: b, image: b, stdin: maybe}]}}\n  mainContainer: base\n"),
			want: []string{
				`spec.retries.limit: Invalid value: "string": must be a whole number`,
				`spec.template.spec.containers[0].ports[1].containerPort: Invalid value: "string": must be a whole number`,
				`spec.template.spec.containers[1].stdin: Invalid value: "string": must be true or false`,
				"spec.template.spec.containers[0].comand: Forbidden: unknown field",
				`spec.cleanup: Unsupported value: "Never"`,
			},
		},
		"a plain pod, at the pod's paths": {
			doc: "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {a: 1}}\nspec:\n  restartPolicy: Always\n  containers: [{name: a, image: busybox, imagee: x}]\n",
			want: []string{
				`metadata.labels[a]: Invalid value: "number": must be a string`,
				"spec.containers[0].imagee: Forbidden: unknown field",
				`spec.restartPolicy: Unsupported value: "Always"`,
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := task.Parse([]byte(tc.doc))
			var inv *task.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("Parse() = %v; want an *InvalidError", err)
			}
			if len(inv.Errs) != len(tc.want) {
				t.Errorf("got %d errors, want %d:\n%v", len(inv.Errs), len(tc.want), err)
			}
			for i, w := range tc.want {
				if i < len(inv.Errs) && !strings.HasPrefix(inv.Errs[i].Error(), w) {
					t.Errorf("error %d = %q; want it to start with %q", i, inv.Errs[i].Error(), w)
				}
			}
		})
	}
}

// TestPlacementIsKept: a valid placement, a cluster or a selector, parses
// and validates as written.
func TestPlacementIsKept(t *testing.T) {
	for _, p := range []string{"{cluster: eu-west-1}", "{clusterSelector: {matchLabels: {gpu: a100}}}", "{}", "{lostAfter: 10m}"} {
		tk, err := task.Parse([]byte(withSpec("  placement: " + p + "\n  template: {spec: {containers: [{name: base, image: a}]}}\n")))
		if err != nil {
			t.Fatalf("placement %s: %v", p, err)
		}
		got := tk.Spec.Placement
		switch {
		case got == nil:
			t.Errorf("placement %s: dropped", p)
		case strings.Contains(p, "eu-west-1") && got.Cluster != "eu-west-1":
			t.Errorf("placement %s: cluster %q", p, got.Cluster)
		case strings.Contains(p, "a100") && (got.ClusterSelector == nil || got.ClusterSelector.MatchLabels["gpu"] != "a100"):
			t.Errorf("placement %s: selector %v", p, got.ClusterSelector)
		case strings.Contains(p, "10m") && (got.LostAfter != "10m" || tk.DeepCopy().Spec.Placement.LostAfter != "10m"):
			t.Errorf("placement %s: lostAfter %q", p, got.LostAfter)
		}
	}
}
