package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
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

// TestLocalNodeKubeletAPIRefusesCallersWithoutCertificate: a local user who
// finds the node's kubelet port (it is on the Node object) and calls it
// directly, without the API server's client certificate, reads no log and
// runs no command; through the API server (which presents it) both work.
func TestLocalNodeKubeletAPIRefusesCallersWithoutCertificate(t *testing.T) {
	env := clustertest.New(t)
	e := &nodeEnv{Env: env, t: t, Node: clustertest.Cluster().LocalNodeNames()[0], stop: func() {}}
	e.create(e.pod("victim", ctr("main", sh("echo TOP-SECRET; exec sleep 60")...)))
	e.waitPod("victim", "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") })
	ctx := context.Background()
	n, err := e.Client.CoreV1().Nodes().Get(ctx, e.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("https://127.0.0.1:%d", n.Status.DaemonEndpoints.KubeletEndpoint.Port)

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // an attacker does not care who serves
	}}
	if resp, err := client.Get(base + "/containerLogs/" + e.Namespace + "/victim/main"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "TOP-SECRET") {
			t.Errorf("the kubelet API served a log without credentials: %s %q", resp.Status, b)
		}
	}
	u, _ := url.Parse(base + "/exec/" + e.Namespace + "/victim/main?command=echo&command=EXECUTED&output=1&error=1")
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{Host: base, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, http.MethodPost, u)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: io.Discard})
	if strings.Contains(out.String(), "EXECUTED") {
		t.Errorf("the kubelet API ran a command without credentials")
	}
	t.Logf("exec without credentials: %v", err)

	if got := e.logs("victim", &corev1.PodLogOptions{Container: "main"}); !strings.Contains(got, "TOP-SECRET") {
		t.Errorf("logs through the API server: %q", got)
	}
	req := e.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(e.Namespace).Name("victim").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"echo", "EXECUTED"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err = remotecommand.NewSPDYExecutor(e.Config, http.MethodPost, req.URL())
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: io.Discard}); err != nil || !strings.Contains(out.String(), "EXECUTED") {
		t.Errorf("exec through the API server: %v, %q", err, out.String())
	}
}

