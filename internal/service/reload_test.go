package service

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
	"errors"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/server"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestCheckTokenFile(t *testing.T) {
	for mode, ok := range map[os.FileMode]bool{0o600: true, 0o400: true, 0o640: true, 0o440: true, 0o644: false, 0o604: false, 0o660: false, 0o666: false, 0o602: false} {
		p := filepath.Join(t.TempDir(), "tokens.yaml")
		if err := os.WriteFile(p, []byte("tokens: []"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		err := checkTokenFile(p)
		if (err == nil) != ok {
			t.Errorf("mode %04o: %v, want accepted %v", mode, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: the error %q does not say the fix", mode, err)
		}
	}
}

// The generated token is written to its file (0600), never printed; a
// token file others may read is refused.
func TestGeneratedTokenNotPrinted(t *testing.T) {
	cfg := Config{StateDir: t.TempDir()}
	if err := cfg.Defaults(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	auth, err := newAuth(cfg, nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := server.LoadTokenFile(cfg.TokenFile)
	if err != nil || len(toks) != 1 {
		t.Fatalf("generated file: %v %v", toks, err)
	}
	if strings.Contains(out.String(), toks[0].Token) {
		t.Fatalf("the token is printed: %q", out.String())
	}
	if !strings.Contains(out.String(), cfg.TokenFile) {
		t.Fatalf("the output does not say where the token is: %q", out.String())
	}
	if _, err := auth.Authenticate(context.Background(), toks[0].Token); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(cfg.TokenFile); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %04o", fi.Mode().Perm())
	}
	if err := os.Chmod(cfg.TokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newAuth(cfg, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable token file: %v, want refused", err)
	}
}

// A changed token file applies at the next check: a new token is accepted,
// a removed one refused; a broken file keeps the tokens in use.
func TestTokenFileReloaded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tokens:\n- {token: old, subject: a, namespaces: '*'}\n")
	toks, err := loadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	ta, err := server.NewTokenAuth(toks)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	r := newReloader("token file", []string{p}, func() error {
		toks, err := loadTokens(p)
		if err != nil {
			return err
		}
		return ta.Reload(toks)
	}, clk, quietLog())
	known := func(tok string) bool { _, err := ta.Authenticate(context.Background(), tok); return err == nil }
	if r.check() {
		t.Fatal("an unchanged file reloaded")
	}
	write("tokens:\n- {token: new, subject: a, namespaces: '*'}\n")
	if !r.check() || !known("new") || known("old") {
		t.Fatalf("after the change: new %v, old %v", known("new"), known("old"))
	}
	write("tokens: [{token: broken}]\n")
	if r.check() || !known("new") {
		t.Fatal("a broken file replaced the tokens")
	}
	// run checks on its ticker.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.run(ctx, 10*time.Second)
	write("tokens:\n- {token: third, subject: a, namespaces: '*'}\n")
	deadline := time.Now().Add(10 * time.Second)
	for !known("third") {
		if time.Now().After(deadline) {
			t.Fatal("the ticker's check did not reload")
		}
		clk.Step(10 * time.Second)
		time.Sleep(5 * time.Millisecond)
	}
}

// selfSigned writes a certificate for cn and its key.
func selfSigned(t *testing.T, certFile, keyFile, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(
		os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600),
		os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)); err != nil {
		t.Fatal(err)
	}
}

// A renewed certificate is served from the next check on, without a
// restart.
func TestCertificateReloaded(t *testing.T) {
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	selfSigned(t, cf, kf, "first")
	c := &certificate{certFile: cf, keyFile: kf}
	if err := c.load(); err != nil {
		t.Fatal(err)
	}
	r := newReloader("TLS certificate", []string{cf, kf}, c.load, clocktesting.NewFakeClock(time.Now()), quietLog())
	served := func() string {
		cert, _ := c.get(&tls.ClientHelloInfo{})
		x, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.Subject.CommonName
	}
	selfSigned(t, cf, kf, "renewed")
	if !r.check() || served() != "renewed" {
		t.Fatalf("served %q after the renewal", served())
	}
	if err := os.WriteFile(kf, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r.check() || served() != "renewed" {
		t.Fatal("a broken key replaced the certificate")
	}
}
