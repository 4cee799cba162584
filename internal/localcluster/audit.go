package localcluster

// PodAuditPolicy is the audit policy of a cluster with Config.AuditLogPath
// and no Config.AuditPolicy: the pod lifecycle as the API server served it,
// and nothing else (no leases, no node heartbeats, no reads), so that the log
// of a run of thousands of pods stays tens of megabytes.
//
//   - pod creates at RequestResponse: the stored pod, with its UID, labels,
//     annotations, scheduling gates and spec.nodeName;
//   - bindings (pods/binding), status writes (pods/status), evictions
//     (pods/eviction), pod deletes and pod patches and updates (finalizers,
//     labels, scheduling gates) at Request: the binding's UID and node, the
//     status as the kubelet reported it, the delete options;
//   - everything else at None.
//
// Only the ResponseComplete stage is written (one line per request), and no
// managed fields.
const PodAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
omitManagedFields: true
rules:
- level: RequestResponse
  verbs: ["create"]
  resources:
  - group: ""
    resources: ["pods"]
- level: Request
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources:
  - group: ""
    resources: ["pods", "pods/binding", "pods/status", "pods/eviction"]
- level: None
`

// AuditLogPath is where kube-apiserver writes its audit log (JSON lines of
// audit.k8s.io/v1 Events), "" when Config.AuditLogPath was not set. The log
// outlives apiserver restarts: each start appends to it.
func (c *Cluster) AuditLogPath() string { return c.cfg.AuditLogPath }

// auditArgs are kube-apiserver's audit flags: none unless an audit log is
// wanted.
func (c *Cluster) auditArgs() []string {
	if c.cfg.AuditLogPath == "" {
		return nil
	}
	return []string{
		"--audit-policy-file=" + c.path("audit-policy.yaml"),
		"--audit-log-path=" + c.cfg.AuditLogPath,
		"--audit-log-format=json",
		// Written before the response is sent: a request the client saw
		// answered is in the log.
		"--audit-log-mode=blocking",
		// One file for the whole run: no rotation, no truncation.
		"--audit-log-maxsize=0",
		"--audit-log-maxbackup=0",
		"--audit-log-truncate-enabled=false",
	}
}
