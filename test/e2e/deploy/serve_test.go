package deploy

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
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
)

// selfSignedCert writes a certificate for 127.0.0.1 and its key into dir
// and returns their paths and the certificate's PEM.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string, certPEM []byte) {
	t.Helper()
	certPEM, keyPEM := selfSigned(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, certPEM
}

// selfSigned makes a serving certificate, its own CA, for names and ips,
// valid for an hour either side of now, and returns it and its key as PEM.
func selfSigned(t *testing.T, names []string, ips []net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cn := "kubetask"
	if len(names) > 0 {
		cn = names[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     names,
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// noWatchList turns client-go's streaming lists off (informers then LIST
// and WATCH, as against API servers before Kubernetes 1.34): both ways need
// to be granted.
const noWatchList = "KUBE_FEATURE_WatchListClient=false"

var addrLine = regexp.MustCompile(`kubetask serve: (https?://[^ ]+)/api/v1`)

// serve is a running `kubetask serve`.
type serve struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	url            string
	http           *http.Client // trusts the service's certificate
	stopping       atomic.Bool  // stop was called: an exit is expected
}

// startServe starts `kubetask serve` with args, in an environment without
// the admin kubeconfig (plus env), waits until /readyz answers 200 over
// HTTPS (trusting certPEM) and stops it when the test ends.
func startServe(t *testing.T, certPEM []byte, env []string, args ...string) *serve {
	t.Helper()
	s := startServeUnready(t, certPEM, env, args...)
	eventually(t, time.Minute, "kubetask serve to be ready", func() bool { return s.status(t, "/readyz") == http.StatusOK })
	return s
}

// startServeUnready is startServe without the wait for /readyz: it returns
// once the service prints its address.
func startServeUnready(t *testing.T, certPEM []byte, env []string, args ...string) *serve {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	s := &serve{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{}),
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}}
	s.cmd = exec.Command(kubetaskBin(t), args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") && !strings.HasPrefix(e, "POD_NAMESPACE=") && !strings.HasPrefix(e, "KUBETASK_") {
			s.cmd.Env = append(s.cmd.Env, e)
		}
	}
	s.cmd.Env = append(s.cmd.Env, env...)
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { s.stop(t) })
	eventually(t, time.Minute, "kubetask serve to print its address", func() bool {
		select {
		case <-s.done:
			t.Fatalf("kubetask serve exited: %v\nstdout:\n%s\nstderr:\n%s", s.cmd.ProcessState, s.stdout, s.stderr)
		default:
		}
		m := addrLine.FindStringSubmatch(s.stdout.String())
		if m != nil {
			s.url = m[1]
		}
		return m != nil
	})
	return s
}

// status GETs path without credentials and returns the status (0 when the
// request failed).
func (s *serve) status(t *testing.T, path string) int {
	t.Helper()
	resp, err := s.http.Get(s.url + path)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// forbidden returns the lines of the service's log that report a Forbidden
// answer of the API server: a permission the deployed roles lack.
func (s *serve) forbidden() []string {
	var out []string
	for _, line := range strings.Split(s.stderr.String(), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			out = append(out, line)
		}
	}
	return out
}

// failFast returns a context that ends with parent or as soon as the
// service logs a Forbidden (reported as an error of t), so that a missing
// permission fails the test at once instead of at a deadline.
func (s *serve) failFast(parent context.Context, t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(parent)
	exited := make(chan struct{})
	t.Cleanup(func() { cancel(); <-exited })
	go func() {
		defer close(exited)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.done:
				if !s.stopping.Load() {
					t.Errorf("kubetask serve exited: %v", s.cmd.ProcessState)
					cancel()
				}
				return
			case <-tick.C:
				if f := s.forbidden(); len(f) > 0 {
					t.Errorf("kubetask serve met a Forbidden: %s", f[0])
					cancel()
					return
				}
			}
		}
	}()
	return ctx
}

// stop sends SIGTERM (SIGKILL after 30 s) and waits for the process; it
// reports the service's stderr when t failed.
func (s *serve) stop(t *testing.T) {
	s.stopping.Store(true)
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("kubetask serve did not stop on SIGTERM within 30 s; killing it")
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	if t.Failed() {
		t.Logf("kubetask serve stderr:\n%s", s.stderr)
	}
}

