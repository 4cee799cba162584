package components

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

func testBuilder(t *testing.T) *Builder {
	t.Helper()
	tools, err := filepath.Abs("testdata/tools")
	if err != nil {
		t.Fatal(err)
	}
	return &Builder{CacheDir: t.TempDir(), ToolsDir: tools}
}

var hello = Component{Name: "hello", Version: "v1.2.3", Module: "hello", Package: ".", LDFlags: "-X main.version=v1.2.3"}

func TestEnsureBuildsOnceAndReuses(t *testing.T) {
	b := testBuilder(t)
	var progress bytes.Buffer
	b.Progress = &progress
	ctx := context.Background()
	path, err := b.Ensure(ctx, hello)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if want := filepath.Join(b.CacheDir, "bin", "hello", "v1.2.3", "hello"); path != want {
		t.Errorf("path = %s, want %s", path, want)
	}
	out, err := exec.Command(path).Output()
	if err != nil || strings.TrimSpace(string(out)) != "hello v1.2.3" {
		t.Fatalf("built binary printed %q, %v; want the version stamped by ldflags", out, err)
	}
	if !strings.Contains(progress.String(), "building hello v1.2.3") {
		t.Errorf("no progress line: %q", progress.String())
	}

	// A second Ensure must not run go at all: point it at a go that does not exist.
	b.GoBin = "/nonexistent/go"
	again, err := b.Ensure(ctx, hello)
	if err != nil || again != path {
		t.Fatalf("second Ensure = %s, %v; want the cached %s", again, err, path)
	}
}

func TestEnsureNamesMissingToolchain(t *testing.T) {
	b := testBuilder(t)
	b.GoBin = "/nonexistent/go"
	_, err := b.Ensure(context.Background(), hello)
	if !errors.Is(err, ErrToolchain) {
		t.Fatalf("err = %v, want ErrToolchain", err)
	}
	for _, want := range []string{"hello v1.2.3", "/nonexistent/go", "install Go", EnvGo} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if b.Built(hello) {
		t.Error("a failed build left a binary in the cache")
	}
}

func TestEnsureNamesUnreachableProxy(t *testing.T) {
	b := testBuilder(t)
	// A proxy on a closed loopback port and an empty module cache: the download must fail.
	b.Env = []string{"GOPROXY=http://127.0.0.1:1", "GOMODCACHE=" + t.TempDir(), "GOFLAGS=-mod=mod", "GONOSUMDB=*", "GONOSUMCHECK=1", "GOSUMDB=off"}
	c := Component{Name: "needsdep", Version: "v0.0.1", Module: "needsdep", Package: "."}
	_, err := b.Ensure(context.Background(), c)
	if !errors.Is(err, ErrModuleProxy) {
		t.Fatalf("err = %v, want ErrModuleProxy", err)
	}
	if !strings.Contains(err.Error(), "module proxy") {
		t.Errorf("error %q does not name the module proxy", err)
	}
	t.Cleanup(func() { _ = exec.Command("chmod", "-R", "u+w", b.CacheDir).Run() })
}

func TestFindToolsDirFromCheckout(t *testing.T) {
	t.Setenv(EnvToolsDir, "")
	dir, err := FindToolsDir()
	if err != nil {
		t.Fatalf("FindToolsDir from inside the repository: %v", err)
	}
	if !isToolsDir(dir) {
		t.Errorf("%s is not the tools directory", dir)
	}
	t.Setenv(EnvToolsDir, t.TempDir())
	if _, err := FindToolsDir(); err == nil || !strings.Contains(err.Error(), EnvToolsDir) {
		t.Errorf("a wrong %s gave %v, want an error naming it", EnvToolsDir, err)
	}
}

// TestToolsModulesMatchPins keeps tools/*/go.mod in step with versions.go.
func TestToolsModulesMatchPins(t *testing.T) {
	t.Setenv(EnvToolsDir, "")
	tools, err := FindToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"kube":   {"k8s.io/kubernetes": KubernetesVersion},
		"etcd":   {"go.etcd.io/etcd/server/v3": EtcdVersion},
		"kwok":   {"sigs.k8s.io/kwok": KwokVersion},
		"jaeger": {"github.com/jaegertracing/jaeger": JaegerVersion},
	}
	for module, reqs := range want {
		path := filepath.Join(tools, module, "go.mod")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.Parse(path, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, r := range f.Require {
			got[r.Mod.Path] = r.Mod.Version
		}
		for mod, v := range reqs {
			if got[mod] != v {
				t.Errorf("%s requires %s %s, versions.go pins %s", path, mod, got[mod], v)
			}
		}
	}
	for _, c := range All() {
		if _, err := os.Stat(filepath.Join(tools, c.Module, "go.mod")); err != nil {
			t.Errorf("component %s: %v", c.Name, err)
		}
	}
}
