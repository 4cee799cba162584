// Command modproxy writes a Go module proxy, as files (GOPROXY=file://DIR),
// that serves one version of kubetask's module: the commit HEAD of the
// checkout, as the module zip `go get` would download from a published
// tag. test/importcheck/check.sh uses it so that a module outside kubetask
// gets the library with a plain `go get`, no replace directive.
//
//	go run ./internal/modproxy -repo . -out DIR    # prints the version it serves
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

const modulePath = "github.com/kubetask/kubetask"

func main() {
	repo := flag.String("repo", ".", "the kubetask checkout (a git worktree)")
	out := flag.String("out", "", "the proxy directory to write")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "modproxy: -out is required")
		os.Exit(2)
	}
	v, err := write(*repo, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
	fmt.Println(v)
}

// write writes the proxy files of HEAD of repo to out and returns the
// pseudo-version they serve (v0.0.0-<commit time>-<12 hex digits>).
func write(repo, out string) (string, error) {
	root, err := filepath.Abs(repo)
	if err != nil {
		return "", err
	}
	show, err := exec.Command("git", "-C", root, "show", "-s", "--format=%H %ct", "HEAD").Output()
	if err != nil {
		return "", fmt.Errorf("reading HEAD of %s: %w", root, err)
	}
	hash, secs, _ := strings.Cut(strings.TrimSpace(string(show)), " ")
	var unix int64
	if _, err := fmt.Sscan(secs, &unix); err != nil || len(hash) < 12 {
		return "", fmt.Errorf("reading HEAD of %s: %q", root, show)
	}
	when := time.Unix(unix, 0).UTC()
	version := module.PseudoVersion("v0", "", when, hash[:12])
	dir := filepath.Join(out, modulePath, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var z bytes.Buffer
	if err := zip.CreateFromVCS(&z, module.Version{Path: modulePath, Version: version}, root, "HEAD", ""); err != nil {
		return "", fmt.Errorf("zipping HEAD of %s: %w", root, err)
	}
	mod, err := exec.Command("git", "-C", root, "show", "HEAD:go.mod").Output()
	if err != nil {
		return "", fmt.Errorf("reading go.mod at HEAD: %w", err)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, when})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  mod,
		version + ".zip":  z.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil { //nolint:gosec // a proxy's files, read by go
			return "", err
		}
	}
	return version, nil
}
