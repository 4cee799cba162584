package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// TestLocalNodePodNetwork runs two pods of a loaded image (the network probe, an
// HTTP server on :8080) on the shared cluster's local node: each gets a network
// namespace of its own with an address from the node's pod subnet (status.podIP,
// the POD_IP fieldRef and its own interface agree), both listen on port 8080
// and the test reaches each at its pod IP, one pod reaches the other, and each
// asks the apiserver who it is with client-go's in-cluster config (its
// service-account token, over TLS verified with the pod's ca.crt). A pod of a
// host process keeps the node's network (pod IP 127.0.0.1).
func TestLocalNodePodNetwork(t *testing.T) {
	e := sharedNodeEnv(t, "pod networks need root (network namespaces, veth pairs, a bridge)")
	loadNetProbeImage(t, "kubetask.test/netprobe:v1")
	ctx := context.Background()

	node, err := e.Client.CoreV1().Nodes().Get(ctx, e.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subnet, err := netip.ParsePrefix(node.Spec.PodCIDR)
	if err != nil {
		t.Fatalf("node %s has no pod subnet: spec.podCIDR %q", e.Node, node.Spec.PodCIDR)
	}

	names := []string{"net-a", "net-b"}
	for _, name := range names {
		p := e.pod(name, corev1.Container{
			Name:  "main",
			Image: "kubetask.test/netprobe:v1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env:   []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
		})
		e.create(p)
	}
	e.create(e.pod("net-host", ctr("main", "sh", "-c", `trap 'exit 0' TERM; while :; do sleep 0.1; done`)))
	ips := map[string]string{}
	for _, name := range append(slices.Clone(names), "net-host") {
		p := e.waitPod(name, "running", time.Minute, func(p *corev1.Pod) bool { return running(p, "main") && p.Status.PodIP != "" })
		ips[name] = p.Status.PodIP
		if len(p.Status.PodIPs) != 1 || p.Status.PodIPs[0].IP != p.Status.PodIP {
			t.Errorf("%s: podIPs %v, want [%s]", name, p.Status.PodIPs, p.Status.PodIP)
		}
	}
	if ips["net-host"] != "127.0.0.1" {
		t.Errorf("a host-process pod got %s, want the node's 127.0.0.1", ips["net-host"])
	}
	if ips["net-a"] == ips["net-b"] {
		t.Fatalf("both pods got %s", ips["net-a"])
	}
	for _, name := range names {
		ip, err := netip.ParseAddr(ips[name])
		if err != nil || !subnet.Contains(ip) {
			t.Fatalf("%s: pod IP %q is not in the node's pod subnet %s", name, ips[name], subnet)
		}
	}

	wantUser := "system:serviceaccount:" + e.Namespace + ":default"
	for _, name := range names {
		var rep imagetest.NetReport
		getJSON(t, "http://"+net.JoinHostPort(ips[name], "8080")+"/", &rep)
		if rep.Pod != name || rep.PodIP != ips[name] {
			t.Errorf("%s at %s answered as pod %q with POD_IP %q", name, ips[name], rep.Pod, rep.PodIP)
		}
		if want := ips[name] + "/" + fmt.Sprint(subnet.Bits()); !slices.Contains(rep.Addrs, want) {
			t.Errorf("%s: interface addresses %v, want %s among them", name, rep.Addrs, want)
		}
		for _, a := range rep.Addrs {
			if a != "127.0.0.1/8" && a != "::1/128" && !strings.HasPrefix(a, "fe80:") && !strings.HasPrefix(a, ips[name]+"/") {
				t.Errorf("%s sees address %s: not its own network", name, a)
			}
		}
		if rep.APIUser != wantUser {
			t.Errorf("%s: the apiserver says the pod is %q, want %q", name, rep.APIUser, wantUser)
		}
	}

	// Pod to pod: net-a fetches net-b's report.
	var viaA imagetest.NetReport
	getJSON(t, "http://"+net.JoinHostPort(ips["net-a"], "8080")+"/fetch?url="+url.QueryEscape("http://"+net.JoinHostPort(ips["net-b"], "8080")+"/"), &viaA)
	if viaA.Pod != "net-b" {
		t.Errorf("net-a fetching net-b got pod %q", viaA.Pod)
	}

	// Deleting the pods releases their networks (the probe exits on SIGTERM).
	for _, name := range names {
		if err := e.Client.CoreV1().Pods(e.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "pods deleted and unreachable", func() (bool, error) {
		for _, name := range names {
			if _, err := e.get(name); err == nil {
				return false, nil
			}
		}
		return true, nil
	})
	for _, name := range names {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ips[name], "8080"), time.Second)
		if err == nil {
			conn.Close()
			t.Errorf("%s's address %s still answers after the pod was deleted", name, ips[name])
		}
	}
}

// getJSON GETs u into v, trying again while the server is not up yet.
func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	client := &http.Client{Timeout: 15 * time.Second}
	var body []byte
	waitFor(t, 30*time.Second, "GET "+u, func() (bool, error) {
		resp, err := client.Get(u) //nolint:noctx // bounded by the client's timeout
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return false, nil
		}
		return true, nil
	})
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %q: %v", u, body, err)
	}
}

// loadNetProbeImage builds an image holding the network probe as its
// entrypoint (user 1000), and loads it into the shared cluster with the built
// `kubetask cluster load-image`.
func loadNetProbeImage(tb testing.TB, ref string) {
	tb.Helper()
	c := clustertest.Cluster()
	tmp := tb.TempDir()
	img := imagetest.Image(tb, v1.Config{Entrypoint: []string{"/bin/netprobe"}, User: "1000:1000"},
		imagetest.Layer(tb, map[string]imagetest.Entry{"bin/netprobe": imagetest.Binary(tb, imagetest.NetProbe(tb, tmp))}))
	archive := filepath.Join(tmp, "netprobe.tar")
	imagetest.WriteTar(tb, archive, ref, img)
	if out, err := exec.Command(c.KubetaskBinary(), "cluster", "load-image", "--state-dir", c.Dir(), archive).CombinedOutput(); err != nil {
		tb.Fatalf("kubetask cluster load-image: %v: %s", err, out)
	}
}
