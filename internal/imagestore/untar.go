package imagestore

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
)

// Untar writes the entries of a flattened image file system (mutate.Extract: no
// whiteouts left, each path once) under root, with their modes, owners and
// modification times. Every path is resolved inside root (securejoin), so an
// entry behind a symbolic link, or a link pointing out, can never write outside
// it. Parents missing when an entry comes are created 0755 (a flattened stream
// may give a directory after its content); hard links are made last, when their
// targets exist. Character and block devices are skipped.
func Untar(r io.Reader, root string) error {
	tr := tar.NewReader(r)
	type link struct{ path, target string }
	var links []link
	var dirs []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		rel := filepath.Clean("/" + h.Name)
		if rel == "/" {
			dirs = append(dirs, h)
			continue
		}
		parent, err := securejoin.SecureJoin(root, filepath.Dir(rel))
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		path := filepath.Join(parent, filepath.Base(rel))
		if _, err := os.Lstat(path); err == nil && h.Typeflag != tar.TypeDir {
			continue // a flattened stream gives each path once, the top layer's first
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
			dirs = append(dirs, h) // modes and times last: writing into it changes them
			continue
		case tar.TypeReg:
			f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
			_, err = io.Copy(f, tr) //nolint:gosec // image layers are trusted input loaded by the user
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, path); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeLink:
			links = append(links, link{path: path, target: h.Linkname})
			continue
		case tar.TypeFifo:
			if err := unix.Mkfifo(path, 0o600); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeChar, tar.TypeBlock:
			// Not made: without a device cgroup a node of the image could reach the
			// host's devices. Containers get /dev on tmpfs with the usual few.
			continue
		default:
			continue // xattrs-only and other entries carry no file
		}
		if err := setAttrs(path, h); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	for _, l := range links {
		target, err := securejoin.SecureJoin(root, filepath.Clean("/"+l.target))
		if err != nil {
			return fmt.Errorf("hard link %s: %w", l.target, err)
		}
		_ = os.Remove(l.path)
		if err := os.Link(target, l.path); err != nil {
			return fmt.Errorf("hard link %s to %s: %w", strings.TrimPrefix(l.path, root), l.target, err)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		h := dirs[i]
		path, err := securejoin.SecureJoin(root, filepath.Clean("/"+h.Name))
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		if err := setAttrs(path, h); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	return nil
}

// setAttrs gives path the entry's owner, mode (after the owner: chown clears
// set-user-ID bits) and modification time; symbolic links only their owner.
func setAttrs(path string, h *tar.Header) error {
	if os.Geteuid() == 0 {
		if err := os.Lchown(path, h.Uid, h.Gid); err != nil {
			return err
		}
	}
	if h.Typeflag == tar.TypeSymlink {
		return nil
	}
	if err := os.Chmod(path, h.FileInfo().Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
		return err
	}
	return os.Chtimes(path, h.ModTime, h.ModTime)
}
