package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// WriteLayout writes idx as an OCI image layout in dir (made anew):
// oci-layout, index.json naming the index by ref (the annotations
// org.opencontainers.image.ref.name, the tag, and io.containerd.image.name,
// the full name, that ctr import reads), and blobs/sha256/. crane push,
// skopeo and oras read it.
func WriteLayout(dir string, idx v1.ImageIndex, ref, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	anns := map[string]string{"org.opencontainers.image.ref.name": tag, "io.containerd.image.name": ref}
	if err := p.AppendIndex(idx, layout.WithAnnotations(anns)); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	return nil
}

// dockerManifest is one entry of the manifest.json of `docker save`.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// WriteArchive writes the OCI layout in dir as one tar file, with a
// manifest.json that names the image of platform by tags, as `docker save`
// of Docker 25 and later writes it. docker load and podman load read the
// manifest.json (the image of platform), ctr images import and kind load
// image-archive the index.json (every platform), crane push the manifest.json
// (or the layout directory, for the whole index). Entries are in name
// order with time mtime: the same layout gives the same bytes.
func WriteArchive(file, dir string, idx v1.ImageIndex, platform string, tags []string, mtime time.Time) error {
	want, err := parsePlatform(platform)
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var img v1.Image
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == want.OS && d.Platform.Architecture == want.Architecture {
			if img, err = idx.Image(d.Digest); err != nil {
				return err
			}
		}
	}
	if img == nil {
		return fmt.Errorf("archive: the index has no image for %s", platform)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	dm := dockerManifest{Config: blobPath(cfg), RepoTags: tags}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		dm.Layers = append(dm.Layers, blobPath(d))
	}
	manifest, err := json.Marshal([]dockerManifest{dm})
	if err != nil {
		return err
	}

	var names []string
	if err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return err
	}); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	names = append(names, "manifest.json")
	sort.Strings(names)

	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, n := range names {
		if err := addEntry(tw, dir, n, manifest, mtime); err != nil {
			return fmt.Errorf("archive %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return f.Close()
}

func addEntry(tw *tar.Writer, dir, name string, manifest []byte, mtime time.Time) error {
	h := &tar.Header{Name: name, Mode: 0o644, ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if name == "manifest.json" {
		h.Size = int64(len(manifest))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(manifest)
		return err
	}
	p := filepath.Join(dir, filepath.FromSlash(name))
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() {
		h.Typeflag, h.Name, h.Mode = tar.TypeDir, name+"/", 0o755
		return tw.WriteHeader(h)
	}
	h.Size = st.Size()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	r, err := os.Open(p)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(tw, r)
	return err
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
