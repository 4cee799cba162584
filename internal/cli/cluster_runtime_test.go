package cli

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

// TestUpFlagsValidate: the flags of `cluster up` and `cluster supervise`,
// --runtime among them, are checked before anything starts.
func TestUpFlagsValidate(t *testing.T) {
	tests := map[string]struct {
		flags   upFlags
		wantErr string
	}{
		"defaults":              {flags: upFlags{nodes: 1}},
		"runtime runc":          {flags: upFlags{nodes: 1, runtime: "runc"}},
		"runtime init":          {flags: upFlags{nodes: 1, runtime: "init"}},
		"runtime unknown":       {flags: upFlags{nodes: 1, runtime: "crun"}, wantErr: `--runtime must be runc or init, got "crun"`},
		"runtime as a path":     {flags: upFlags{nodes: 1, runtime: "/usr/sbin/runc"}, wantErr: "--runtime must be runc or init"},
		"negative nodes":        {flags: upFlags{nodes: -1}, wantErr: "--nodes"},
		"apiserver port beyond": {flags: upFlags{apiserverPort: 70000}, wantErr: "--apiserver-port"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.flags.validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestSuperviseArgsPassTheRuntime: `cluster up --runtime R` hands R to the
// supervisor (which hands it to each local node); without it the supervisor
// gets no --runtime, so the nodes' own default ($KUBETASK_NODE_RUNTIME, else
// runc when installed) decides.
func TestSuperviseArgsPassTheRuntime(t *testing.T) {
	got := superviseArgs("/bin/kubetask", "/state", &upFlags{nodes: 1, runtime: "init"})
	if i := slices.Index(got, "--runtime"); i < 0 || i+1 >= len(got) || got[i+1] != "init" {
		t.Errorf("args %q: want --runtime init", got)
	}
	got = superviseArgs("/bin/kubetask", "/state", &upFlags{nodes: 1})
	if slices.Contains(got, "--runtime") {
		t.Errorf("args %q: want no --runtime", got)
	}
}

// TestRuntimeFlagRefusedBeforeStart: the commands that start local nodes
// refuse a --runtime other than runc or init, naming the flag and values,
// before they build or start anything.
func TestRuntimeFlagRefusedBeforeStart(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"cluster", "up", "--state-dir", dir, "--runtime", "crun"},
		{"cluster", "supervise", "--state-dir", dir, "--runtime", "crun"},
		{"node", "run", "--kubeconfig", dir + "/kubeconfig", "--name", "n", "--dir", dir, "--runtime", "crun"},
	} {
		var out, errOut bytes.Buffer
		code := Execute(context.Background(), args, &out, &errOut)
		if code == 0 || !strings.Contains(errOut.String(), `--runtime must be runc or init, got "crun"`) {
			t.Errorf("%q: exit %d, stderr %q: want the --runtime error", args, code, errOut.String())
		}
	}
}

// TestUpOnAClusterThatIsUpNamesTheFlagsItIgnored: `cluster up --runtime
// init` on a cluster that is already up changes nothing, and says so,
// naming the flags and what to do instead; with no such flag it says
// nothing more.
func TestUpOnAClusterThatIsUpNamesTheFlagsItIgnored(t *testing.T) {
	var out bytes.Buffer
	(&upFlags{given: []string{"--runtime", "--nodes"}}).noteIgnored(&out)
	for _, want := range []string{"--runtime, --nodes", "changed nothing", "kubetask cluster down"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("note %q, want it to say %q", out.String(), want)
		}
	}
	out.Reset()
	(&upFlags{}).noteIgnored(&out)
	if out.Len() != 0 {
		t.Errorf("note %q with no flag given, want none", out.String())
	}
}
