package localcluster

import (
	"slices"
	"strings"
	"testing"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/yaml"
)

// TestPodAuditPolicy: the policy is a valid audit.k8s.io/v1 Policy (strict
// decoding: a misspelt field fails) whose first matching rule gives each
// request the level the history checker needs.
func TestPodAuditPolicy(t *testing.T) {
	var p auditv1.Policy
	if err := yaml.UnmarshalStrict([]byte(PodAuditPolicy), &p); err != nil {
		t.Fatalf("PodAuditPolicy does not decode: %v", err)
	}
	if p.APIVersion != "audit.k8s.io/v1" || p.Kind != "Policy" {
		t.Errorf("apiVersion %q kind %q", p.APIVersion, p.Kind)
	}
	if !slices.Contains(p.OmitStages, auditv1.StageRequestReceived) {
		t.Errorf("omitStages %v: want RequestReceived omitted (one line per request)", p.OmitStages)
	}
	for _, c := range []struct {
		verb, resource, subresource string
		want                        auditv1.Level
	}{
		{"create", "pods", "", auditv1.LevelRequestResponse},
		{"create", "pods", "binding", auditv1.LevelRequest},
		{"patch", "pods", "status", auditv1.LevelRequest},
		{"update", "pods", "status", auditv1.LevelRequest},
		{"delete", "pods", "", auditv1.LevelRequest},
		{"patch", "pods", "", auditv1.LevelRequest},
		{"create", "pods", "eviction", auditv1.LevelRequest},
		{"get", "pods", "", auditv1.LevelNone},
		{"watch", "pods", "", auditv1.LevelNone},
		{"create", "pods", "exec", auditv1.LevelNone},
		{"update", "leases", "", auditv1.LevelNone},
		{"patch", "nodes", "status", auditv1.LevelNone},
	} {
		if got := levelOf(p, c.verb, c.resource, c.subresource); got != c.want {
			t.Errorf("%s %s/%s: level %s, want %s", c.verb, c.resource, c.subresource, got, c.want)
		}
	}
}

// levelOf is the level of the first rule that matches a core-group request,
// as the API server's policy evaluator picks it.
func levelOf(p auditv1.Policy, verb, resource, subresource string) auditv1.Level {
	name := resource
	if subresource != "" {
		name += "/" + subresource
	}
	for _, r := range p.Rules {
		if len(r.Verbs) > 0 && !slices.Contains(r.Verbs, verb) {
			continue
		}
		if len(r.Resources) == 0 {
			return r.Level
		}
		for _, g := range r.Resources {
			if g.Group == "" && slices.Contains(g.Resources, name) {
				return r.Level
			}
		}
	}
	return auditv1.LevelNone
}

func TestAuditConfig(t *testing.T) {
	bins := Binaries{Etcd: "e", APIServer: "a", Scheduler: "s", ControllerManager: "c"}
	off := Config{Dir: t.TempDir(), Binaries: bins}
	if err := off.defaults(); err != nil {
		t.Fatal(err)
	}
	if args := (&Cluster{cfg: off}).auditArgs(); args != nil {
		t.Errorf("audit flags without AuditLogPath: %v", args)
	}
	on := Config{Dir: t.TempDir(), Binaries: bins, AuditLogPath: "audit.log"}
	if err := on.defaults(); err != nil {
		t.Fatal(err)
	}
	if on.AuditPolicy != PodAuditPolicy {
		t.Error("AuditPolicy does not default to PodAuditPolicy")
	}
	args := strings.Join((&Cluster{cfg: on}).auditArgs(), " ")
	for _, want := range []string{"--audit-log-path=" + on.AuditLogPath, "--audit-policy-file=", "--audit-log-format=json", "--audit-log-mode=blocking"} {
		if !strings.Contains(args, want) {
			t.Errorf("audit flags %q lack %q", args, want)
		}
	}
	bad := Config{Dir: t.TempDir(), Binaries: bins, AuditPolicy: PodAuditPolicy}
	if err := bad.defaults(); err == nil || !strings.Contains(err.Error(), "AuditLogPath") {
		t.Errorf("AuditPolicy without AuditLogPath: %v, want an error naming AuditLogPath", err)
	}
}
