package imagestore_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
)

func TestKey(t *testing.T) {
	hex := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for in, want := range map[string]string{
		"busybox":                     "docker.io/library/busybox:latest",
		"busybox:1.37":                "docker.io/library/busybox:1.37",
		"ghcr.io/kubetask/kubetask":   "ghcr.io/kubetask/kubetask:latest",
		"localhost:5000/x:dev":        "localhost:5000/x:dev",
		"ghcr.io/x/y:1@sha256:" + hex: "sha256:" + hex,
		"sha256:" + hex:               "sha256:" + hex,
		hex:                           "sha256:" + hex,
	} {
		got, err := imagestore.Key(in)
		if err != nil || got != want {
			t.Errorf("Key(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := imagestore.Key("Busybox"); err == nil {
		t.Error("Key accepted an invalid name")
	}
}

// layered is an image of two layers: the upper one deletes a file of the lower
// (a whiteout), replaces another, and adds a symbolic link, a hard link and a
// set-user-ID file.
func layered(t *testing.T) v1.Image {
	lower := imagetest.Layer(t, map[string]imagetest.Entry{
		"etc/":         {},
		"etc/gone":     {Body: []byte("deleted above")},
		"etc/replaced": {Body: []byte("old")},
		"usr/bin/tool": {Body: []byte("#!/bin/sh\n"), Mode: 0o755},
		"data/owned":   {Body: []byte("x"), UID: 1234},
		"escape":       {Type: tar.TypeSymlink, Link: "/.."},
	})
	upper := imagetest.Layer(t, map[string]imagetest.Entry{
		"etc/.wh.gone": {},
		"etc/replaced": {Body: []byte("new")},
		"bin":          {Type: tar.TypeSymlink, Link: "usr/bin"},
		"usr/bin/hard": {Type: tar.TypeLink, Link: "usr/bin/tool"},
		"usr/bin/suid": {Body: []byte("s"), Mode: 0o4755},
	})
	return imagetest.Image(t, v1.Config{Entrypoint: []string{"/bin/tool"}, Env: []string{"A=1"}, WorkingDir: "/data", User: "1234:5"}, lower, upper)
}

func TestLoadDockerTar(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "img.tar")
	img := layered(t)
	imagetest.WriteTar(t, archive, "example.test/team/app:v1", img)
	s := imagestore.New(filepath.Join(dir, "store"))
	loaded, err := s.Load(context.Background(), archive)
	if err != nil {
		t.Fatal(err)
	}
	cfgName, _ := img.ConfigName()
	want := []imagestore.Loaded{{ID: cfgName.String(), Keys: []string{cfgName.String(), "example.test/team/app:v1"}, Unpacked: true}}
	if diff := cmp.Diff(want, loaded); diff != "" {
		t.Fatalf("Load (-want +got):\n%s", diff)
	}
	for _, name := range []string{"example.test/team/app:v1", "example.test/team/app@" + cfgName.String(), cfgName.String(), cfgName.Hex} {
		got, err := s.Lookup(name)
		if err != nil || got == nil {
			t.Fatalf("Lookup(%q) = %v, %v", name, got, err)
		}
		if got.ID != cfgName.String() || got.Config.WorkingDir != "/data" || got.Config.User != "1234:5" || !cmp.Equal(got.Config.Entrypoint, []string{"/bin/tool"}) {
			t.Errorf("Lookup(%q) = %+v", name, got)
		}
	}
	for _, name := range []string{"example.test/team/app:v2", "example.test/team/app", "busybox", "Not-Valid"} {
		if got, err := s.Lookup(name); got != nil || err != nil {
			t.Errorf("Lookup(%q) = %v, %v; want nothing", name, got, err)
		}
	}

	root := filepath.Join(s.Dir(), "images", cfgName.Hex, "rootfs")
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	if got := read("etc/replaced"); got != "new" {
		t.Errorf("etc/replaced = %q, want the upper layer's", got)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gone")); !os.IsNotExist(err) {
		t.Errorf("etc/gone, whited out above, exists: %v", err)
	}
	if got := read("bin/hard"); got != "#!/bin/sh\n" {
		t.Errorf("bin/hard through the symbolic link = %q", got)
	}
	if a, b := stat(t, filepath.Join(root, "usr/bin/hard")), stat(t, filepath.Join(root, "usr/bin/tool")); !os.SameFile(a, b) {
		t.Error("usr/bin/hard is not a hard link of usr/bin/tool")
	}
	if m := stat(t, filepath.Join(root, "usr/bin/suid")).Mode(); m&os.ModeSetuid == 0 || m.Perm() != 0o755 {
		t.Errorf("usr/bin/suid mode = %v", m)
	}
	if os.Geteuid() == 0 {
		if uid := uidOf(stat(t, filepath.Join(root, "data/owned"))); uid != 1234 {
			t.Errorf("data/owned uid = %d, want 1234", uid)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "images", cfgName.Hex, "outside")); !os.IsNotExist(err) {
		t.Errorf("a file escaped the root: %v", err)
	}

	again, err := s.Load(context.Background(), archive)
	if err != nil || len(again) != 1 || again[0].Unpacked {
		t.Errorf("second Load = %+v, %v; want the image found, not unpacked again", again, err)
	}
}

func TestLoadOCILayout(t *testing.T) {
	dir := t.TempDir()
	img := imagetest.Image(t, v1.Config{Cmd: []string{"hello"}}, imagetest.Layer(t, map[string]imagetest.Entry{"hello": {Body: []byte("hi")}}))
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": "v2", "io.containerd.image.name": "example.test/app:v2",
	})); err != nil {
		t.Fatal(err)
	}
	s := imagestore.New(filepath.Join(dir, "store"))
	if _, err := s.Load(context.Background(), filepath.Join(dir, "layout")); err != nil {
		t.Fatal(err)
	}
	manifest, _ := img.Digest()
	for _, name := range []string{"example.test/app:v2", "example.test/app@" + manifest.String()} {
		got, err := s.Lookup(name)
		if err != nil || got == nil || !cmp.Equal(got.Config.Cmd, []string{"hello"}) {
			t.Errorf("Lookup(%q) = %+v, %v", name, got, err)
		}
	}
}

func TestLoadRejectsWhatIsNoImage(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.tar")
	if err := os.WriteFile(junk, []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := imagestore.New(filepath.Join(dir, "store"))
	for _, p := range []string{junk, filepath.Join(dir, "missing.tar"), dir} {
		if _, err := s.Load(context.Background(), p); err == nil {
			t.Errorf("Load(%s) succeeded", p)
		}
	}
}

func stat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestUntarStaysInside writes entries behind links that point out of the root,
// relative and absolute: they land inside it. Device nodes are not made.
func TestUntarStaysInside(t *testing.T) {
	dir := t.TempDir()
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../outside"},
		{Name: "abs", Typeflag: tar.TypeSymlink, Linkname: outside},
		{Name: "up/a", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "abs/b", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "../c", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666},
		{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o600},
		{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../../../etc/hostname"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	err := imagestore.Untar(&buf, root)
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("entries escaped the root into %s: %v", outside, ents)
	}
	if _, serr := os.Stat(filepath.Join(dir, "c")); serr == nil {
		t.Error("../c was written outside the root")
	}
	if _, serr := os.Lstat(filepath.Join(root, "null")); serr == nil {
		t.Error("a device node was made")
	}
	if st, serr := os.Lstat(filepath.Join(root, "fifo")); serr != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v, %v", st, serr)
	}
	// The hard link's target resolves inside the root, where it does not exist.
	if err == nil {
		t.Error("a hard link to a file outside the root was made")
	}
}
