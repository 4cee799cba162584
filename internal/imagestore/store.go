package imagestore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/distribution/reference"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Store is a directory of loaded images. Its methods are safe for concurrent use
// by several processes (a node reading while the CLI loads).
type Store struct {
	dir string
}

// New returns the store in dir (created on the first Load).
func New(dir string) *Store { return &Store{dir: dir} }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Image is a loaded image.
type Image struct {
	// ID is the digest of the image's config ("sha256:..."), as `docker images` shows it.
	ID string
	// Rootfs is the directory of the unpacked root file system. Never write to it:
	// containers run on an overlay of it.
	Rootfs string
	// Config is the image's runtime configuration (entrypoint, cmd, env, ...).
	Config v1.Config
}

type refRecord struct {
	Key string `json:"key"`
	ID  string `json:"id"`
}

var (
	digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	hexRE    = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// Key is how image is looked up: "sha256:<hex>" for a reference with a digest
// (the name is ignored, as a runtime matches digests) or a bare ID, otherwise the
// normalised tagged name ("docker.io/library/busybox:latest").
func Key(image string) (string, error) {
	if digestRE.MatchString(image) {
		return image, nil
	}
	if hexRE.MatchString(image) {
		return "sha256:" + image, nil
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", fmt.Errorf("image name %q: %w", image, err)
	}
	if d, ok := named.(reference.Digested); ok {
		return d.Digest().String(), nil
	}
	return reference.TagNameOnly(named).String(), nil
}

func (s *Store) refFile(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.dir, "refs", hex.EncodeToString(sum[:])+".json")
}

func (s *Store) imageDir(id string) string {
	return filepath.Join(s.dir, "images", strings.TrimPrefix(id, "sha256:"))
}

// Lookup returns the loaded image that image names, or nil (and no error) when
// no such image was loaded.
func (s *Store) Lookup(image string) (*Image, error) {
	key, err := Key(image)
	if err != nil {
		return nil, nil //nolint:nilerr // an unparsable name is never loaded
	}
	b, err := os.ReadFile(s.refFile(key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var rec refRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Key != key || !digestRE.MatchString(rec.ID) {
		return nil, fmt.Errorf("image store: corrupt record %s for %s", s.refFile(key), key)
	}
	dir := s.imageDir(rec.ID)
	cb, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("image store: image %s of %s: %w", rec.ID, key, err)
	}
	var cf v1.ConfigFile
	if err := json.Unmarshal(cb, &cf); err != nil {
		return nil, fmt.Errorf("image store: config of %s: %w", rec.ID, err)
	}
	return &Image{ID: rec.ID, Rootfs: filepath.Join(dir, "rootfs"), Config: cf.Config}, nil
}

// tag points key at the image id (atomically replacing an earlier record).
func (s *Store) tag(key, id string) error {
	b, err := json.Marshal(refRecord{Key: key, ID: id})
	if err != nil {
		return err
	}
	f := s.refFile(key)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(f), ".ref-")
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	_, werr := tmp.Write(b)
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), f)
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("image store: record %s: %w", key, werr)
	}
	return nil
}
