// Package imagetest builds small container images for tests, with
// go-containerregistry and without a container engine or a registry.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"sort"
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
