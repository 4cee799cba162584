package localcluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// KubeletClientUser is the user (certificate CN) the apiserver presents to
// kubelets, with group system:masters: the local nodes let it use their
// kubelet API (logs, exec) after asking the apiserver, as a kubelet in
// webhook authorisation mode does.
const KubeletClientUser = "kube-apiserver-kubelet-client"

// pki is the key material a cluster needs, written once into its directory.
//
// Two CAs, as kubeadm makes them: the cluster CA (ca.crt) signs the
// apiserver's serving certificate and its client certificate for kubelets,
// and is the client CA of the apiserver and of the local nodes' kubelet API;
// the etcd CA (etcd-ca.crt) signs only etcd's certificate and the etcd client
// certificate of the apiserver (and of the cluster's own fault hooks), so
// that no certificate of the cluster CA opens etcd.
type pki struct {
	CACert, ServingCert, ServingKey     string // PEM files
	KubeletClientCert, KubeletClientKey string // the apiserver's client certificate for kubelets
	EtcdCACert                          string
	EtcdCert, EtcdKey                   string // etcd's serving and peer certificate
	EtcdClientCert, EtcdClientKey       string // the apiserver's etcd client certificate
	SAKey, SAPub                        string // service-account signing key pair
	Token                               string // static admin bearer token
}

// ensurePKI generates what is missing of the cluster's key material in dir (all
// of it the first time; a directory of an earlier version gets the new files
// signed by its existing CAs) and reuses the rest, on restart.
func ensurePKI(dir string) (*pki, error) {
	p := &pki{
		CACert:            filepath.Join(dir, "ca.crt"),
		ServingCert:       filepath.Join(dir, "apiserver.crt"),
		ServingKey:        filepath.Join(dir, "apiserver.key"),
		KubeletClientCert: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		KubeletClientKey:  filepath.Join(dir, "apiserver-kubelet-client.key"),
		EtcdCACert:        filepath.Join(dir, "etcd-ca.crt"),
		EtcdCert:          filepath.Join(dir, "etcd.crt"),
		EtcdKey:           filepath.Join(dir, "etcd.key"),
		EtcdClientCert:    filepath.Join(dir, "apiserver-etcd-client.crt"),
		EtcdClientKey:     filepath.Join(dir, "apiserver-etcd-client.key"),
		SAKey:             filepath.Join(dir, "sa.key"),
		SAPub:             filepath.Join(dir, "sa.pub"),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pki directory: %w", err)
	}
	now := time.Now()
	loopback := []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}

	ca, caNew, err := ensureCA(p.CACert, filepath.Join(dir, "ca.key"), "kubetask-local-ca")
	if err != nil {
		return nil, err
	}
	leaves := []struct {
		cert, key string
		tmpl      *x509.Certificate
		ca        *authority
		caNew     bool
	}{
		{p.ServingCert, p.ServingKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)},
		}, ca, caNew},
		{p.KubeletClientCert, p.KubeletClientKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: KubeletClientUser, Organization: []string{"system:masters"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, ca, caNew},
	}
	etcdCA, etcdCANew, err := ensureCA(p.EtcdCACert, filepath.Join(dir, "etcd-ca.key"), "kubetask-local-etcd-ca")
	if err != nil {
		return nil, err
	}
	leaves = append(leaves, []struct {
		cert, key string
		tmpl      *x509.Certificate
		ca        *authority
		caNew     bool
	}{
		{p.EtcdCert, p.EtcdKey, &x509.Certificate{
			Subject: pkix.Name{CommonName: "etcd"},
			// Serving clients and its own peer port (a peer connects as a client).
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    []string{"localhost"},
			IPAddresses: loopback,
		}, etcdCA, etcdCANew},
		{p.EtcdClientCert, p.EtcdClientKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver-etcd-client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, etcdCA, etcdCANew},
	}...)
	for _, l := range leaves {
		if !l.caNew && fileExists(l.cert, l.key) {
			continue
		}
		l.tmpl.NotBefore, l.tmpl.NotAfter = now.Add(-time.Hour), now.AddDate(10, 0, 0)
		l.tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		if err := l.ca.issue(l.tmpl, l.cert, l.key); err != nil {
			return nil, err
		}
	}

	if !fileExists(p.SAKey, p.SAPub) {
		saKey, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, fmt.Errorf("generating service-account key: %w", err)
		}
		saPubDER, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
		if err := writeFiles(map[string][]byte{
			p.SAKey: pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)),
			p.SAPub: pemBlock("PUBLIC KEY", saPubDER),
		}); err != nil {
			return nil, err
		}
	}
	tokenPath := filepath.Join(dir, "admin.token")
	if tok, err := os.ReadFile(tokenPath); err == nil && len(tok) > 0 {
		p.Token = string(tok)
		return p, nil
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("generating token: %w", err)
	}
	p.Token = fmt.Sprintf("%x", tok)
	if err := writeFiles(map[string][]byte{tokenPath: []byte(p.Token)}); err != nil {
		return nil, err
	}
	return p, nil
}

// authority is a CA's certificate and key.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// ensureCA loads the CA at certPath and keyPath, or creates it (created is
// then true: every certificate it signs must be issued again).
func ensureCA(certPath, keyPath, name string) (ca *authority, created bool, err error) {
	if fileExists(certPath, keyPath) {
		ca, err := loadCA(certPath, keyPath)
		if err != nil {
			return nil, false, err
		}
		return ca, false, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("generating %s key: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, false, fmt.Errorf("creating %s certificate: %w", name, err)
	}
	cert, _ := x509.ParseCertificate(der)
	if err := writeFiles(map[string][]byte{certPath: pemBlock("CERTIFICATE", der), keyPath: mustECKeyPEM(key)}); err != nil {
		return nil, false, err
	}
	return &authority{cert: cert, key: key}, true, nil
}

func loadCA(certPath, keyPath string) (*authority, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("reading CA key: %w", err)
	}
	c, _ := pem.Decode(cb)
	k, _ := pem.Decode(kb)
	if c == nil || k == nil {
		return nil, fmt.Errorf("CA %s or its key is not PEM", certPath)
	}
	cert, err := x509.ParseCertificate(c.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing CA %s: %w", certPath, err)
	}
	key, err := x509.ParseECPrivateKey(k.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing CA key %s: %w", keyPath, err)
	}
	return &authority{cert: cert, key: key}, nil
}

// issue signs a new key's certificate made from tmpl and writes both.
func (a *authority) issue(tmpl *x509.Certificate, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating key for %s: %w", certPath, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return fmt.Errorf("generating serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return fmt.Errorf("creating %s: %w", certPath, err)
	}
	return writeFiles(map[string][]byte{certPath: pemBlock("CERTIFICATE", der), keyPath: mustECKeyPEM(key)})
}

func writeFiles(files map[string][]byte) error {
	var errs []error
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func mustECKeyPEM(k *ecdsa.PrivateKey) []byte {
	der, _ := x509.MarshalECPrivateKey(k)
	return pemBlock("EC PRIVATE KEY", der)
}

func fileExists(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}
