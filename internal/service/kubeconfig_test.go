package service

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// writeKubeconfig writes a kubeconfig for server with user's credentials
// (its lines under "user:"); client-go sends credentials to an https
// server only.
func writeKubeconfig(t *testing.T, path, server, user string) {
	t.Helper()
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: u
  user:
%s
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`, server, user)
	if err := os.WriteFile(path+".tmp", []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil { // as a Secret's volume swaps its files
		t.Fatal(err)
	}
}

// TestKubeconfigTokenFollowsItsFile: a token held in a cluster's
// kubeconfig is sent as read last: rewritten (rotated credentials), the
// next request carries the new one, without a new client; a kubeconfig
// that names another server keeps the credentials in use, and says a
// restart takes it.
func TestKubeconfigTokenFollowsItsFile(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}`)
	}))
	defer srv.Close()
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	writeKubeconfig(t, kc, srv.URL, "    token: old-token")
	rc, lc, err := liveRESTConfig(ClusterConfig{Name: "west", Kubeconfig: kc}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		t.Helper()
		if _, err := client.CoreV1().Namespaces().Get(context.Background(), "x", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return seen[len(seen)-1]
	}
	if got := get(); got != "Bearer old-token" {
		t.Fatalf("first request's Authorization %q", got)
	}
	writeKubeconfig(t, kc, srv.URL, "    token: new-token")
	if err := lc.reload(); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "Bearer new-token" {
		t.Errorf("after the kubeconfig's token changed: %q, want the new token", got)
	}
	writeKubeconfig(t, kc, "https://elsewhere.example:6443", "    token: third-token")
	if err := lc.reload(); err == nil || !strings.Contains(err.Error(), "restart the service") {
		t.Errorf("a kubeconfig naming another server: %v; want a refusal that says restart", err)
	}
	if got := get(); got != "Bearer new-token" {
		t.Errorf("after a refused reload: %q, want the token in use kept", got)
	}
}

// TestKubeconfigCertificateFollowsItsFile: a client certificate and key
// held in a cluster's kubeconfig are written to files of the state
// directory (mode 0600), which client-go reads again, and rewritten when
// the kubeconfig's change.
func TestKubeconfigCertificateFollowsItsFile(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	user := func(cert, key string) string {
		return fmt.Sprintf("    client-certificate-data: %s\n    client-key-data: %s", cert, key)
	}
	writeKubeconfig(t, kc, "https://127.0.0.1:6443", user("Y2VydC0x", "a2V5LTE=")) // cert-1, key-1
	state := filepath.Join(dir, "state")
	rc, lc, err := liveRESTConfig(ClusterConfig{Name: "west", Kubeconfig: kc}, state)
	if err != nil {
		t.Fatal(err)
	}
	if rc.CertFile != filepath.Join(state, "client.crt") || rc.KeyFile != filepath.Join(state, "client.key") || len(rc.CertData) > 0 || len(rc.KeyData) > 0 {
		t.Fatalf("the client configuration names %q and %q (data %d bytes): want the state directory's files", rc.CertFile, rc.KeyFile, len(rc.CertData))
	}
	read := func(p string) string {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", p, fi.Mode().Perm())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if read(rc.CertFile) != "cert-1" || read(rc.KeyFile) != "key-1" {
		t.Fatalf("files %q %q", read(rc.CertFile), read(rc.KeyFile))
	}
	writeKubeconfig(t, kc, "https://127.0.0.1:6443", user("Y2VydC0y", "a2V5LTI=")) // cert-2, key-2
	if err := lc.reload(); err != nil {
		t.Fatal(err)
	}
	if read(rc.CertFile) != "cert-2" || read(rc.KeyFile) != "key-2" {
		t.Errorf("after the kubeconfig changed: %q %q, want cert-2 and key-2", read(rc.CertFile), read(rc.KeyFile))
	}
}
