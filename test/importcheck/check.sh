#!/usr/bin/env bash
# Proves that a module outside kubetask can import its library packages (pkg/executor,
# pkg/runner, pkg/store, pkg/task, pkg/client, pkg/api, pkg/logcapture, pkg/podlog) with a
# plain `go get` and no replace directive: the commit HEAD of this checkout is served as a
# published version would be, by a Go module proxy made of files (internal/modproxy: the
# module zip `go get` downloads, at a pseudo-version of HEAD), placed before the caller's
# GOPROXY; a copy of this directory in a temporary directory then runs go get of that
# version, go mod tidy, go build and go vet. Everything else resolves through the caller's
# environment (GOPROXY, GOFLAGS, caches); no go.work applies. `make importcheck` runs it.
# It checks HEAD, not uncommitted changes.
set -euo pipefail
GO=${GO:-go}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kubetask-importcheck.XXXXXX")
cleanup() {
	# The served version is kubetask's own, at this commit: drop it from the module cache too.
	if [[ -n "${version:-}" ]]; then
		modcache=$("$GO" env GOMODCACHE)
		chmod -R u+w "$modcache/github.com/kubetask/kubetask@$version" 2>/dev/null || true
		rm -rf "$modcache/github.com/kubetask/kubetask@$version" "$modcache/cache/download/github.com/kubetask/kubetask"
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
cp "$here/go.mod" "$here"/*.go "$tmp/"
export GOWORK=off
version=$(cd "$root" && "$GO" run ./internal/modproxy -repo "$root" -out "$tmp/proxy")
upstream=$("$GO" env GOPROXY)
cd "$tmp"
# The served version is in no checksum database: its hash is the zip's own.
export GOPROXY="file://$tmp/proxy,$upstream" GONOSUMDB="github.com/kubetask/kubetask${GONOSUMDB:+,$GONOSUMDB}"
if grep -q '^replace' go.mod; then
	echo "importcheck: go.mod has a replace directive" >&2
	exit 1
fi
"$GO" get "github.com/kubetask/kubetask@$version"
"$GO" mod tidy
"$GO" build ./...
"$GO" vet ./...
echo "importcheck: a module outside kubetask gets github.com/kubetask/kubetask@$version with go get (no replace) and imports pkg/executor, pkg/runner, pkg/store, pkg/task, pkg/client, pkg/api, pkg/logcapture and pkg/podlog (go mod tidy, build, vet: ok)"