// TestLocalClusterEtcdRefusesClientsWithoutCertificate: a local user who
// finds etcd's port writes nothing into the cluster's data, neither over
// plain HTTP nor over TLS without a client certificate of the etcd CA.
func TestLocalClusterEtcdRefusesClientsWithoutCertificate(t *testing.T) {
	port := clustertest.Cluster().Ports()["etcd-client"]
	body := `{"key":"` + base64.StdEncoding.EncodeToString([]byte("/registry/attack")) + `","value":"` + base64.StdEncoding.EncodeToString([]byte("pwned")) + `"}`
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // an attacker does not care who serves
	}}
	for _, scheme := range []string{"http", "https"} {
		resp, err := client.Post(fmt.Sprintf("%s://127.0.0.1:%d/v3/kv/put", scheme, port), "application/json", strings.NewReader(body))
		if err != nil {
			t.Logf("%s without a client certificate: %v", scheme, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("%s without a client certificate: %s %q", scheme, resp.Status, b)
		if resp.StatusCode == http.StatusOK && strings.Contains(string(b), "revision") {
			t.Errorf("etcd accepted a write over %s without a client certificate", scheme)
		}
	}
}

// loadAttackImage loads an image with the probe at /bin/probe, a set-user-ID
// root copy at /bin/suprobe and a root-only directory /rootonly: what a
// malicious image brings.
func loadAttackImage(t *testing.T, ref string) {
	t.Helper()
	c := clustertest.Cluster()
	tmp := t.TempDir()
	probe := imagetest.Binary(t, imagetest.Probe(t, tmp))
	suid := probe
	suid.Mode = 0o4755
	img := imagetest.Image(t, v1.Config{Entrypoint: []string{"/bin/probe"}, Env: []string{"PATH=/bin"}},
		imagetest.Layer(t, map[string]imagetest.Entry{
			"bin/probe":   probe,
			"bin/suprobe": suid,
			"rootonly/":   {Mode: 0o700},
		}))
	archive := filepath.Join(tmp, "attack.tar")
	imagetest.WriteTar(t, archive, ref, img)
	if out, err := exec.Command(c.KubetaskBinary(), "cluster", "load-image", "--state-dir", c.Dir(), archive).CombinedOutput(); err != nil {
		t.Fatalf("kubetask cluster load-image: %v: %s", err, out)
	}
}

// corePattern is the host's kernel.core_pattern (not namespaced): what the
// attack tests try to write, so that a write that wrongly succeeds changes
// nothing on the host.
func corePattern(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

// procStatus returns a field (CapEff, Uid, ...) of a /proc/<pid>/status.
func procStatus(status, field string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestLocalNodeImageContainerIsConfined: pods of a malicious image, through
// the API server. As root: only containerd's default capabilities (CapEff
// 00000000a80425fb), no write to /proc/sys or /sys. As runAsUser 1234 with
// allowPrivilegeEscalation: false: the image's set-user-ID root file runs as
// 1234, with no capability. A memory hog over its limit ends OOMKilled.
func TestLocalNodeImageContainerIsConfined(t *testing.T) {
	e := sharedNodeEnv(t, "running images needs root (namespaces, overlay)")
	loadAttackImage(t, "kubetask.test/attack:v1")
	const defaultCaps = "00000000a80425fb"

	e.create(e.pod("as-root", corev1.Container{
		Name: "main", Image: "kubetask.test/attack:v1",
		Args: []string{"/proc/self/status", "/proc/sys/kernel/core_pattern=" + corePattern(t), "/sys/kernel/uevent_helper=",
			"/proc/sysrq-trigger="},
	}))
	e.waitPod("as-root", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	r := imagetest.ParseReport(t, e.logs("as-root", &corev1.PodLogOptions{Container: "main"}))
	if got := procStatus(r.Files["/proc/self/status"], "CapEff"); got != defaultCaps {
		t.Errorf("root container: CapEff %s, want containerd's default %s", got, defaultCaps)
	}
	for _, f := range []string{"/proc/sys/kernel/core_pattern", "/sys/kernel/uevent_helper", "/proc/sysrq-trigger"} {
		if r.Files[f] == "ok" {
			t.Errorf("root container wrote %s", f)
		}
	}

	p := e.pod("setuid", corev1.Container{
		Name: "main", Image: "kubetask.test/attack:v1", Command: []string{"/bin/suprobe"},
		Args: []string{"/rootonly/x=pwned", "/proc/self/status"},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser: ptr(int64(1234)), RunAsGroup: ptr(int64(1234)), AllowPrivilegeEscalation: ptr(false),
		},
	})
	e.create(p)
	e.waitPod("setuid", "Succeeded", time.Minute, phaseIs(corev1.PodSucceeded))
	r = imagetest.ParseReport(t, e.logs("setuid", &corev1.PodLogOptions{Container: "main"}))
	if r.Files["/rootonly/x"] == "ok" || procStatus(r.Files["/proc/self/status"], "CapEff") != "0000000000000000" {
		t.Errorf("runAsUser 1234 became root through a set-user-ID file: wrote %q, status Uid %s CapEff %s",
			r.Files["/rootonly/x"], procStatus(r.Files["/proc/self/status"], "Uid"), procStatus(r.Files["/proc/self/status"], "CapEff"))
	}

	hog := e.pod("hog", corev1.Container{
		Name: "main", Image: "kubetask.test/attack:v1",
		Env: []corev1.EnvVar{{Name: "PROBE_ALLOC_MIB", Value: "256"}},
		Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
		},
	})
	e.create(hog)
	done := e.waitPod("hog", "Failed", time.Minute, phaseIs(corev1.PodFailed))
	if term := terminated(done, "main"); term == nil || term.Reason != "OOMKilled" || term.ExitCode != 137 {
		t.Errorf("memory hog over its 32Mi limit: %+v, want OOMKilled, exit code 137", term)
	}
}
