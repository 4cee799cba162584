package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// goBinary is a small Go program built once by TestMain: the SBOM reads the
// build information of a real Go binary.
var goBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "image-test")
	if err != nil {
		panic(err)
	}
	goBinary = filepath.Join(dir, "hello")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644); err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/hello\n\ngo 1.26\n"), 0o644); err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", goBinary, ".")
	build.Dir, build.Env = dir, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		panic(fmt.Sprintf("go build: %v\n%s", err, out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// fixture writes the two platforms' "binaries" (the arm64 one is the
// amd64 one with a marker appended) and a CA bundle.
func fixture(t *testing.T) (amd64, arm64, ca string) {
	t.Helper()
	dir := t.TempDir()
	self, err := os.ReadFile(goBinary)
	if err != nil {
		t.Fatal(err)
	}
	amd64 = goBinary
	arm64 = filepath.Join(dir, "kubetask-arm64")
	ca = filepath.Join(dir, "ca.crt")
	for p, data := range map[string]string{arm64: string(self) + armMarker, ca: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"} {
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return amd64, arm64, ca
}

const armMarker = "arm64 binary"

func build(t *testing.T, out string, extra ...string) {
	t.Helper()
	amd64, arm64, ca := fixture(t)
	args := append([]string{
		"-binary", "linux/amd64=" + amd64, "-binary", "linux/arm64=" + arm64, "-ca-bundle", ca, "-ca-version", "20250419",
		"-version", "v0.4.1", "-revision", "0123abc", "-epoch", "1764759600", "-tag", "latest", "-platform", "linux/amd64", "-out", out,
	}, extra...)
	var stdout bytes.Buffer
	if err := run(args, &stdout); err != nil {
		t.Fatalf("image %s: %v", strings.Join(args, " "), err)
	}
	if !strings.Contains(stdout.String(), "ghcr.io/kubetask/kubetask:v0.4.1@sha256:") || !strings.Contains(stdout.String(), "MB compressed") {
		t.Errorf("stdout %q, want the reference with its digest and the sizes", stdout.String())
	}
}

func sum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestReproducible: two builds of the same inputs, in other directories,
// give the same digest, tar and SBOMs; another epoch gives another digest
// (TestImage checks that every time in the image is the epoch, none the
// wall clock's).
func TestReproducible(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	build(t, a)
	build(t, b)
	for _, f := range []string{"digest", "kubetask-image.tar", "sbom-linux-amd64.cdx.json", "sbom-linux-arm64.cdx.json", "oci/index.json"} {
		if sum(t, filepath.Join(a, f)) != sum(t, filepath.Join(b, f)) {
			t.Errorf("%s differs between two builds of the same inputs", f)
		}
	}
	build(t, c, "-epoch", "1764759601")
	if sum(t, filepath.Join(a, "digest")) == sum(t, filepath.Join(c, "digest")) {
		t.Error("another SOURCE_DATE_EPOCH gave the same digest: the epoch is not in the image")
	}
}

// TestImage checks what the OCI layout holds: both platforms in one index,
// the labels, a numeric non-root user, the binary as entrypoint, the CA
// bundle, and no shell.
func TestImage(t *testing.T) {
	out := t.TempDir()
	build(t, out)
	_, _, ca := fixture(t)
	p, err := layout.FromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	outer, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	om, err := outer.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(om.Manifests) != 1 || om.Manifests[0].Annotations["io.containerd.image.name"] != "ghcr.io/kubetask/kubetask:v0.4.1" {
		t.Fatalf("index.json = %+v, want one index named ghcr.io/kubetask/kubetask:v0.4.1", om.Manifests)
	}
	digest, _ := os.ReadFile(filepath.Join(out, "digest"))
	if got := om.Manifests[0].Digest.String(); got != strings.TrimSpace(string(digest)) {
		t.Errorf("index.json names %s, the digest file %s", got, digest)
	}
	idx, err := outer.ImageIndex(om.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != "application/vnd.oci.image.index.v1+json" || im.Annotations["org.opencontainers.image.revision"] != "0123abc" {
		t.Errorf("index: media type %s, annotations %v", im.MediaType, im.Annotations)
	}
	var platforms []string
	for _, d := range im.Manifests {
		platforms = append(platforms, d.Platform.String())
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != d.Platform.Architecture || cf.OS != "linux" {
			t.Errorf("%s: config says %s/%s", d.Platform, cf.OS, cf.Architecture)
		}
		c := cf.Config
		if c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/usr/local/bin/kubetask" || strings.Join(c.Cmd, " ") != "serve" || c.WorkingDir != "/home/nonroot" {
			t.Errorf("%s: user %q entrypoint %q cmd %q workdir %q", d.Platform, c.User, c.Entrypoint, c.Cmd, c.WorkingDir)
		}
		for k, v := range map[string]string{"org.opencontainers.image.source": "https://github.com/kubetask/kubetask", "org.opencontainers.image.revision": "0123abc", "org.opencontainers.image.version": "v0.4.1"} {
			if c.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", d.Platform, k, c.Labels[k], v)
			}
		}
		if !cf.Created.Equal(time.Unix(1764759600, 0)) {
			t.Errorf("%s: created %s, want the epoch", d.Platform, cf.Created)
		}
		files := filesOf(t, img)
		if _, ok := files["bin/sh"]; ok {
			t.Errorf("%s: the image has a shell", d.Platform)
		}
		bin := files["usr/local/bin/kubetask"]
		if bin.hdr == nil || bin.hdr.Mode != 0o755 {
			t.Fatalf("%s: /usr/local/bin/kubetask missing or not executable: %+v", d.Platform, bin.hdr)
		}
		if d.Platform.Architecture == "arm64" && !strings.HasSuffix(bin.data, armMarker) {
			t.Errorf("arm64 image holds %q, not the arm64 binary", bin.data[:min(20, len(bin.data))])
		}
		if want, _ := os.ReadFile(ca); files["etc/ssl/certs/ca-certificates.crt"].data != string(want) {
			t.Errorf("%s: the CA bundle differs from the build machine's", d.Platform)
		}
		if h := files["home/nonroot"].hdr; h == nil || h.Uid != UID {
			t.Errorf("%s: /home/nonroot is not the user's: %+v", d.Platform, h)
		}
		if !strings.Contains(files["etc/passwd"].data, "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd %q does not name user 65532", d.Platform, files["etc/passwd"].data)
		}
	}
	if strings.Join(platforms, " ") != "linux/amd64 linux/arm64" {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
}

type entry struct {
	hdr  *tar.Header
	data string
}

func filesOf(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]entry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(time.Unix(1764759600, 0)) {
			t.Errorf("%s: mtime %s, want the epoch", h.Name, h.ModTime)
		}
		files[strings.TrimSuffix(h.Name, "/")] = entry{hdr: h, data: string(b)}
	}
}

