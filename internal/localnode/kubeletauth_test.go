package localnode

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/remotecommand"
)

// TestKubeletAPIRequiresAnAuthorizedClientCertificate: the node's kubelet API,
// wired as Run wires it, answers logs and exec only to a client certificate of
// its client CA whose user the API server allows nodes/proxy on the node (a
// SubjectAccessReview). Without a certificate, with another CA's, or as a user
// the API server denies, a caller gets nothing: no log line, no command run.
func TestKubeletAPIRequiresAnAuthorizedClientCertificate(t *testing.T) {
	h := newHarness(t)
	h.create(testPod("victim", shCtr("main", "echo TOP-SECRET; sleep 30")))
	h.wait("victim", "running", func(p *corev1.Pod) bool { return ctrRunning(p, "main") })

	ca, caKey := testCA(t, "cluster-ca")
	other, otherKey := testCA(t, "someone-else")
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	sar := fake.NewClientset()
	var reviews []authorizationv1.SubjectAccessReviewSpec
	sar.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		reviews = append(reviews, r.Spec)
		r.Status.Allowed = slices.Contains(r.Spec.Groups, "system:masters") &&
			r.Spec.ResourceAttributes.Resource == "nodes" && r.Spec.ResourceAttributes.Name == "unit"
		return true, r, nil
	})
	serving, err := selfSignedCert("unit")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	srv := kubeletServer(api.PodHandler(api.PodHandlerConfig{
		RunInContainer: h.p.RunInContainer, AttachToContainer: h.p.AttachToContainer,
		GetContainerLogs: h.p.GetContainerLogs, GetPods: h.p.GetPods,
	}, true), serving, pool, newKubeletAuth("unit", sar, log), log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	base := "https://" + ln.Addr().String()

	apiserver := testClientCert(t, ca, caKey, "kube-apiserver-kubelet-client", "system:masters")
	for name, c := range map[string]struct {
		cert    *tls.Certificate
		allowed bool
	}{
		"no certificate":              {},
		"another CA's certificate":    {cert: testClientCert(t, other, otherKey, "kube-apiserver-kubelet-client", "system:masters")},
		"a user the apiserver denies": {cert: testClientCert(t, ca, caKey, "mallory")},
		"the apiserver's certificate": {cert: apiserver, allowed: true},
	} {
		t.Run(name, func(t *testing.T) {
			tlsCfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the node's serving certificate is self-signed
			if c.cert != nil {
				tlsCfg.Certificates = []tls.Certificate{*c.cert}
			}
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 10 * time.Second}
			var logs string
			resp, err := client.Get(base + "/containerLogs/unit/victim/main")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				logs = resp.Status + " " + string(b)
			}
			var out bytes.Buffer
			u, _ := url.Parse(base + "/exec/unit/victim/main?command=echo&command=EXECUTED&output=1&error=1")
			rc := &rest.Config{Host: base, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
			if c.cert != nil {
				rc.CertData = pemBlockOf("CERTIFICATE", c.cert.Certificate[0])
				der, _ := x509.MarshalECPrivateKey(c.cert.PrivateKey.(*ecdsa.PrivateKey))
				rc.KeyData = pemBlockOf("EC PRIVATE KEY", der)
			}
			ex, err := remotecommand.NewSPDYExecutor(rc, http.MethodPost, u)
			if err != nil {
				t.Fatal(err)
			}
			execErr := ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &out, Stderr: io.Discard})
			gotLogs, gotExec := strings.Contains(logs, "TOP-SECRET"), strings.Contains(out.String(), "EXECUTED")
			if gotLogs != c.allowed || gotExec != c.allowed {
				t.Errorf("logs %q, exec %q (err %v); want served: %v", logs, out.String(), execErr, c.allowed)
			}
		})
	}
	for _, r := range reviews {
		if a := r.ResourceAttributes; r.User == "kube-apiserver-kubelet-client" && a.Subresource == "proxy" && !slices.Contains([]string{"get", "create"}, a.Verb) {
			t.Errorf("review %+v: want get (logs) or create (exec) on nodes/proxy", a)
		}
	}
}

func testCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func testClientCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, user string, groups ...string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: user, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func pemBlockOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
