// Package history checks what happened to kubetask's pods against what
// kubetask promises, from sources kubetask cannot fake: the kube-apiserver's
// audit log (which pod was created, bound to a node, reported stopped,
// deleted, and when), the store's records (read through pkg/store, not
// through kubetask's API or events) and the cluster's final state. It is the
// checker of the chaos suite (test/faults/chaos, docs/chaos.md), in the manner of
// Jepsen's checkers: record a history from the outside, check invariants
// over all of it afterwards.
//
// ReadAudit decodes an audit log written under localcluster.PodAuditPolicy
// into one Pod per pod UID (FromAudit); Check takes those pods, the store's
// records with their log archives and the pods left at the end, and returns
// a Report: every violation of the six invariants of docs/chaos.md, with the
// task, the attempt and the evidence, and counts (pods created and run per
// attempt, creates the fence stopped).
//
// Definitions, from the audit log alone:
//   - a pod was created when its create answered 2xx (the UID is the
//     response's);
//   - a pod ran when it was bound to a node: a successful pods/binding
//     create, or a create that already named a node. A pod created with the
//     fence's scheduling gate (FenceGate) and never bound did not run;
//   - a pod stopped at the earliest of: a status write (pods/status) after
//     which every container of its spec (and every native sidecar) has been
//     reported terminated, a status write with phase Succeeded or Failed,
//     or a delete with grace period 0 (what a kubelet, kwok, the pod garbage
//     collector or a force delete sends once nothing runs or nothing may).
//     A pod is running from its binding's receipt until it stopped;
//   - the main container started at the startedAt that a status write
//     reported for it (running, or terminated after a start): the node's
//     clock in whole seconds, never later than the start.
//
// A write that does not name its pod's UID goes to the pod of its name's
// latest create received before the write completed: two pods of one name
// never exist at once, and a create can be answered after the scheduler
// already bound its pod.
//
// The package reads what it is given and judges; the suite collects the
// inputs (ReadStore reads a store, SaveInput and LoadInput keep a run's
// inputs for TestRecheck).
package history
