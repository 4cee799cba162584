package localnode

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
)

// TestSubPathSymlinkStaysInTheVolume is the kubelet's CVE-2017-1002101 on
// this node: an init container plants "esc -> /" in an emptyDir and the main
// container, from a loaded image, mounts the emptyDir with subPath "esc". The
// subPath is resolved inside the volume, so the link names the volume's own
// root: the container sees the volume, never the host's / (it cannot read a
// host file nor write one). A subPath that does not exist is created inside
// the volume, also behind a link: "deep/<host dir>/new" with deep -> / makes
// <volume>/<host dir>/new, not the host's <host dir>/new.
func TestSubPathSymlinkStaysInTheVolume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image mode needs root")
	}
	h := newHarness(t)
	tmp := t.TempDir()
	secret := filepath.Join(tmp, "host-secret")
	if err := os.WriteFile(secret, []byte("host only"), 0o600); err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(tmp, "written-by-pod")
	hostDir := filepath.Join(tmp, "host-dir") // where "deep" points on the host
	if err := os.Mkdir(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}

	img := imagetest.Image(t, v1.Config{}, imagetest.Layer(t, map[string]imagetest.Entry{
		"probe": imagetest.Binary(t, imagetest.Probe(t, tmp)),
	}))
	archive := filepath.Join(tmp, "img.tar")
	imagetest.WriteTar(t, archive, "example.com/probe:1", img)
	st := imagestore.New(filepath.Join(tmp, "images"))
	if _, err := st.Load(context.Background(), archive); err != nil {
		t.Fatal(err)
	}
	h.p.cfg.images = st

	plant := shCtr("plant", "ln -s / /scratch/esc && ln -s / /scratch/deep && echo in-volume > /scratch/marker")
	plant.VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	main := corev1.Container{
		Name: "main", Image: "example.com/probe:1",
		Command: []string{"/probe", "/host" + secret, "/host" + written + "=pwned", "/host/marker", "/made/x=ok"},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "scratch", MountPath: "/host", SubPath: "esc"},
			{Name: "scratch", MountPath: "/made", SubPath: "deep" + hostDir + "/new"},
		},
	}
	pod := testPod("escape", main)
	pod.Spec.InitContainers = []corev1.Container{plant}
	pod.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	h.create(pod)
	p := h.wait("escape", "terminal", terminal)
	if term := ctrTerminated(p, "main"); term == nil || term.ExitCode != 0 {
		t.Fatalf("main: %+v", ctrStatus(p, "main"))
	}
	if _, err := os.Stat(written); err == nil {
		t.Errorf("the container wrote the host's %s through the subPath link", written)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "new")); err == nil {
		t.Errorf("the subPath was created on the host, through the link deep")
	}
	out := h.logs("escape", "main")
	r := imagetest.ParseReport(t, out)
	if got := r.Files["/host"+secret]; got == "host only" {
		t.Errorf("the container read the host's %s through the subPath link", secret)
	}
	if got := r.Files["/host/marker"]; got != "in-volume\n" {
		t.Errorf("/host/marker = %q: the subPath link should name the volume's root", got)
	}
	if got := r.Files["/made/x"]; got != "ok" {
		t.Errorf("writing in the created subPath: %q", got)
	}
}

// logs reads a container's whole log through the kubelet API's handler.
func (h *harness) logs(pod, ctr string) string {
	h.t.Helper()
	rc, err := h.p.GetContainerLogs(context.Background(), "unit", pod, ctr, api.ContainerLogOpts{})
	if err != nil {
		h.t.Fatalf("logs of %s/%s: %v", pod, ctr, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		h.t.Fatalf("logs of %s/%s: %v", pod, ctr, err)
	}
	return string(b)
}
