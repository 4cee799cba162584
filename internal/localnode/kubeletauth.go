package localnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The kubelet API (logs, exec, attach, port-forward, pods, stats) is served as a
// kubelet serves it with --client-ca-file and --authorization-mode=Webhook:
//
//   - authentication: the TLS handshake requires a client certificate signed
//     by the client CA (the API server's --kubelet-client-certificate is);
//     a connection without one, or with another CA's, fails;
//   - authorisation: the certificate's user (CN) and groups (O) must be
//     allowed the request's verb on the node's subresource (nodes/proxy for
//     logs and exec, nodes/stats, nodes/metrics), which the node asks the
//     API server with a SubjectAccessReview, caching the answer (allowed 5
//     minutes, denied 30 seconds, as the kubelet's defaults).
//
// Exec, attach, run and port-forward need "create" whatever the HTTP method
// (a WebSocket upgrade is a GET), as recent kubelets require.

// kubeletAuth authorises requests to one node's kubelet API.
type kubeletAuth struct {
	node string
	sar  kubernetes.Interface
	log  *slog.Logger
	now  func() time.Time

	mu    sync.Mutex
	cache map[string]authDecision
}

type authDecision struct {
	allowed bool
	reason  string
	until   time.Time
}

const (
	authAllowedTTL = 5 * time.Minute
	authDeniedTTL  = 30 * time.Second
)

func newKubeletAuth(node string, client kubernetes.Interface, log *slog.Logger) *kubeletAuth {
	return &kubeletAuth{node: node, sar: client, log: log, now: time.Now, cache: map[string]authDecision{}}
}

// wrap lets through only requests of a verified client certificate whose user
// the API server allows (see above).
func (a *kubeletAuth) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		cert := r.TLS.VerifiedChains[0][0]
		user, groups := cert.Subject.CommonName, cert.Subject.Organization
		verb, sub := kubeletRequestAttributes(r)
		allowed, reason, err := a.authorize(r.Context(), user, groups, verb, sub)
		if err != nil {
			a.log.Warn("kubelet API: authorization failed", "user", user, "verb", verb, "subresource", sub, "err", err)
			http.Error(w, "Authorization error (user="+user+", verb="+verb+", resource=nodes, subresource="+sub+")", http.StatusInternalServerError)
			return
		}
		if !allowed {
			msg := fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource=%s)", user, verb, sub)
			if reason != "" {
				msg += ": " + reason
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// kubeletRequestAttributes maps a request to the verb and nodes subresource a
// kubelet checks.
func kubeletRequestAttributes(r *http.Request) (verb, subresource string) {
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, "/stats"):
		subresource = "stats"
	case strings.HasPrefix(path, "/metrics"):
		subresource = "metrics"
	default:
		subresource = "proxy"
	}
	for _, p := range []string{"/exec/", "/attach/", "/run/", "/portForward/"} {
		if strings.HasPrefix(path, p) {
			return "create", subresource
		}
	}
	switch r.Method {
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = "get"
	}
	return verb, subresource
}

func (a *kubeletAuth) authorize(ctx context.Context, user string, groups []string, verb, sub string) (bool, string, error) {
	key := strings.Join([]string{user, strings.Join(groups, ","), verb, sub}, "\x00")
	now := a.now()
	a.mu.Lock()
	d, ok := a.cache[key]
	a.mu.Unlock()
	if ok && now.Before(d.until) {
		return d.allowed, d.reason, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := a.sar.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: slices.Clone(groups),
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: "", Version: "v1", Resource: "nodes", Subresource: sub, Name: a.node,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("subject access review: %w", err)
	}
	d = authDecision{allowed: res.Status.Allowed, reason: res.Status.Reason, until: now.Add(authDeniedTTL)}
	if d.allowed {
		d.until = now.Add(authAllowedTTL)
	}
	a.mu.Lock()
	if len(a.cache) > 1024 {
		clear(a.cache)
	}
	a.cache[key] = d
	a.mu.Unlock()
	return d.allowed, d.reason, nil
}

// clientCAPool reads the kubelet API's client CA: file, else the CA the
// kubeconfig trusts for the API server (the local cluster's one CA signs the
// API server's kubelet client certificate). Without either the node refuses
// to start: its API would otherwise answer anyone.
func clientCAPool(file string, restCfg *rest.Config) (*x509.CertPool, error) {
	var pemData []byte
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read the kubelet API's client CA: %w", err)
		}
		pemData = b
	case len(restCfg.CAData) > 0:
		pemData = restCfg.CAData
	case restCfg.CAFile != "":
		b, err := os.ReadFile(restCfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read the kubeconfig's CA: %w", err)
		}
		pemData = b
	default:
		return nil, errors.New("the kubelet API needs a client CA: pass --client-ca-file, or a kubeconfig with the cluster's CA")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("the kubelet API's client CA holds no certificate")
	}
	return pool, nil
}

// kubeletServer is the kubelet API's HTTPS server: serving certificate cert,
// client certificates of clientCAs required, each request authorised by auth.
func kubeletServer(handler http.Handler, cert tls.Certificate, clientCAs *x509.CertPool, auth *kubeletAuth, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           auth.wrap(handler),
		ReadHeaderTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    clientCAs,
			MinVersion:   tls.VersionTLS12,
			NextProtos:   []string{"http/1.1"},
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		// Exec and attach upgrade the connection, which HTTP/2 cannot do.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
}
