#!/usr/bin/env bash
# Proves that a module outside kubetask can import its library packages (pkg/executor,
# pkg/runner, pkg/store, pkg/task, pkg/client, pkg/api, pkg/logcapture, pkg/podlog) with nothing but a replace of kubetask itself: a copy
# of this directory in a temporary directory, with that replace added, must pass
# go mod tidy, go build and go vet. The go command runs with the caller's environment
# (GOPROXY, GOFLAGS, caches); no go.work applies. `make importcheck` runs it.
set -euo pipefail
GO=${GO:-go}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kubetask-importcheck.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$here/go.mod" "$here"/*.go "$tmp/"
cd "$tmp"
export GOWORK=off
"$GO" mod edit -replace "github.com/kubetask/kubetask=$root"
"$GO" mod tidy
"$GO" build ./...
"$GO" vet ./...
echo "importcheck: a module outside kubetask imports pkg/executor, pkg/runner, pkg/store, pkg/task, pkg/client, pkg/api, pkg/logcapture and pkg/podlog (go mod tidy, build, vet: ok)"
