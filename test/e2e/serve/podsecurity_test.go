package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// hostEscape is a pod that would be root on its node.
const hostEscape = `apiVersion: v1
kind: Pod
metadata: {name: escape}
spec:
  hostPID: true
  hostNetwork: true
  volumes: [{name: root, hostPath: {path: /}}]
  containers:
  - name: main
    image: busybox
    command: [chroot, /host, sh]
    securityContext: {privileged: true}
    volumeMounts: [{name: root, mountPath: /host}]
`

// TestServePodSecurity: the built service refuses a pod that escapes to its
// node (baseline, the default level) with a 422 naming each field and
// stores nothing; the namespace's stricter enforce label wins; a task it
// runs has its submitter on its pod; each submission writes an audit line.
func TestServePodSecurity(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	post := func(id, doc string) (int, api.Problem) {
		t.Helper()
		resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+env.Namespace+"/tasks?id="+id, "application/yaml", []byte(doc))
		var p api.Problem
		if resp.StatusCode >= 300 {
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatalf("submit %s: %s %s", id, resp.Status, b)
			}
		}
		return resp.StatusCode, p
	}

	code, p := post("escape", hostEscape)
	if code != http.StatusUnprocessableEntity {
		t.Fatalf("host escape pod: %d %+v, want 422", code, p)
	}
	for _, loc := range []string{"body.spec.template.spec.hostPID", "body.spec.template.spec.hostNetwork",
		"body.spec.template.spec.volumes[0].hostPath", "body.spec.template.spec.containers[0].securityContext.privileged"} {
		if !hasProblemAt(p, loc) {
			t.Errorf("no problem at %s: %+v", loc, p)
		}
	}
	if !strings.Contains(p.Detail, `level "baseline"`) || !strings.Contains(p.Detail, "--namespace-pod-security "+env.Namespace+"=") {
		t.Errorf("refusal does not name the level and how to change it: %s", p.Detail)
	}
	if resp, _ := s.do(http.MethodGet, api.Prefix+"/tasks/escape", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("refused task: %s, want 404 (nothing stored)", resp.Status)
	}
	eventually(t, 10*time.Second, "the refusal's audit line", func() bool {
		return strings.Contains(s.stderr.String(), "msg=audit verdict=invalid code=422 action=submit")
	})

	// A plain task runs, its pod stamped with its submitter.
	kept := strings.Replace(stepsTask("plain", "a", 0), "spec:\n  result:", "spec:\n  cleanup: Keep\n  result:", 1)
	if !strings.Contains(kept, "cleanup: Keep") {
		t.Fatalf("no cleanup: Keep in %s", kept)
	}
	tk := s.submit([]byte(kept))
	if tk.SubmittedBy == nil || tk.SubmittedBy.Auth != "token" || tk.SubmittedBy.User == "" {
		t.Fatalf("submitter %+v, want the token's subject", tk.SubmittedBy)
	}
	done := s.waitTask(tk.ID, 2*time.Minute, "the plain task to succeed", func(tk api.Task) bool { return tk.Terminal })
	if done.Phase != "Succeeded" || len(done.Attempts) == 0 || done.Attempts[0].Pod == "" {
		t.Fatalf("plain task: %s/%s %+v", done.Phase, done.Reason, done.Attempts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod, err := env.Client.CoreV1().Pods(env.Namespace).Get(ctx, done.Attempts[0].Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the kept pod: %v", err)
	}
	a, err := store.ParseActor(pod.Annotations[task.AnnotationSubmittedBy])
	if err != nil || a.User != tk.SubmittedBy.User || a.Auth != "token" {
		t.Errorf("pod's %s: %q (%v), want the submitter %+v", task.AnnotationSubmittedBy, pod.Annotations[task.AnnotationSubmittedBy], err, tk.SubmittedBy)
	}
	if err := env.Client.CoreV1().Pods(env.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting the kept pod: %v", err)
	}

	// The namespace's own enforce label, stricter than baseline, wins.
	patch := []byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"restricted"}}}`)
	if _, err := env.Client.CoreV1().Namespaces().Patch(ctx, env.Namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		unpatch := []byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":null}}}`)
		_, _ = env.Client.CoreV1().Namespaces().Patch(context.Background(), env.Namespace, types.MergePatchType, unpatch, metav1.PatchOptions{})
	}()
	var last api.Problem
	eventually(t, 30*time.Second, "a non-restricted task refused under the namespace's label", func() bool {
		code, p := post("plain-"+time.Now().Format("150405.000"), stepsTask("plain-again", "a", 0))
		last = p
		if code == http.StatusCreated {
			return false // the label's 10 s cache: try again
		}
		return code == http.StatusUnprocessableEntity
	})
	if !strings.Contains(last.Detail, `level "restricted"`) || !strings.Contains(last.Detail, "pod-security.kubernetes.io/enforce=restricted") {
		t.Errorf("refusal under the label: %s", last.Detail)
	}
}
