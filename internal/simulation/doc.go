// Package simulation runs the real executor (pkg/executor: sync, creators,
// cleaners, slots, pod caches, the instance Lease, terms and the fence)
// against a simulated kube-apiserver, scheduler, kubelet, store and users,
// in one testing/synctest bubble, with a seed that decides the order of
// every step (API requests and their answers, store calls and their
// answers, watch deliveries), holds or fails any of them, and pauses,
// crashes and replaces processes. A checker judges the history the
// simulated parts wrote, never the executor's own events: one run per
// attempt, no run after its outcome, no two runs at once, one true
// outcome, nothing left, liveness. The same seed gives the same history,
// byte for byte. docs/simulation.md says what it models and what not;
// ContractClient lets test/integration/cluster compare the simulated API server's
// answers with kube-apiserver's.
package simulation
