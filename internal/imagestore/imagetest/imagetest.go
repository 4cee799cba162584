// Package imagetest builds small container images for tests, with
// go-containerregistry and without a container engine or a registry.
package imagetest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one file system entry of a layer.
type Entry struct {
	// Body is a regular file's content; Link a symbolic or hard link's target.
	Body []byte
	Link string
	// Type is a tar type flag; zero means a regular file (a directory when Name ends in /).
	Type byte
	Mode int64
	UID  int
}

// Layer builds an uncompressed layer of the entries, in name order.
func Layer(t testing.TB, entries map[string]Entry) v1.Layer {
	t.Helper()
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: n, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Linkname: e.Link, ModTime: time.Unix(1700000000, 0)}
		switch {
		case h.Typeflag == 0 && n[len(n)-1] == '/':
			h.Typeflag = tar.TypeDir
		case h.Typeflag == 0:
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image stacks the layers (first at the bottom) on an empty image with cfg.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// WriteTar writes img as a docker-compatible tar (docker save, kind load) named tag.
func WriteTar(t testing.TB, path, tag string, img v1.Image) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
}

// Binary is a layer entry holding the executable file at path.
func Binary(t testing.TB, path string) Entry {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return Entry{Body: b, Mode: 0o755}
}

// Probe builds the probe command (package probe: a static binary that reports
// what a container sees) into dir and returns its path.
func Probe(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "probe")
	cmd := exec.Command("go", "build", "-o", out, "github.com/kubetask/kubetask/internal/imagestore/imagetest/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v: %s", err, b)
	}
	return out
}

// NetProbe builds the network probe (package netprobe: a static HTTP server
// that reports a pod's network and asks the apiserver who it is) into dir and
// returns its path.
func NetProbe(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "netprobe")
	cmd := exec.Command("go", "build", "-o", out, "github.com/kubetask/kubetask/internal/imagestore/imagetest/netprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the network probe: %v: %s", err, b)
	}
	return out
}

// NetReport is the network probe's answer to GET / (see package netprobe).
type NetReport struct {
	Pod     string   `json:"pod"`
	PodIP   string   `json:"podIP"`
	Addrs   []string `json:"addrs"`
	APIUser string   `json:"apiUser"`
}

// Report is the probe's report (see package probe).
type Report struct {
	PID    int               `json:"pid"`
	UID    int               `json:"uid"`
	GID    int               `json:"gid"`
	Groups []int             `json:"groups"`
	Cwd    string            `json:"cwd"`
	Env    []string          `json:"env"`
	Args   []string          `json:"args"`
	Files  map[string]string `json:"files"`
}

// ParseReport reads the probe's report from the first line of its output.
func ParseReport(t testing.TB, out string) Report {
	t.Helper()
	line, _, _ := strings.Cut(out, "\n")
	var r Report
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return r
}

// Getenv returns the value of key in the report's environment.
func (r Report) Getenv(key string) (string, bool) {
	for _, kv := range r.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}
