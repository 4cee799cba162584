package costs

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The bounds of the binary and of what it links (docs/costs.md says how to
// update them). Raised for tracing (issue 36): the OpenTelemetry SDK, which
// `kubetask serve` exports spans with, brings 29 packages and 7 modules
// (docs/costs.md, "The binary and what it links"). Measured at commit ce50b93 with go1.26.8 linux/amd64: the
// binary 93,396,099 bytes, ./cmd/kubetask 951 packages (229 of them the
// standard library's) from 93 modules besides kubetask's, ./pkg/executor
// 797 packages from 67.
const (
	// maxBinaryBytes is the size of bin/kubetask as `make build` builds it
	// (static, not stripped, its version stamped), 5 % above the measure.
	// A binary more than 10 % below it fails too: lower the bound, so that
	// what was won is kept.
	maxBinaryBytes = 98_000_000
	// maxPackages and maxModules bound what the kubetask binary links
	// (`go list -deps ./cmd/kubetask`, `go version -m`): every start of
	// it, `kubetask run`'s among them, pays for each package's
	// initialisation. A dependency bump moves the count by a few; a new
	// heavy dependency (cmd/kubetask's TestLinksNoHeavyPackages names the
	// ones kept out so far) by dozens to hundreds.
	maxPackages = 1000
	maxModules  = 102
	// maxExecutorPackages and maxExecutorModules bound what an embedding
	// of pkg/executor (and pkg/runner, `kubetask run`'s library) links.
	maxExecutorPackages = 815
	maxExecutorModules  = 69
)

// moduleRoot is the directory of kubetask's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// TestBinarySize builds the kubetask binary with `make build` (the
// Makefile's flags exactly) into a temporary directory and bounds its size.
func TestBinarySize(t *testing.T) {
	dir := t.TempDir()
	build := exec.Command("make", "-s", "-C", moduleRoot(t), "build", "BIN="+dir)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "kubetask")
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	t.Logf("kubetask binary: %d bytes (bound %d, %.1f%% of it)", size, maxBinaryBytes, 100*float64(size)/maxBinaryBytes)
	switch {
	case size > maxBinaryBytes:
		t.Errorf("the kubetask binary is %d bytes, more than its bound of %d: what made it grow? (docs/costs.md)", size, maxBinaryBytes)
	case size < maxBinaryBytes*9/10:
		t.Errorf("the kubetask binary is %d bytes, more than 10%% below its bound of %d: lower maxBinaryBytes to about %d (size + 5%%) and the figure in docs/costs.md", size, maxBinaryBytes, size*105/100)
	}
	modules := 0
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == "dep" {
			modules++
		}
	}
	t.Logf("kubetask binary: %d modules besides kubetask (bound %d)", modules, maxModules)
	if modules > maxModules {
		t.Errorf("the kubetask binary links %d modules besides kubetask, more than %d: which one is new, and is it worth it? (go version -m; docs/costs.md)", modules, maxModules)
	}
}

// TestLinkedPackages bounds the packages that the kubetask command and an
// embedding of the executor link.
func TestLinkedPackages(t *testing.T) {
	for _, c := range []struct {
		pkg         string
		maxPackages int
		maxModules  int // 0: bounded by TestBinarySize, from the binary
	}{
		{"./cmd/kubetask", maxPackages, 0},
		{"./pkg/executor", maxExecutorPackages, maxExecutorModules},
	} {
		cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", c.pkg)
		cmd.Dir = moduleRoot(t)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", c.pkg, err)
		}
		packages, modules := 0, map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			packages++
			if f := strings.Fields(line); len(f) == 2 && f[1] != "github.com/kubetask/kubetask" {
				modules[f[1]] = true
			}
		}
		t.Logf("%s links %d packages from %d modules besides kubetask", c.pkg, packages, len(modules))
		if packages > c.maxPackages {
			t.Errorf("%s links %d packages, more than its bound of %d: what brought them? (go list -deps; docs/costs.md)", c.pkg, packages, c.maxPackages)
		}
		if c.maxModules > 0 && len(modules) > c.maxModules {
			t.Errorf("%s links packages of %d modules besides kubetask, more than %d (docs/costs.md)", c.pkg, len(modules), c.maxModules)
		}
	}
}
