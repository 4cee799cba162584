// Package kwokstages holds the kwok stage file that drives kubetask's
// simulated nodes and the pods on them.
//
// The stages are documented in docs/sim-nodes.md; in short, a pod on a
// simulated node runs until one of the sim.kubetask.dev/ annotations tells
// it to end a container, stop its sidecars or complete, and a pod with a
// deletionTimestamp is removed at once.
package kwokstages

import _ "embed" // for go:embed

// YAML is the multi-document stage file passed to kwok with --config.
//
//go:embed stages.yaml
var YAML []byte

// Annotation keys read by the pod stages. Durations use Go syntax ("1.5s",
// "2m"); codes are decimal integers.
const (
	// Prefix is the prefix of every annotation below.
	Prefix = "sim.kubetask.dev/"
	// ExitContainer names the container that terminates on its own.
	ExitContainer = Prefix + "exit-container"
	// ExitCode is ExitContainer's exit code (default 0).
	ExitCode = Prefix + "exit-code"
	// ExitAfter is when ExitContainer ends, counted from the pod's startTime (default 0s).
	ExitAfter = Prefix + "exit-after"
	// SidecarsStopAfter makes every other container end this long after
	// ExitContainer ended; without it they keep running.
	SidecarsStopAfter = Prefix + "sidecars-stop-after"
	// SidecarsExitCode is the exit code of the containers stopped by SidecarsStopAfter (default 0).
	SidecarsExitCode = Prefix + "sidecars-exit-code"
	// CompleteAfter ends every container this long after the pod's startTime.
	// It takes precedence over ExitContainer.
	CompleteAfter = Prefix + "complete-after"
	// CompleteCode is the exit code of the containers ended by CompleteAfter (default 0).
	CompleteCode = Prefix + "complete-code"
)
