package cluster

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// TestLocalNodeRunsLoadedImage builds an image holding the probe (a static
// binary that reports what it sees) with go-containerregistry, loads it with the
// built `kubetask cluster load-image`, and runs pods from it on the shared
// cluster's local node (kubetask node run): the probe sees the image's root
// file system and not the host's, is PID 1, gets the image's env with the pod's
// overrides, its working directory and user, the pod's volumes, /etc/hostname;
// its exit code, log and image ID are reported; command replaces the entrypoint
// and runAsUser the image's user; exec enters the container as its user.
func TestLocalNodeRunsLoadedImage(t *testing.T) {
	e := sharedNodeEnv(t, "running images needs root (namespaces, overlay)")
	_, id := loadProbeImage(t, "kubetask.test/probe:v1")

	ctx := context.Background()
	if _, err := e.Client.CoreV1().ConfigMaps(e.Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"key": "from-configmap"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hostFile := clustertest.Cluster().KubetaskBinary() // on the host, not in the image
	p := e.pod("from-image", corev1.Container{
		Name:  "main",
		Image: "kubetask.test/probe:v1",
		Args:  []string{"/etc/only-in-image", "/config/key", "/etc/hostname", "readme.txt", hostFile, "/proc/sys/kernel/hostname"},
		Env:   []corev1.EnvVar{{Name: "OVERRIDDEN", Value: "from-pod"}, {Name: "PROBE_EXIT", Value: "7"}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "cfg", MountPath: "/config"},
			{Name: "scratch", MountPath: "/scratch"},
		},
	})
	p.Spec.Volumes = []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	created := time.Now()
	e.create(p)
	done := e.waitPod("from-image", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	t.Logf("pod from the loaded image: created to Failed (exit 7) in %s", time.Since(created).Round(time.Millisecond))
	term := terminated(done, "main")
	if term == nil || term.ExitCode != 7 || term.Reason != "Error" {
		t.Fatalf("main terminated %+v, want exit code 7, reason Error", term)
	}
	if st := status(done, "main"); st.ImageID != id {
		t.Errorf("imageID %q, want %q", st.ImageID, id)
	}
	r := imagetest.ParseReport(t, e.logs("from-image", &corev1.PodLogOptions{Container: "main"}))
	if r.PID != 1 || r.UID != 1000 || r.GID != 1001 || r.Cwd != "/srv/app" {
		t.Errorf("pid %d uid %d gid %d cwd %q; want 1, 1000 and 1001 (the image's user app), /srv/app", r.PID, r.UID, r.GID, r.Cwd)
	}
	wantArgs := []string{"/bin/probe", "/etc/only-in-image", "/config/key", "/etc/hostname", "readme.txt", hostFile, "/proc/sys/kernel/hostname"}
	if strings.Join(r.Args, " ") != strings.Join(wantArgs, " ") {
		t.Errorf("argv %q, want the image's entrypoint with the pod's args %q", r.Args, wantArgs)
	}
	for k, want := range map[string]string{"IMAGE_VAR": "from-image", "OVERRIDDEN": "from-pod", "HOME": "/home/app", "HOSTNAME": "from-image", "PATH": "/bin"} {
		if got, _ := r.Getenv(k); got != want {
			t.Errorf("$%s = %q, want %q", k, got, want)
		}
	}
	for f, want := range map[string]string{"/etc/only-in-image": "image file", "/config/key": "from-configmap", "/etc/hostname": "from-image\n", "/proc/sys/kernel/hostname": "from-image\n", "readme.txt": "in the working directory"} {
		if got := r.Files[f]; got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	if got := r.Files[hostFile]; !strings.HasPrefix(got, "error:") {
		t.Errorf("the host's %s is visible in the container", hostFile)
	}

	// Without command and args: the image's entrypoint and cmd. The image's user
	// (not root) writes the termination message and into an emptyDir.
	e.create(e.pod("defaults", corev1.Container{Name: "main", Image: "kubetask.test/probe:v1"}))
	e.waitPod("defaults", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	r = imagetest.ParseReport(t, e.logs("defaults", &corev1.PodLogOptions{Container: "main"}))
	if strings.Join(r.Args, " ") != "/bin/probe /etc/only-in-image" || r.Files["/etc/only-in-image"] != "image file" {
		t.Errorf("argv %q files %v; want the image's entrypoint and cmd", r.Args, r.Files)
	}
	p = e.pod("writes", corev1.Container{
		Name: "main", Image: "kubetask.test/probe:v1",
		Args:         []string{"/dev/termination-log=bye from app", "/scratch/out=written"},
		VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
	})
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	e.create(p)
	done = e.waitPod("writes", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	r = imagetest.ParseReport(t, e.logs("writes", &corev1.PodLogOptions{Container: "main"}))
	for f, want := range map[string]string{"/dev/termination-log": "ok", "/scratch/out": "ok"} {
		if r.Files[f] != want {
			t.Errorf("writing %s as the image's user app: %q", f, r.Files[f])
		}
	}
	if term := terminated(done, "main"); term == nil || term.Message != "bye from app" {
		t.Errorf("termination message of a non-root container: %+v", term)
	}

	// command replaces the entrypoint and drops cmd; runAsUser replaces the image's user.
	p = e.pod("run-as", corev1.Container{
		Name: "main", Image: "kubetask.test/probe@" + id, Command: []string{"/bin/probe"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr(int64(2000)), RunAsGroup: ptr(int64(3000))},
	})
	e.create(p)
	done = e.waitPod("run-as", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	r = imagetest.ParseReport(t, e.logs("run-as", &corev1.PodLogOptions{Container: "main"}))
	if r.UID != 2000 || r.GID != 3000 || len(r.Args) != 1 || len(r.Files) != 0 {
		t.Errorf("uid %d gid %d argv %q files %v; want 2000, 3000, the command alone", r.UID, r.GID, r.Args, r.Files)
	}
	if term := terminated(done, "main"); term == nil || term.ExitCode != 0 {
		t.Errorf("run-as terminated %+v, want exit code 0", term)
	}

	// exec enters the running container, as its user, in its working directory.
	p = e.pod("exec-image", corev1.Container{Name: "main", Image: "kubetask.test/probe:v1", Args: []string{"-wait"}})
	e.create(p)
	e.waitPod("exec-image", "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	req := e.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(e.Namespace).Name("exec-image").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"probe", "readme.txt"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(e.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	execCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = ex.StreamWithContext(execCtx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var ce utilexec.CodeExitError
	if err != nil && !errors.As(err, &ce) {
		t.Fatalf("exec: %v; stderr %q", err, stderr.String())
	}
	x := imagetest.ParseReport(t, stdout.String())
	if x.UID != 1000 || x.Cwd != "/srv/app" || x.Files["readme.txt"] != "in the working directory" || x.PID == 1 {
		t.Errorf("exec saw pid %d uid %d cwd %q files %v", x.PID, x.UID, x.Cwd, x.Files)
	}
	// Deletion sends SIGTERM to PID 1, on which the probe exits.
	if err := e.Client.CoreV1().Pods(e.Namespace).Delete(ctx, "exec-image", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(30))}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "exec-image deleted on SIGTERM", func() (bool, error) {
		_, err := e.get("exec-image")
		return err != nil, nil
	})
}

// loadProbeImage builds an image holding the probe (entrypoint /bin/probe, cmd
// /etc/only-in-image, user app = 1000:1001, working directory /srv/app, a few
// files), writes it as a docker-compatible tar named ref and loads it into the
// shared cluster with the built `kubetask cluster load-image`, as a user would.
// It returns the probe's path on the host and the image ID.
func loadProbeImage(tb testing.TB, ref string) (probe, id string) {
	tb.Helper()
	c := clustertest.Cluster()
	tmp := tb.TempDir()
	probe = imagetest.Probe(tb, tmp)
	img := imagetest.Image(tb, v1.Config{
		Entrypoint: []string{"/bin/probe"},
		Cmd:        []string{"/etc/only-in-image"},
		Env:        []string{"PATH=/bin", "IMAGE_VAR=from-image", "OVERRIDDEN=from-image"},
		WorkingDir: "/srv/app",
		User:       "app",
	}, imagetest.Layer(tb, map[string]imagetest.Entry{
		"bin/probe":          imagetest.Binary(tb, probe),
		"etc/only-in-image":  {Body: []byte("image file")},
		"etc/passwd":         {Body: []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")},
		"etc/group":          {Body: []byte("root:x:0:\napp:x:1001:\n")},
		"srv/app/readme.txt": {Body: []byte("in the working directory")},
	}))
	cfgName, err := img.ConfigName()
	if err != nil {
		tb.Fatal(err)
	}
	archive := filepath.Join(tmp, "probe.tar")
	imagetest.WriteTar(tb, archive, ref, img)
	out, err := exec.Command(c.KubetaskBinary(), "cluster", "load-image", "--state-dir", c.Dir(), archive).CombinedOutput()
	if err != nil || !strings.Contains(string(out), cfgName.String()) || !strings.Contains(string(out), ref) {
		tb.Fatalf("kubetask cluster load-image: %v: %s", err, out)
	}
	tb.Logf("load-image: %s", out)
	return probe, cfgName.String()
}
