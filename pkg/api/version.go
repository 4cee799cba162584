package api

// HeaderVersion is the header that carries the server's version (as
// Version.Version) on every response of `kubetask serve`: a client compares
// it with its own.
const HeaderVersion = "X-Kubetask-Version"

// Version is what GET /api/v1/version reports: the build of the server.
type Version struct {
	Version   string `json:"version" doc:"The release (semantic version, such as v0.4.1), or a development version (v0.0.0-...)." example:"v0.4.1"`
	Commit    string `json:"commit,omitempty" doc:"The git commit the binary was built from; '-dirty' is appended when the work tree had changes."`
	Date      string `json:"date,omitempty" doc:"When the binary was built (RFC 3339, UTC); for a release, the commit's time." example:"2026-12-03T11:00:00Z"`
	GoVersion string `json:"goVersion" doc:"The Go toolchain the binary was built with." example:"go1.26.8"`
	Platform  string `json:"platform" doc:"Operating system and architecture of the binary." example:"linux/amd64"`
}
