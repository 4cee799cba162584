package version

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/pkg/api"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, at, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/kubetask/kubetask", Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: at}, {Key: "vcs.modified", Value: modified},
		}}
	}
	for name, tc := range map[string]struct {
		stamp stamp
		bi    *debug.BuildInfo
		want  api.Version
	}{
		"stamped by make: the stamp wins over the recorded vcs settings": {
			stamp: stamp{"v0.4.1", "abc", "2026-12-03T11:00:00Z"},
			bi:    vcs("def", "2026-01-01T00:00:00Z", "true"),
			want:  api.Version{Version: "v0.4.1", Commit: "abc", Date: "2026-12-03T11:00:00Z"},
		},
		"go build in a clean work tree: commit and date from the vcs settings": {
			bi:   vcs("def", "2026-01-01T00:00:00Z", "false"),
			want: api.Version{Version: Unknown, Commit: "def", Date: "2026-01-01T00:00:00Z"},
		},
		"go build in a modified work tree: the commit says dirty": {
			bi:   vcs("def", "2026-01-01T00:00:00Z", "true"),
			want: api.Version{Version: Unknown, Commit: "def-dirty", Date: "2026-01-01T00:00:00Z"},
		},
		"go install of a module version": {
			bi:   &debug.BuildInfo{Main: debug.Module{Path: "github.com/kubetask/kubetask", Version: "v0.4.1"}},
			want: api.Version{Version: "v0.4.1"},
		},
		"only the version stamped: the rest from the vcs settings": {
			stamp: stamp{version: "v0.5.0"},
			bi:    vcs("def", "2026-01-01T00:00:00Z", "false"),
			want:  api.Version{Version: "v0.5.0", Commit: "def", Date: "2026-01-01T00:00:00Z"},
		},
		"no build info at all": {
			want: api.Version{Version: Unknown},
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc.want.GoVersion, tc.want.Platform = "go1.26.8", "linux/arm64"
			got := resolve(tc.stamp, tc.bi, "go1.26.8", "linux/arm64")
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("resolve (-want +got):\n%s", d)
			}
		})
	}
}

func TestGetIsAValidSemver(t *testing.T) {
	// A test binary is neither stamped nor a module version: Get falls back
	// to Unknown, which must compare like any version.
	v := Get()
	if v.Version != Unknown {
		t.Errorf("Get().Version = %q, want %q in an unstamped test binary", v.Version, Unknown)
	}
	if Skew(v.Version, "v0.0.1") != "" {
		t.Errorf("Skew(%q, v0.0.1) warns; a development build compares as v0.0", v.Version)
	}
	if v.GoVersion == "" || !strings.Contains(v.Platform, "/") {
		t.Errorf("Get() = %+v, want the Go version and the platform", v)
	}
}

func TestSkew(t *testing.T) {
	for _, tc := range []struct {
		client, server string
		warn           string // a substring of the warning, "" for none
	}{
		{"v0.4.1", "v0.4.1", ""},
		{"v0.4.1", "v0.4.7", ""},
		{"v0.4.1", "v0.4.0-rc.1", ""},
		{"v0.4.1", "", ""},
		{"v0.0.0-dev", "v0.0.0-20261203110000-abcdef123456", ""},
		{"v0.4.1", "v0.5.0", "differ in minor version: use a client of the server's minor version, v0.5"},
		{"v0.5.0", "v0.4.1", "differ in minor version"},
		{"v1.4.1", "v0.4.1", "differ in minor version"},
		{"v0.4.1", "latest", "not semantic versions"},
		{"custom", "v0.4.1", "not semantic versions"},
	} {
		got := Skew(tc.client, tc.server)
		if (tc.warn == "") != (got == "") || !strings.Contains(got, tc.warn) {
			t.Errorf("Skew(%q, %q) = %q, want a warning containing %q", tc.client, tc.server, got, tc.warn)
		}
	}
}

func TestString(t *testing.T) {
	got := String(api.Version{Version: "v0.4.1", Commit: "abc", Date: "2026-12-03T11:00:00Z", GoVersion: "go1.26.8", Platform: "linux/amd64"})
	want := "kubetask v0.4.1, commit abc, built 2026-12-03T11:00:00Z, go1.26.8 linux/amd64"
	if got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// TestStampedBuild builds a program with the -ldflags -X that make build,
// make image and make release pass (the variable names are the contract) and
// checks that Get reports them.
func TestStampedBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	const pkg = "github.com/kubetask/kubetask/internal/version"
	ldflags := "-X " + pkg + ".version=v1.2.3 -X " + pkg + ".commit=0123456789abcdef -X " + pkg + ".date=2026-12-03T11:00:00Z"
	build := exec.Command("go", "build", "-o", bin, "-ldflags", ldflags, "./testdata/printversion")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("printversion: %v", err)
	}
	var got api.Version
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("printversion: %v in %s", err, out)
	}
	want := api.Version{Version: "v1.2.3", Commit: "0123456789abcdef", Date: "2026-12-03T11:00:00Z", GoVersion: got.GoVersion, Platform: got.Platform}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("stamped build (-want +got):\n%s", d)
	}
}
