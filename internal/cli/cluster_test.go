package cli

import (
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/imagestore/imagetest"
)

// TestClusterLoadImage: load-image refuses a directory without a cluster, loads
// a docker-compatible tar into the cluster's store (then found by name), says so
// when the image was there already, and names the archive it cannot read.
func TestClusterLoadImage(t *testing.T) {
	isolate(t)
	state := t.TempDir()
	archive := filepath.Join(t.TempDir(), "app.tar")
	img := imagetest.Image(t, v1.Config{Cmd: []string{"/app"}}, imagetest.Layer(t, map[string]imagetest.Entry{"app": {Body: []byte("x"), Mode: 0o755}}))
	imagetest.WriteTar(t, archive, "example.test/app:v1", img)
	id, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}

	kubetask(t, "", "cluster", "load-image", "--state-dir", state, archive).expect(t, 1, "", "no local cluster in "+state, "kubetask cluster up")
	if err := os.Mkdir(filepath.Join(state, "images"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := kubetask(t, "", "cluster", "load-image", "--state-dir", state, archive)
	r.expect(t, 0, "*")
	if want := "loaded image " + id.String() + " (unpacked in "; len(r.stdout.String()) < len(want) || r.stdout.String()[:len(want)] != want {
		t.Errorf("stdout %q, want it to start with %q", r.stdout.String(), want)
	}
	if got, err := imagestore.New(filepath.Join(state, "images")).Lookup("example.test/app:v1"); err != nil || got == nil || got.ID != id.String() {
		t.Errorf("Lookup after load-image = %+v, %v", got, err)
	}
	kubetask(t, "", "cluster", "load-image", "--state-dir", state, archive).
		expect(t, 0, "loaded image "+id.String()+" (already in the store)\n  example.test/app:v1\n")
	kubetask(t, "", "cluster", "load-image", "--state-dir", state, filepath.Join(state, "missing.tar")).expect(t, 1, "", "missing.tar")
}
