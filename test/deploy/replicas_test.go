package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/client"
)

// podFiles lays out, under dir, the files the Deployment's pod would see:
// each Secret volume (plain or projected) becomes a directory holding the
// items it mounts, with the content secrets gives for "secret/key". It
// returns the local directory of each mount path, and the emptyDir mount
// paths (which each replica gets its own of).
func podFiles(t *testing.T, spec appsv1.DeploymentSpec, dir string, secrets map[string]string) (mounts map[string]string, emptyDirs []string) {
	t.Helper()
	files := map[string]map[string]string{} // volume -> path -> content
	for _, v := range spec.Template.Spec.Volumes {
		switch {
		case v.EmptyDir != nil:
			files[v.Name] = nil
		case v.Secret != nil:
			files[v.Name] = map[string]string{}
			for _, it := range v.Secret.Items {
				files[v.Name][it.Path] = secrets[v.Secret.SecretName+"/"+it.Key]
			}
		case v.Projected != nil:
			files[v.Name] = map[string]string{}
			for _, src := range v.Projected.Sources {
				if src.Secret == nil {
					continue
				}
				for _, it := range src.Secret.Items {
					files[v.Name][it.Path] = secrets[src.Secret.Name+"/"+it.Key]
				}
			}
		}
	}
	mounts = map[string]string{}
	for _, m := range spec.Template.Spec.Containers[0].VolumeMounts {
		fs, ok := files[m.Name]
		switch {
		case !ok:
			t.Fatalf("Deployment: mount %s of an unknown volume %s", m.MountPath, m.Name)
		case fs == nil:
			emptyDirs = append(emptyDirs, m.MountPath)
			continue
		}
		local := filepath.Join(dir, m.Name)
		for p, content := range fs {
			if content == "" {
				t.Fatalf("Deployment: volume %s mounts %s, for which the test has no content", m.Name, p)
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(local, p)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(local, p), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		mounts[m.MountPath] = local
	}
	return mounts, emptyDirs
}

// localArgs turns the Deployment's arguments into a local process's: the
// paths under mount paths into local ones, $(VAR) expanded with vars as the
// kubelet does (containerVars), a loopback port instead of the pod's.
func localArgs(args []string, mounts map[string]string, vars map[string]string) []string {
	var out []string
	for _, a := range args {
		a = expand(a, vars)
		name, value, ok := strings.Cut(a, "=")
		switch {
		case !ok:
		case name == "--listen":
			value = "127.0.0.1:0"
		default:
			for mp, local := range mounts {
				if rest, ok := strings.CutPrefix(value, strings.TrimSuffix(mp, "/")+"/"); ok {
					value = filepath.Join(local, rest)
				}
			}
		}
		if ok {
			a = name + "=" + value
		}
		out = append(out, a)
	}
	return out
}

// Two replicas of the default layout run with the Deployment's own
// arguments (--shards, --store postgres with the URL from the Secret's file,
// HTTPS, --auth kubernetes, the Leases in the pod's namespace, --namespaces
// of the task namespace) on one PostgreSQL database,
// with nothing but the deployed ServiceAccount's credentials: both join the
// group, a task runs to the end, and a replica stopped with SIGTERM hands its
// shards over (deleting its membership Lease) to the other, which runs the
// next task. Neither meets a Forbidden.
func TestDeployedReplicas(t *testing.T) {
	env := clustertest.New(t)
	tasks := clustertest.New(t)
	d := deployOverlay(t, env, overlay{TaskNamespaces: []string{tasks.Namespace}})
	callerToken := caller(t, env, d.suffix)
	dep := into[appsv1.Deployment](t, find(t, d.objs, "Deployment", "kubetask"))
	store := find(t, d.objs, "Secret", "kubetask-store")

	dir := t.TempDir()
	certFile, keyFile, certPEM := selfSignedCert(t, dir)
	cert, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	mounts, emptyDirs := podFiles(t, dep.Spec, filepath.Join(dir, "pod"), map[string]string{
		store.GetName() + "/url": pgtest.Database(t) + "\n",
		"kubetask-tls/tls.crt":   string(cert),
		"kubetask-tls/tls.key":   string(key),
	})
	group := "deploy-" + d.suffix
	start := func(name string, extraEnv ...string) *serve {
		m := map[string]string{}
		for k, v := range mounts {
			m[k] = v
		}
		for _, ed := range emptyDirs {
			m[ed] = filepath.Join(dir, name, filepath.Base(ed))
			if err := os.MkdirAll(m[ed], 0o700); err != nil {
				t.Fatal(err)
			}
		}
		args := localArgs(dep.Spec.Template.Spec.Containers[0].Args, m, containerVars(dep, env.Namespace))
		if got := flagValues(args)["namespaces"]; got != tasks.Namespace {
			t.Fatalf("the Deployment's --namespaces expands to %q, want the task namespace %s", got, tasks.Namespace)
		}
		return startServe(t, certPEM, extraEnv, append(args, "--kubeconfig", d.kubeconfig, "--instance-id", group, "--replica-id", name)...)
	}
	// replica-b's informers LIST and WATCH, replica-a's stream their lists.
	a, b := start("replica-a"), start("replica-b", noWatchList)
	members := func() int {
		l, err := env.Client.CoordinationV1().Leases(env.Namespace).List(context.Background(), metav1.ListOptions{
			LabelSelector: labels.Set{replica.LabelGroup: group}.String()})
		if err != nil {
			t.Fatalf("listing the membership Leases: %v", err)
		}
		return len(l.Items)
	}
	eventually(t, 30*time.Second, "both replicas' membership Leases", func() bool { return members() == 2 })

	tctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ctx := b.failFast(a.failFast(tctx, t), t)
	c, err := client.New(a.url, client.WithToken(callerToken), client.WithCA(certPEM))
	if err != nil {
		t.Fatal(err)
	}
	runSidecarTask(ctx, t, c, tasks.Namespace)

	b.stop(t)
	if code := b.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("replica-b exited with %v on SIGTERM", b.cmd.ProcessState)
	}
	if n := members(); n != 1 {
		t.Errorf("%d membership Leases after replica-b stopped, want 1 (it deletes its own)", n)
	}
	ctx = a.failFast(tctx, t)
	runSidecarTask(ctx, t, c, tasks.Namespace)
	eventually(t, 30*time.Second, "no pod left in the task namespace", func() bool {
		pods, err := env.Client.CoreV1().Pods(tasks.Namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
	for name, s := range map[string]*serve{"replica-a": a, "replica-b": b} {
		for _, line := range s.forbidden() {
			t.Errorf("%s met a permission it does not have: %s", name, line)
		}
	}
}
