// Package podstate derives a task's state from its pod.
//
// Derive is the single decision at the heart of kubetask: given a task's pod as the API
// server reports it (or nil once it is gone), the task's policy and the current time, it
// returns the task's phase, a reason from a closed set, a message for people, the main
// container's exit code and whether a failure is worth retrying.
//
// The main container decides. A pod's own phase only becomes Succeeded or Failed once
// every regular container has exited, so a task pod with a sidecar (a service-mesh proxy,
// a log shipper, kubetask's own result holder) may stay Running long after the task's
// code finished, or end Failed because a sidecar failed. Derive therefore looks at the
// main container first and at pod-level facts (deletion, eviction, deadlines, phase
// Unknown, scheduling) only to explain why the main container did not finish on its
// own. The statuses of other regular containers never change the outcome; native
// sidecars and init containers only matter while they keep the main container from
// starting.
//
// The package is pure: no I/O, no clock. Every time-dependent rule takes now as an
// argument, and State.Recheck says when the answer could change by time alone.
package podstate