// sidecarTask is a task whose main container writes three log lines and a
// file result (read through exec from the result holder) beside a sidecar
// that never exits by itself (stopped by kubetask once main ended).
const sidecarTask = `apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata: {name: deployed-roles}
spec:
  mainContainer: main
  result: {from: File, path: /kubetask/result.txt}
  timeouts: {schedule: 1m, startup: 1m, run: 2m}
  template:
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: main
          image: busybox:1.37
          command: [sh, -c, 'for i in 1 2 3; do echo "line $i"; done; echo done > /kubetask/result.txt']
        - name: proxy
          image: envoyproxy/envoy:v1.31.0
          command: [sh, -c, 'trap "exit 0" TERM; echo proxy up; while :; do sleep 1; done']
`

// deletedTask runs until its pod is deleted, without retries.
const deletedTask = `apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata: {name: deleted}
spec:
  retries: {limit: 0}
  template:
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - {name: main, image: busybox:1.37, command: [sh, -c, "echo started; sleep 300"]}
`

// unschedulableTask never gets a node: its Pending state shows the
// scheduler's events.
const unschedulableTask = `apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata: {name: never-scheduled}
spec:
  timeouts: {schedule: 5m}
  template:
    spec:
      terminationGracePeriodSeconds: 5
      nodeSelector: {kubetask.test/no-such-node: "true"}
      containers:
        - {name: main, image: busybox:1.37, command: [sh, -c, "echo never"]}
`

// runSidecarTask submits sidecarTask to ns through c and checks that it
// ends Succeeded with its result and its whole log archived.
func runSidecarTask(ctx context.Context, t *testing.T, c *client.Client, ns string) {
	t.Helper()
	tk, _, err := c.Submit(ctx, ns, []byte(sidecarTask), client.SubmitOptions{})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	tk, err = c.Wait(ctx, tk.ID)
	if err != nil {
		t.Fatalf("waiting for the task: %v", err)
	}
	if tk.Phase != "Succeeded" || tk.Reason != "Completed" || string(tk.ResultBytes()) != "done\n" {
		t.Errorf("task ended %s/%s (%s), result %q; want Succeeded/Completed with result %q", tk.Phase, tk.Reason, tk.Message, tk.ResultBytes(), "done\n")
	}
	var log []byte
	eventually(t, 30*time.Second, "the archived log to be complete", func() bool {
		r, err := c.Logs(ctx, tk.ID, client.LogOptions{})
		if err != nil {
			t.Fatalf("logs: %v", err)
		}
		defer r.Close()
		if log, err = io.ReadAll(r); err != nil {
			t.Fatalf("reading the log: %v", err)
		}
		return r.Info().Complete
	})
	if want := "line 1\nline 2\nline 3\n"; string(log) != want {
		t.Errorf("archived log %q, want %q", log, want)
	}
}

