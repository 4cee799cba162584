// Package version says which build of kubetask is running: the version,
// commit and build date stamped at build time with
//
//	go build -ldflags "-X github.com/kubetask/kubetask/internal/version.version=v0.4.1
//	  -X github.com/kubetask/kubetask/internal/version.commit=<sha>
//	  -X github.com/kubetask/kubetask/internal/version.date=<RFC 3339>"
//
// (make build, make image and make release do), and, for a binary built
// without them (go build, go install), what the Go toolchain recorded in it:
// the module version of `go install ...@v0.4.1` and the vcs.revision,
// vcs.time and vcs.modified settings of a build in a git work tree.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"golang.org/x/mod/semver"

	"github.com/kubetask/kubetask/pkg/api"
)

// Stamped at build time with -ldflags -X (see the package comment); empty
// when not.
var (
	version string
	commit  string
	date    string
)

// Unknown is the version of a build that was neither stamped nor built from
// a module version: a valid semantic version, lower than every release.
const Unknown = "v0.0.0-dev"

// Get returns the running binary's version.
func Get() api.Version {
	bi, _ := debug.ReadBuildInfo()
	return resolve(stamp{version: version, commit: commit, date: date}, bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
}

// stamp is what -ldflags -X set.
type stamp struct{ version, commit, date string }

// resolve decides the version from the stamp, else the build info (nil when
// the binary has none): a stamped value wins over the recorded one, field by
// field.
func resolve(s stamp, bi *debug.BuildInfo, goVersion, platform string) api.Version {
	v := api.Version{Version: s.version, Commit: s.commit, Date: s.date, GoVersion: goVersion, Platform: platform}
	if bi != nil {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		var modified bool
		var revision, vcsTime string
		for _, kv := range bi.Settings {
			switch kv.Key {
			case "vcs.revision":
				revision = kv.Value
			case "vcs.time":
				vcsTime = kv.Value
			case "vcs.modified":
				modified = kv.Value == "true"
			}
		}
		if v.Commit == "" && revision != "" {
			v.Commit = revision
			if modified {
				v.Commit += "-dirty"
			}
		}
		if v.Date == "" {
			v.Date = vcsTime
		}
	}
	if v.Version == "" {
		v.Version = Unknown
	}
	return v
}

// String is the one line `kubetask --version` prints.
func String(v api.Version) string {
	s := "kubetask " + v.Version
	if v.Commit != "" {
		s += ", commit " + v.Commit
	}
	if v.Date != "" {
		s += ", built " + v.Date
	}
	return s + fmt.Sprintf(", %s %s", v.GoVersion, v.Platform)
}

// Skew says how a server's version differs from the client's, as a warning
// to print, or "" when they share major and minor version (patch releases
// interoperate). Versions that are not semantic versions cannot be
// compared: that is a warning too, since the server might be anything.
func Skew(client, server string) string {
	switch {
	case server == "":
		return "" // a server older than the version header, or not kubetask: nothing to compare
	case !semver.IsValid(client) || !semver.IsValid(server):
		return fmt.Sprintf("cannot compare the client's version %s with the server's %s (not semantic versions)", client, server)
	case semver.MajorMinor(client) != semver.MajorMinor(server):
		return fmt.Sprintf("the client's version %s and the server's %s differ in minor version: use a client of the server's minor version, %s", client, server, semver.MajorMinor(server))
	}
	return ""
}
