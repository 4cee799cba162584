// Package runner runs one task to completion as a Kubernetes pod: it creates the
// pod (or attaches to the unfinished pod of the same run), watches it with a
// client-go informer, streams its logs, decides the outcome from the main
// container with podstate.Derive, reads the result, stops sidecars, cleans up
// per policy and reports the outcome once.
//
// The CLI command `kubetask run` is a thin shell over Run.
package runner