// TestArchive: the tar is an OCI layout (index.json, what ctr import and
// kind load read) with Docker's manifest.json (what docker load, podman load
// and crane push read) naming the amd64 image by both tags; go-containerregistry's
// reader of docker save archives, the one crane push uses, loads it.
func TestArchive(t *testing.T) {
	out := t.TempDir()
	build(t, out)
	archive := filepath.Join(out, "kubetask-image.tar")
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	names := map[string]bool{}
	var manifest []dockerManifest
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
		if h.Name == "manifest.json" {
			if err := json.NewDecoder(tr).Decode(&manifest); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range []string{"oci-layout", "index.json", "manifest.json"} {
		if !names[n] {
			t.Errorf("the archive has no %s", n)
		}
	}
	if len(manifest) != 1 || strings.Join(manifest[0].RepoTags, " ") != "ghcr.io/kubetask/kubetask:v0.4.1 ghcr.io/kubetask/kubetask:latest" || !names[manifest[0].Config] {
		t.Fatalf("manifest.json = %+v", manifest)
	}
	for _, l := range manifest[0].Layers {
		if !names[l] {
			t.Errorf("manifest.json names layer %s, not in the archive", l)
		}
	}
	for _, tag := range manifest[0].RepoTags {
		img, err := tarball.ImageFromPath(archive, mustTag(t, tag))
		if err != nil {
			t.Fatalf("reading %s from the archive: %v", tag, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != "amd64" {
			t.Errorf("%s: architecture %s, want amd64 (-platform)", tag, cf.Architecture)
		}
		if _, err := img.Layers(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSBOM: the CycloneDX SBOM names the Go modules of the binary (the test
// binary's: example.com/hello), the standard library and the CA
// bundle.
func TestSBOM(t *testing.T) {
	out := t.TempDir()
	build(t, out)
	b, err := os.ReadFile(filepath.Join(out, "sbom-linux-amd64.cdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat    string `json:"bomFormat"`
		SerialNumber string `json:"serialNumber"`
		Metadata     struct {
			Timestamp string `json:"timestamp"`
			Component struct {
				Name    string `json:"name"`
				Version string `json:"version"`
			} `json:"component"`
		} `json:"metadata"`
		Components []struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"components"`
	}
	if err := json.Unmarshal(b, &bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || !strings.HasPrefix(bom.SerialNumber, "urn:uuid:") || bom.Metadata.Timestamp != "2025-12-03T11:00:00Z" ||
		bom.Metadata.Component.Version != "v0.4.1" || bom.Metadata.Component.Name != "example.com/hello" {
		t.Errorf("SBOM header: %s %s %s, component %s %s, want the binary's main module at -version", bom.BOMFormat, bom.SerialNumber, bom.Metadata.Timestamp, bom.Metadata.Component.Name, bom.Metadata.Component.Version)
	}
	want := map[string]bool{"std": false, "ca-certificates": false}
	for _, c := range bom.Components {
		if _, ok := want[c.Name]; ok {
			want[c.Name] = true
		}
	}
	for n, found := range want {
		if !found {
			t.Errorf("the SBOM has no component %s", n)
		}
	}
}

func TestSpecErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		spec Spec
		want string
	}{
		"no binary":    {Spec{CABundle: "x", Version: "v1", Revision: "r"}, "give -binary linux/amd64=PATH"},
		"bad platform": {Spec{Binaries: map[string]string{"amd64": "x"}, CABundle: "x", Version: "v1", Revision: "r"}, `platform "amd64": want linux/ARCH`},
		"no CA bundle": {Spec{Binaries: map[string]string{"linux/amd64": "x"}, Version: "v1", Revision: "r"}, "give -ca-bundle"},
		"no version":   {Spec{Binaries: map[string]string{"linux/amd64": "x"}, CABundle: "x"}, "-version and -revision are required"},
		"windows":      {Spec{Binaries: map[string]string{"windows/amd64": "x"}, CABundle: "x", Version: "v1", Revision: "r"}, "want linux/ARCH"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Build(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Build: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func mustTag(t *testing.T, s string) *name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return &tag
}
