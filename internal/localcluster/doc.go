// Package localcluster starts and stops a real Kubernetes control plane on
// loopback: etcd, kube-apiserver, kube-scheduler and kube-controller-manager,
// plus optional local process nodes and kwok-simulated nodes.
//
// Guarantees:
//   - every component listens on a free 127.0.0.1 port and logs to a file under
//     the cluster directory (logs/<component>.log);
//   - Start returns only when the control plane is ready (apiserver /readyz,
//     scheduler and controller-manager /healthz, the default ServiceAccount
//     exists), or stops what it started and returns an error with the failing
//     component's log tail;
//   - components run in their own process groups and receive SIGKILL if the
//     process that started them dies, so no orphan outlives its parent; Stop
//     terminates every group.
//
// Fault hooks for tests: RestartAPIServer (watchers then get 410 Expired),
// CompactEtcd with Config.OnDemandExpiry (410 without restarts), StopEtcd and
// StartEtcd.
//
// History for checkers: with Config.AuditLogPath, kube-apiserver writes an
// audit log of the pod lifecycle (PodAuditPolicy) that survives its restarts.
package localcluster
