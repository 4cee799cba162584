package localnode

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestChooseRuntime: what runs the containers of loaded images, from what
// was asked for and what is installed.
func TestChooseRuntime(t *testing.T) {
	installed := func(name string) (string, error) {
		switch name {
		case "runc":
			return "/usr/sbin/runc", nil
		case "/opt/runc":
			return "/opt/runc", nil
		}
		return "", exec.ErrNotFound
	}
	missing := func(string) (string, error) { return "", exec.ErrNotFound }
	tests := map[string]struct {
		asked    string
		images   bool
		lookPath func(string) (string, error)
		want     runtimeChoice
		warns    bool
		wantErr  string
	}{
		"nothing asked, runc installed: runc": {
			images: true, lookPath: installed, want: runtimeChoice{name: "runc", path: "/usr/sbin/runc"},
		},
		"nothing asked, no runc, images possible: the init, with a warning": {
			images: true, lookPath: missing, want: runtimeChoice{name: "init"}, warns: true,
		},
		"nothing asked, no runc, no images possible: the init, silently": {
			images: false, lookPath: missing, want: runtimeChoice{name: "init"},
		},
		"init asked: the init even with runc installed": {
			asked: "init", images: true, lookPath: installed, want: runtimeChoice{name: "init"},
		},
		"runc asked and installed": {
			asked: "runc", images: true, lookPath: installed, want: runtimeChoice{name: "runc", path: "/usr/sbin/runc"},
		},
		"a runc binary asked by path": {
			asked: "/opt/runc", images: true, lookPath: installed, want: runtimeChoice{name: "/opt/runc", path: "/opt/runc"},
		},
		"runc asked, not installed: an error naming the fix, no fallback": {
			asked: "runc", images: true, lookPath: missing, wantErr: "apt-get install runc",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := chooseRuntime(tc.asked, tc.images, tc.lookPath)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, exec.ErrNotFound) {
					t.Fatalf("err %v, want one that says %q and wraps the lookup's", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got.warning != "") != tc.warns {
				t.Errorf("warning %q, want one: %v", got.warning, tc.warns)
			}
			got.warning = ""
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestValidateRuntimeFlag: --runtime takes runc, init or nothing; anything
// else is refused by a message that names the flag and the values.
func TestValidateRuntimeFlag(t *testing.T) {
	for _, v := range []string{"", "runc", "init"} {
		if err := ValidateRuntimeFlag(v); err != nil {
			t.Errorf("%q: %v", v, err)
		}
	}
	for _, v := range []string{"crun", "RUNC", "/usr/sbin/runc"} {
		err := ValidateRuntimeFlag(v)
		if err == nil || !strings.Contains(err.Error(), "--runtime must be runc or init") || !strings.Contains(err.Error(), v) {
			t.Errorf("%q: %v, want an error naming --runtime, runc, init and the value", v, err)
		}
	}
}

func TestRuntimeVersion(t *testing.T) {
	tests := []struct {
		name, runtime, out, want string
	}{
		{"Debian's runc", RuntimeRunc, "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n", "runc://1.1.5+ds1"},
		{"a release build", RuntimeRunc, "runc version 1.2.4\ncommit: v1.2.4-0-g6c52b3fc\n", "runc://1.2.4"},
		{"no output (runc --version failed)", RuntimeRunc, "", "runc://unknown"},
		{"something else on PATH", RuntimeRunc, "crun version 1.19\n", "runc://unknown"},
		{"the node's init", RuntimeInit, "v0.4.1", "kubetask-init://v0.4.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := runtimeVersion(tc.runtime, tc.out); got != tc.want {
				t.Errorf("runtimeVersion(%q, %q) = %q, want %q", tc.runtime, tc.out, got, tc.want)
			}
		})
	}
}
