package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's file system and process: a static binary, the CA bundle, a
// passwd and group naming the non-root user, its home and /tmp; no shell.
const (
	// UID is the numeric user the image runs as (distroless's nonroot).
	UID      = 65532
	binPath  = "/usr/local/bin/kubetask"
	caPath   = "/etc/ssl/certs/ca-certificates.crt"
	homePath = "/home/nonroot"
)

// Spec is what an image is built from.
type Spec struct {
	// Binaries maps a platform ("linux/amd64") to the static kubetask
	// binary built for it; each becomes one image of the index.
	Binaries map[string]string
	// CABundle is the PEM bundle copied to /etc/ssl/certs (the build
	// machine's, Debian's ca-certificates).
	CABundle string
	// Created is every timestamp in the image: config, history and file
	// times (SOURCE_DATE_EPOCH, the commit's time).
	Created time.Time
	// Source, Revision and Version are the OCI labels and annotations
	// org.opencontainers.image.{source,revision,version}.
	Source, Revision, Version string
	// Cmd is the image's default arguments after the entrypoint (the
	// binary). Default ["serve"].
	Cmd []string
}

func (s *Spec) check() error {
	var errs []string
	if len(s.Binaries) == 0 {
		errs = append(errs, "no binary: give -binary linux/amd64=PATH (one per platform)")
	}
	for p := range s.Binaries {
		if _, err := parsePlatform(p); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if s.CABundle == "" {
		errs = append(errs, "no CA bundle: give -ca-bundle (Debian's is /etc/ssl/certs/ca-certificates.crt, from the ca-certificates package)")
	}
	if s.Version == "" || s.Revision == "" {
		errs = append(errs, "-version and -revision are required (the OCI labels of the image)")
	}
	if len(errs) > 0 {
		return fmt.Errorf("image spec: %s", strings.Join(errs, "; "))
	}
	if len(s.Cmd) == 0 {
		s.Cmd = []string{"serve"}
	}
	return nil
}

func parsePlatform(p string) (v1.Platform, error) {
	os, arch, ok := strings.Cut(p, "/")
	if !ok || os != "linux" || arch == "" || strings.Contains(arch, "/") {
		return v1.Platform{}, fmt.Errorf("platform %q: want linux/ARCH, such as linux/amd64 or linux/arm64", p)
	}
	return v1.Platform{OS: os, Architecture: arch}, nil
}

// labels are the OCI labels of each image and the annotations of its
// manifest and the index.
func (s *Spec) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":      s.Source,
		"org.opencontainers.image.revision":    s.Revision,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.created":     s.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.title":       "kubetask",
		"org.opencontainers.image.description": "kubetask serve: runs tasks as Kubernetes pods and reports each outcome exactly once",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
}

// Build builds the multi-platform index of spec. The result depends on
// spec and the files' contents only: the same inputs give the same digest.
func Build(spec Spec) (v1.ImageIndex, error) {
	if err := spec.check(); err != nil {
		return nil, err
	}
	base, err := baseLayer(spec)
	if err != nil {
		return nil, err
	}
	platforms := make([]string, 0, len(spec.Binaries))
	for p := range spec.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		platform, _ := parsePlatform(p)
		img, err := platformImage(spec, base, platform, spec.Binaries[p])
		if err != nil {
			return nil, fmt.Errorf("image for %s: %w", p, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	idx = mutate.AppendManifests(idx, adds...)
	return mutate.Annotations(idx, spec.labels()).(v1.ImageIndex), nil
}

func platformImage(spec Spec, base v1.Layer, platform v1.Platform, binary string) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	app, err := layerOf(spec.Created, []file{{name: binPath, mode: 0o755, data: bin}})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: spec.Created.UTC()}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "kubetask tools/image: CA certificates, passwd, group, home, /tmp", Comment: "base"}},
		mutate.Addendum{Layer: app, History: v1.History{Created: created, CreatedBy: "kubetask tools/image: " + binPath, Comment: "kubetask " + spec.Version}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = platform.OS, platform.Architecture, platform.Variant
	cf.Created = created
	cf.Author = "kubetask"
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, UID),
		Entrypoint: []string{binPath},
		Cmd:        spec.Cmd,
		WorkingDir: homePath,
		Env: []string{
			"PATH=/usr/local/bin",
			"HOME=" + homePath,
			"SSL_CERT_FILE=" + caPath,
		},
		Labels: spec.labels(),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, spec.labels()).(v1.Image), nil
}

// baseLayer holds what every platform's image shares.
func baseLayer(spec Spec) (v1.Layer, error) {
	ca, err := os.ReadFile(spec.CABundle)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", UID, UID, homePath)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID)
	return layerOf(spec.Created, []file{
		{name: caPath, mode: 0o644, data: ca},
		{name: "/etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "/etc/group", mode: 0o644, data: []byte(group)},
		{name: homePath, mode: 0o700, dir: true, uid: UID},
		{name: "/tmp", mode: 0o1777, dir: true},
	})
}

// file is one entry of a layer.
type file struct {
	name string
	mode int64
	data []byte
	dir  bool
	uid  int
}

// layerOf makes a gzip-compressed OCI layer of files and their parent
// directories, in name order, every time set to mtime, owned by root
// unless said otherwise: the same files give the same bytes.
func layerOf(mtime time.Time, files []file) (v1.Layer, error) {
	entries := map[string]file{}
	for _, f := range files {
		entries[strings.TrimPrefix(f.name, "/")] = f
		for d := path.Dir(strings.TrimPrefix(f.name, "/")); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = file{name: d, mode: 0o755, dir: true}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := entries[n]
		h := &tar.Header{Name: n, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithMediaType(types.OCILayer))
}
