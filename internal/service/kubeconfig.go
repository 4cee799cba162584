package service

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// A cluster's credentials are rotated by rewriting its kubeconfig (a
// Secret mounted as a file is updated in place); the service follows
// without a restart, so that a cluster whose credentials expired is Ready
// again once new ones are given (docs/serve.md, "Several clusters").
// client-go already reads again the files a kubeconfig names (a token
// file every minute, a client certificate and key every few minutes, an
// exec plugin's credentials when they expire); what it reads once is what
// the kubeconfig holds itself. liveCredentials takes those over: the
// token is sent from what was read last, and the certificate and key are
// written to files of the service's state directory, which client-go
// reads again. A change of the server or of its CA needs a restart (the
// connection itself changes): the reload says so and keeps what it had.

// liveCredentials are the credentials of one cluster's kubeconfig as last
// read.
type liveCredentials struct {
	kubeconfig, context string
	host                string
	caData              []byte
	certFile, keyFile   string // written by this process; "" when the kubeconfig names its own

	mu    sync.Mutex
	token string // "" when the kubeconfig holds none (or names a token file)
}

// kubeconfigPath is the file clientcmd loads for c: its kubeconfig, else
// the first of $KUBECONFIG's files, else ~/.kube/config ("" when none
// exists: in-cluster).
func kubeconfigPath(c ClusterConfig) string {
	if c.Kubeconfig != "" {
		return c.Kubeconfig
	}
	for _, p := range clientcmd.NewDefaultClientConfigLoadingRules().GetLoadingPrecedence() {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// liveRESTConfig is clusterRESTConfig(c) whose credentials held in the
// kubeconfig itself follow its changes (reload): the token through a
// wrapper of the transport, the client certificate and key through files
// in dir.
func liveRESTConfig(c ClusterConfig, dir string) (*rest.Config, *liveCredentials, error) {
	rc, err := clusterRESTConfig(c)
	if err != nil {
		return nil, nil, err
	}
	lc := &liveCredentials{kubeconfig: kubeconfigPath(c), context: c.Context, host: rc.Host, caData: caOf(rc)}
	if lc.kubeconfig == "" {
		return rc, nil, nil // in-cluster: client-go reads the service account's token file again
	}
	if rc.BearerToken != "" && rc.BearerTokenFile == "" {
		lc.token = rc.BearerToken
		rc.BearerToken = ""
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &liveToken{lc: lc, rt: rt} })
	}
	if len(rc.CertData) > 0 && len(rc.KeyData) > 0 && rc.CertFile == "" && rc.KeyFile == "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("the directory of cluster %s's credentials: %w", c.Name, err)
		}
		lc.certFile, lc.keyFile = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
		if err := lc.writeCert(rc.CertData, rc.KeyData); err != nil {
			return nil, nil, err
		}
		rc.CertData, rc.KeyData = nil, nil
		rc.CertFile, rc.KeyFile = lc.certFile, lc.keyFile
	}
	return rc, lc, nil
}

func caOf(rc *rest.Config) []byte {
	if len(rc.CAData) > 0 {
		return rc.CAData
	}
	b, _ := os.ReadFile(rc.CAFile)
	return b
}

// writeCert replaces the certificate and key files (each written whole,
// then renamed: client-go never reads half of one).
func (lc *liveCredentials) writeCert(cert, key []byte) error {
	for _, f := range []struct {
		path string
		data []byte
	}{{lc.keyFile, key}, {lc.certFile, cert}} {
		tmp := f.path + ".new"
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	return nil
}

// reload reads the kubeconfig again and takes its credentials; a changed
// server or CA is refused (a restart takes it), keeping what is in use.
func (lc *liveCredentials) reload() error {
	rc, err := clusterRESTConfig(ClusterConfig{Kubeconfig: lc.kubeconfig, Context: lc.context})
	if err != nil {
		return err
	}
	if rc.Host != lc.host || !bytes.Equal(caOf(rc), lc.caData) {
		return fmt.Errorf("the kubeconfig now names another server (%s, was %s) or CA: restart the service to use it; the credentials in use stay", rc.Host, lc.host)
	}
	lc.mu.Lock()
	hadToken := lc.token != ""
	if hadToken {
		lc.token = rc.BearerToken
	}
	lc.mu.Unlock()
	if hadToken && rc.BearerToken == "" {
		return fmt.Errorf("the kubeconfig no longer holds a token: restart the service for other credentials")
	}
	if lc.certFile != "" {
		if len(rc.CertData) == 0 || len(rc.KeyData) == 0 {
			return fmt.Errorf("the kubeconfig no longer holds a client certificate and key: restart the service for other credentials")
		}
		return lc.writeCert(rc.CertData, rc.KeyData)
	}
	return nil
}

// liveToken sends the token last read as the request's bearer token.
type liveToken struct {
	lc *liveCredentials
	rt http.RoundTripper
}

func (t *liveToken) RoundTrip(req *http.Request) (*http.Response, error) {
	t.lc.mu.Lock()
	tok := t.lc.token
	t.lc.mu.Unlock()
	if tok == "" || req.Header.Get("Authorization") != "" {
		return t.rt.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+tok)
	return t.rt.RoundTrip(req)
}

func (t *liveToken) WrappedRoundTripper() http.RoundTripper { return t.rt }
