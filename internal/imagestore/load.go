package imagestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Loaded is one image a Load put into the store.
type Loaded struct {
	// ID is the image's config digest.
	ID string
	// Keys are the names and digests it can be looked up by.
	Keys []string
	// Unpacked is false when the store already held the image (only names were added).
	Unpacked bool
}

// Platform is the platform whose image Load takes from a multi-platform index:
// the node's own.
var Platform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// Load puts the images of the archive at path into the store: a docker-compatible
// tar (its manifest.json: every image, named by its RepoTags) or an OCI image
// layout directory (every image of its index.json, named by the annotations
// io.containerd.image.name or org.opencontainers.image.ref.name; of a
// multi-platform index, the image of Platform).
func (s *Store) Load(ctx context.Context, path string) ([]Loaded, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("image archive: %w", err)
	}
	var found []namedImage
	if st.IsDir() {
		found, err = fromLayout(path)
	} else {
		found, err = fromTarball(path)
	}
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("image archive %s holds no image", path)
	}
	var out []Loaded
	for _, f := range found {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		l, err := s.put(f)
		if err != nil {
			return out, err
		}
		out = append(out, l)
	}
	return out, nil
}

type namedImage struct {
	img v1.Image
	// keys besides the config digest: names and manifest/index digests.
	keys []string
}

func fromTarball(path string) ([]namedImage, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("image archive %s: not a docker-compatible image tar (no readable manifest.json): %w", path, err)
	}
	var out []namedImage
	for i, d := range m {
		var tag *name.Tag
		if len(d.RepoTags) > 0 {
			t, err := name.NewTag(d.RepoTags[0])
			if err != nil {
				return nil, fmt.Errorf("image archive %s: RepoTags %q: %w", path, d.RepoTags[0], err)
			}
			tag = &t
		} else if len(m) > 1 {
			return nil, fmt.Errorf("image archive %s: image %d of manifest.json has no RepoTags, so it cannot be told apart", path, i)
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return nil, fmt.Errorf("image archive %s: %w", path, err)
		}
		ni := namedImage{img: img}
		for _, t := range d.RepoTags {
			k, err := Key(t)
			if err != nil {
				return nil, fmt.Errorf("image archive %s: %w", path, err)
			}
			ni.keys = append(ni.keys, k)
		}
		out = append(out, ni)
	}
	return out, nil
}

func fromLayout(dir string) ([]namedImage, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image archive %s: not an OCI image layout: %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("image archive %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image archive %s: %w", dir, err)
	}
	var out []namedImage
	for _, d := range im.Manifests {
		var ni namedImage
		for _, a := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
			if k, err := Key(d.Annotations[a]); err == nil && d.Annotations[a] != "" {
				ni.keys = append(ni.keys, k)
				break // the ref.name is often a bare tag: take the full name first
			}
		}
		ni.keys = append(ni.keys, d.Digest.String())
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("image archive %s: %w", dir, err)
			}
			cm, err := child.IndexManifest()
			if err != nil {
				return nil, fmt.Errorf("image archive %s: %w", dir, err)
			}
			for _, cd := range cm.Manifests {
				if cd.Platform != nil && cd.Platform.OS == Platform.OS && cd.Platform.Architecture == Platform.Architecture {
					if ni.img, err = child.Image(cd.Digest); err != nil {
						return nil, fmt.Errorf("image archive %s: %w", dir, err)
					}
					ni.keys = append(ni.keys, cd.Digest.String())
					break
				}
			}
			if ni.img == nil {
				return nil, fmt.Errorf("image archive %s: index %s has no image for %s/%s", dir, d.Digest, Platform.OS, Platform.Architecture)
			}
		case d.MediaType.IsImage():
			if ni.img, err = idx.Image(d.Digest); err != nil {
				return nil, fmt.Errorf("image archive %s: %w", dir, err)
			}
		default:
			continue
		}
		out = append(out, ni)
	}
	return out, nil
}

// put unpacks img unless the store has it, then records its keys.
func (s *Store) put(f namedImage) (Loaded, error) {
	cfgName, err := f.img.ConfigName()
	if err != nil {
		return Loaded{}, fmt.Errorf("image config: %w", err)
	}
	id := cfgName.String()
	l := Loaded{ID: id, Keys: append([]string{id}, f.keys...)}
	dir := s.imageDir(id)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); errors.Is(err, os.ErrNotExist) {
		if err := s.unpack(f.img, dir); err != nil {
			return Loaded{}, fmt.Errorf("unpack image %s: %w", id, err)
		}
		l.Unpacked = true
	} else if err != nil {
		return Loaded{}, fmt.Errorf("image store: %w", err)
	}
	for _, k := range l.Keys {
		if err := s.tag(k, id); err != nil {
			return Loaded{}, err
		}
	}
	return l, nil
}

func (s *Store) unpack(img v1.Image, dir string) error {
	raw, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	tmpRoot := filepath.Join(s.dir, "tmp")
	if err := os.MkdirAll(tmpRoot, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(tmpRoot, "unpack-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // gone already once renamed into place
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	rc := mutate.Extract(img)
	err = Untar(rc, rootfs)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), raw, 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "config.json")); serr == nil {
			return nil // another load put the same image in place first
		}
		return err
	}
	return nil
}
