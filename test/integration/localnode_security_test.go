package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
)

// Attack tests on the shared cluster's local node, through the API server as a
// user of the cluster would attack it (issue 32): each shows that what a pod
// tries is refused or contained.

// TestLocalNodeSubPathLinkStaysInTheVolume: an init container plants
// "esc -> /" in an emptyDir; the main container, from a loaded image, running
// as root, mounts the emptyDir with subPath "esc" and tries to read and write
// the host's files through it (the kubelet's CVE-2017-1002101). The link is
// resolved inside the volume: the container sees the volume's own root.
func TestLocalNodeSubPathLinkStaysInTheVolume(t *testing.T) {
	e := sharedNodeEnv(t, "running images needs root (namespaces, overlay)")
	loadProbeImage(t, "kubetask.test/probe:v1")
	tmp := t.TempDir()
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(tmp, "host-secret")
	if err := os.WriteFile(secret, []byte("host only"), 0o600); err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(tmp, "written-by-pod")

	plant := ctr("plant", sh("ln -s / /scratch/esc && echo in-volume > /scratch/marker")...)
	plant.VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	p := e.pod("subpath-escape", corev1.Container{
		Name: "main", Image: "kubetask.test/probe:v1",
		Args:            []string{"/host" + secret, "/host" + written + "=pwned", "/host/marker"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr(int64(0)), RunAsGroup: ptr(int64(0))},
		VolumeMounts:    []corev1.VolumeMount{{Name: "scratch", MountPath: "/host", SubPath: "esc"}},
	})
	p.Spec.InitContainers = []corev1.Container{plant}
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	e.create(p)
	e.waitPod("subpath-escape", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	r := imagetest.ParseReport(t, e.logs("subpath-escape", &corev1.PodLogOptions{Container: "main"}))
	if _, err := os.Stat(written); err == nil {
		t.Errorf("the pod wrote the host's %s through a subPath link", written)
	}
	if r.Files["/host"+secret] == "host only" {
		t.Errorf("the pod read the host's %s through a subPath link", secret)
	}
	if got := r.Files["/host/marker"]; got != "in-volume\n" {
		t.Errorf("/host/marker = %q, want the volume's own file", got)
	}
}