// A `kubetask serve` whose only Kubernetes credentials are the deployed
// ServiceAccount's (the cluster-wide overlay, --auth kubernetes, HTTPS, as
// the Deployment runs it) runs a task with a sidecar, a file result and a
// captured log to Succeeded and leaves no pod; shows a Pending task's
// events; cancels; records a pod deleted behind its back; refuses a
// submission to a missing namespace; and never meets a Forbidden on the way.
func TestServeWithDeployedRoles(t *testing.T) {
	env := clustertest.New(t)
	d := deployOverlay(t, env, overlay{})
	callerToken := caller(t, env, d.suffix)
	dir := t.TempDir()
	certFile, keyFile, certPEM := selfSignedCert(t, dir)
	// Its informers LIST then WATCH, as against an API server without
	// streaming lists (TestDeploymentFromImage covers streaming lists).
	s := startServe(t, certPEM, []string{noWatchList}, "serve", "--kubeconfig", d.kubeconfig,
		"--listen", "127.0.0.1:0", "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--auth", "kubernetes", "--store", "sqlite", "--state-dir", filepath.Join(dir, "state"),
		"--instance-id", "deploy-"+d.suffix)

	// The Deployment's probes answer on the paths it names, without credentials.
	dep := into[appsv1.Deployment](t, find(t, d.objs, "Deployment", "kubetask"))
	for _, p := range []string{dep.Spec.Template.Spec.Containers[0].LivenessProbe.HTTPGet.Path, dep.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Path} {
		if got := s.status(t, p); got != http.StatusOK {
			t.Errorf("GET %s (a probe of the Deployment): %d, want 200", p, got)
		}
	}

	tctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ctx := s.failFast(tctx, t)
	c, err := client.New(s.url, client.WithToken(callerToken), client.WithCA(certPEM))
	if err != nil {
		t.Fatal(err)
	}

	runSidecarTask(ctx, t, c, env.Namespace)

	// A task that cannot be scheduled shows why, then is cancelled.
	pending, _, err := c.Submit(ctx, env.Namespace, []byte(unschedulableTask), client.SubmitOptions{})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	eventually(t, 30*time.Second, "the Pending task to show the scheduler's events", func() bool {
		got, err := c.Get(ctx, pending.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		for _, e := range got.Events {
			if e.Reason == "FailedScheduling" {
				return true
			}
		}
		return false
	})
	if _, err := c.Cancel(ctx, pending.ID); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if pending, err = c.Wait(ctx, pending.ID); err != nil {
		t.Fatalf("waiting for the cancelled task: %v", err)
	}
	if pending.Phase != "Failed" || pending.CancelledAt == nil {
		t.Errorf("cancelled task ended %s/%s (cancelled at %v)", pending.Phase, pending.Reason, pending.CancelledAt)
	}

	// A pod force-deleted behind kubetask's back, its finalizer removed: the
	// executor and the log capture read it fresh from the API server (get),
	// record the deletion and complete the log with a marker.
	gone, _, err := c.Submit(ctx, env.Namespace, []byte(deletedTask), client.SubmitOptions{})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	running, err := c.WaitUntil(ctx, gone.ID, func(tk *api.Task) bool { return tk.Phase == "Running" || tk.Terminal })
	if err != nil {
		t.Fatalf("waiting for the task to run: %v", err)
	}
	if running.Terminal || len(running.Attempts) == 0 || running.Attempts[0].Pod == "" {
		t.Fatalf("task ended %s/%s before its pod could be deleted (attempts %+v)", running.Phase, running.Reason, running.Attempts)
	}
	podName := running.Attempts[0].Pod
	if _, err := env.Client.CoreV1().Pods(env.Namespace).Patch(ctx, podName, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("removing the finalizer of %s: %v", podName, err)
	}
	if err := env.Client.CoreV1().Pods(env.Namespace).Delete(ctx, podName, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatalf("deleting %s: %v", podName, err)
	}
	if gone, err = c.Wait(ctx, gone.ID); err != nil {
		t.Fatalf("waiting for the task whose pod was deleted: %v", err)
	}
	if gone.Phase != "Failed" || gone.Reason != "DeletedExternally" {
		t.Errorf("task whose pod was deleted ended %s/%s (%s), want Failed/DeletedExternally", gone.Phase, gone.Reason, gone.Message)
	}
	eventually(t, 30*time.Second, "the deleted pod's log to be complete", func() bool {
		r, err := c.Logs(ctx, gone.ID, client.LogOptions{})
		if err != nil {
			t.Fatalf("logs: %v", err)
		}
		defer r.Close()
		if _, err := io.ReadAll(r); err != nil {
			t.Fatalf("reading the log: %v", err)
		}
		return r.Info().Complete
	})

	// The server-side dry run of a submission sees a missing namespace.
	if _, _, err := c.Submit(ctx, "no-such-namespace-"+d.suffix, []byte(sidecarTask), client.SubmitOptions{}); !client.IsInvalid(err) {
		t.Errorf("submit to a missing namespace: %v, want 422", err)
	}

	eventually(t, 30*time.Second, "no pod left in the namespace", func() bool {
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
	s.stop(t)
	if s.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("kubetask serve exited with %v on SIGTERM", s.cmd.ProcessState)
	}
	for _, line := range s.forbidden() {
		t.Errorf("the service met a permission it does not have: %s", line)
	}
}

// Every flag the Deployment of each layout gives `kubetask serve` is one it
// knows.
func TestDeploymentArgsAreServeFlags(t *testing.T) {
	help, err := exec.Command(kubetaskBin(t), "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kubetask serve --help: %v\n%s", err, help)
	}
	for _, root := range []string{"/deploy", "/deploy/cluster-wide"} {
		dep := into[appsv1.Deployment](t, find(t, build(t, root, nil), "Deployment", "kubetask"))
		for name := range flagValues(dep.Spec.Template.Spec.Containers[0].Args) {
			if !regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(name) + `\b`).Match(help) {
				t.Errorf("%s: the Deployment passes --%s, which kubetask serve does not know", root, name)
			}
		}
	}
}
