package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	psapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/task"
)

// PodPolicy is what a submitted task's pod may be. kubetask creates pods
// with its own identity, so a submitter could otherwise get a pod (a
// privileged one, one on the host's namespaces or file system) that they
// could not create themselves: every submission and rerun is checked
// against it before anything is stored.
type PodPolicy struct {
	// Level is the Pod Security Standards level (privileged, baseline or
	// restricted) a task's pod template must meet in every namespace not
	// in NamespaceLevels. Default baseline.
	Level string
	// NamespaceLevels sets the level of some namespaces.
	NamespaceLevels map[string]string
	// ServiceAccounts lists, for some namespaces, the ServiceAccounts a
	// task there may run as (spec.serviceAccountName; unset is "default").
	// A namespace not listed allows any.
	ServiceAccounts map[string][]string
	// RefuseSecrets lists the namespaces (EveryNamespace: every one) whose
	// tasks may not name a Secret: kubelet gives the pod any Secret of its
	// namespace it names (env, envFrom, volumes, imagePullSecrets), and the
	// task may print it to the log its submitter reads.
	RefuseSecrets []string
	// RefuseRuntimeClass lists the namespaces (EveryNamespace: every one)
	// whose tasks may not set runtimeClassName.
	RefuseRuntimeClass []string
	// LabelTTL is how long a namespace's pod-security.kubernetes.io/enforce
	// label, read from the API server, is reused. Default 10s.
	LabelTTL time.Duration
}

// The flag and label that set a level, for the refusal to say how to
// change it.
const (
	flagNamespacePodSecurity = "--namespace-pod-security"
	flagServiceAccounts      = "--service-accounts"
)

// podSecurity checks submissions against a PodPolicy with the Kubernetes
// project's own Pod Security Standards checks (k8s.io/pod-security-admission),
// at the stricter of the configured level and the namespace's own enforce
// label.
type podSecurity struct {
	eval     policy.Evaluator
	level    psapi.Level
	levels   map[string]psapi.Level
	accounts map[string][]string
	labels   *namespaceLevels // nil: namespace labels are not read
	// refuseSecrets and refuseRuntimeClass are PodPolicy's.
	refuseSecrets, refuseRuntimeClass []string
}

func newPodSecurity(p PodPolicy, client kubernetes.Interface, clk clock.PassiveClock) (*podSecurity, error) {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return nil, fmt.Errorf("pod security checks: %w", err)
	}
	ps := &podSecurity{eval: eval, level: psapi.LevelBaseline, levels: map[string]psapi.Level{}, accounts: map[string][]string{},
		refuseSecrets: slices.Clone(p.RefuseSecrets), refuseRuntimeClass: slices.Clone(p.RefuseRuntimeClass)}
	var errs []error
	if p.Level != "" {
		if ps.level, err = psapi.ParseLevel(p.Level); err != nil {
			errs = append(errs, fmt.Errorf("pod security level %q: must be privileged, baseline or restricted", p.Level))
		}
	}
	for ns, l := range p.NamespaceLevels {
		lv, err := psapi.ParseLevel(l)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod security level %q of namespace %q: must be privileged, baseline or restricted", l, ns))
		}
		ps.levels[ns] = lv
	}
	for ns, sas := range p.ServiceAccounts {
		ps.accounts[ns] = slices.Clone(sas)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if client != nil {
		ttl := p.LabelTTL
		if ttl == 0 {
			ttl = 10 * time.Second
		}
		ps.labels = &namespaceLevels{client: client, clock: clk, ttl: ttl, max: 10000, entries: map[string]namespaceLevel{}}
	}
	return ps, nil
}

// effective is the level a task must meet in ns: the configured one, or the
// namespace's enforce label where stricter; label is then the label's value.
func (p *podSecurity) effective(ctx context.Context, ns string) (lv psapi.LevelVersion, label string, err error) {
	lv = psapi.LevelVersion{Level: p.level, Version: psapi.LatestVersion()}
	if l, ok := p.levels[ns]; ok {
		lv.Level = l
	}
	if p.labels == nil {
		return lv, "", nil
	}
	nl, err := p.labels.get(ctx, ns)
	if err != nil {
		return lv, "", err
	}
	if nl.set && psapi.CompareLevels(nl.lv.Level, lv.Level) > 0 {
		return nl.lv, nl.value, nil
	}
	return lv, "", nil
}

// check returns nil when t may run in ns, else a 422 naming every refused
// field, the level and how to change it. A namespace whose labels cannot be
// read is checked at the configured level (the API server enforces its
// label on the pod anyway); warn is told why.
func (p *podSecurity) check(ctx context.Context, t *task.Task, ns string, warn func(string, ...any)) error {
	spec := &t.Spec.Template.Spec
	var details []error
	if allowed, ok := p.accounts[ns]; ok {
		sa := spec.ServiceAccountName
		if sa == "" {
			sa = spec.DeprecatedServiceAccount
		}
		if sa == "" {
			sa = "default"
		}
		if !slices.Contains(allowed, sa) {
			return huma.Error422UnprocessableEntity(
				fmt.Sprintf("tasks in namespace %q may not run as ServiceAccount %q: use one of %s, or ask the operator to allow it (kubetask serve %s %s/%s)",
					ns, sa, strings.Join(quoteAll(allowed), ", "), flagServiceAccounts, ns, sa),
				&huma.ErrorDetail{Location: "body.spec.template.spec.serviceAccountName", Value: sa,
					Message: fmt.Sprintf("must be one of %s in namespace %q", strings.Join(quoteAll(allowed), ", "), ns)})
		}
	}
	if err := p.checkRefusedFields(spec, ns); err != nil {
		return err
	}
	lv, label, err := p.effective(ctx, ns)
	if err != nil {
		warn("cannot read the namespace's pod-security labels; checking tasks at kubetask's own level", "namespace", ns, "level", lv.Level, "err", err)
	}
	var reasons []string
	for _, r := range p.eval.EvaluatePod(lv, &t.Spec.Template.ObjectMeta, spec) {
		if r.Allowed {
			continue
		}
		reasons = append(reasons, r.ForbiddenReason)
		msg := fmt.Sprintf("forbidden by Pod Security level %q: %s", lv.Level, r.ForbiddenReason)
		if r.ForbiddenDetail != "" {
			msg += " (" + r.ForbiddenDetail + ")"
		}
		for _, loc := range p.locate(lv, &t.Spec.Template.ObjectMeta, spec, r.ForbiddenReason) {
			details = append(details, &huma.ErrorDetail{Location: "body.spec.template." + loc, Message: msg})
		}
	}
	if len(reasons) == 0 {
		return nil
	}
	var how string
	if label != "" {
		how = fmt.Sprintf("the level is the namespace's own label %s=%s (the API server enforces it too): change the pod, or the label (kubectl label namespace %s %s=baseline --overwrite)",
			psapi.EnforceLevelLabel, label, ns, psapi.EnforceLevelLabel)
	} else {
		how = fmt.Sprintf("change the pod, or ask the operator to change the namespace's level (kubetask serve %s %s=privileged|baseline|restricted)",
			flagNamespacePodSecurity, ns)
	}
	return huma.Error422UnprocessableEntity(
		fmt.Sprintf("the task's pod does not meet the Pod Security Standards level %q of namespace %q: %s; %s",
			lv.Level, ns, strings.Join(reasons, ", "), how), details...)
}

// locate names the fields (paths under the pod template) that fail the check
// whose reason is reason: the Pod Security checks say what is wrong, not
// where, so each container and volume is checked alone. What fails with no
// container and no volume is the pod's own.
func (p *podSecurity) locate(lv psapi.LevelVersion, meta *metav1.ObjectMeta, spec *corev1.PodSpec, reason string) []string {
	fails := func(s *corev1.PodSpec) bool {
		for _, r := range p.eval.EvaluatePod(lv, meta, s) {
			if !r.Allowed && r.ForbiddenReason == reason {
				return true
			}
		}
		return false
	}
	bare := spec.DeepCopy()
	bare.Containers, bare.InitContainers, bare.EphemeralContainers, bare.Volumes = nil, nil, nil, nil
	if fails(bare) {
		return podLevelFields(spec, reason)
	}
	var locs []string
	suffix := containerField[reason]
	try := func(list string, i int, c corev1.Container) {
		s := bare.DeepCopy()
		switch list {
		case "initContainers":
			s.InitContainers = []corev1.Container{c}
		case "ephemeralContainers":
			s.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon(c)}}
		default:
			s.Containers = []corev1.Container{c}
		}
		if fails(s) {
			locs = append(locs, fmt.Sprintf("spec.%s[%d]%s", list, i, suffix))
		}
	}
	for i, c := range spec.InitContainers {
		try("initContainers", i, c)
	}
	for i, c := range spec.Containers {
		try("containers", i, c)
	}
	for i, c := range spec.EphemeralContainers {
		try("ephemeralContainers", i, corev1.Container(c.EphemeralContainerCommon))
	}
	for i, v := range spec.Volumes {
		s := bare.DeepCopy()
		s.Volumes = []corev1.Volume{v}
		if fails(s) {
			loc := fmt.Sprintf("spec.volumes[%d]", i)
			if v.HostPath != nil {
				loc += ".hostPath"
			}
			locs = append(locs, loc)
		}
	}
	if len(locs) == 0 { // only in combination: the pod as a whole
		return []string{"spec"}
	}
	return locs
}

// containerField is the field of a container each check's reason is about.
var containerField = map[string]string{
	"privileged":                        ".securityContext.privileged",
	"non-default capabilities":          ".securityContext.capabilities.add",
	"unrestricted capabilities":         ".securityContext.capabilities",
	"hostPort":                          ".ports",
	"allowPrivilegeEscalation != false": ".securityContext.allowPrivilegeEscalation",
	"runAsNonRoot != true":              ".securityContext.runAsNonRoot",
	"runAsUser=0":                       ".securityContext.runAsUser",
	"seccompProfile":                    ".securityContext.seccompProfile",
	"procMount":                         ".securityContext.procMount",
	"seLinuxOptions":                    ".securityContext.seLinuxOptions",
	"hostProcess":                       ".securityContext.windowsOptions.hostProcess",
	"probe or lifecycle host":           "",
	"forbidden AppArmor profile":        ".securityContext.appArmorProfile",
	"forbidden AppArmor profiles":       ".securityContext.appArmorProfile",
}

// podLevelFields names the pod-level fields that fail a check.
func podLevelFields(spec *corev1.PodSpec, reason string) []string {
	switch reason {
	case "host namespaces":
		var out []string
		for _, f := range []struct {
			set  bool
			name string
		}{{spec.HostNetwork, "hostNetwork"}, {spec.HostPID, "hostPID"}, {spec.HostIPC, "hostIPC"}} {
			if f.set {
				out = append(out, "spec."+f.name)
			}
		}
		if len(out) > 0 {
			return out
		}
	case "forbidden sysctls":
		return []string{"spec.securityContext.sysctls"}
	case "forbidden AppArmor profile", "forbidden AppArmor profiles":
		return []string{"metadata.annotations"}
	}
	return []string{"spec.securityContext"}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	sort.Strings(out)
	return out
}

// namespaceLevels reads namespaces' pod-security.kubernetes.io/enforce label
// (a get of the namespace: a RoleBinding in it grants that) and keeps each
// for a TTL, so that a busy namespace costs one read per TTL. Failed reads
// are not kept.
type namespaceLevels struct {
	client kubernetes.Interface
	clock  clock.PassiveClock
	ttl    time.Duration
	max    int

	mu      sync.Mutex
	entries map[string]namespaceLevel
	flight  singleflight.Group
}

type namespaceLevel struct {
	set     bool               // the namespace has an enforce label
	value   string             // its value
	lv      psapi.LevelVersion // the level it sets
	expires time.Time
}

// labelTimeout bounds a namespace read shared by concurrent submissions.
const labelTimeout = 10 * time.Second

func (n *namespaceLevels) get(ctx context.Context, ns string) (namespaceLevel, error) {
	n.mu.Lock()
	e, ok := n.entries[ns]
	n.mu.Unlock()
	if ok && n.clock.Now().Before(e.expires) {
		return e, nil
	}
	ch := n.flight.DoChan(ns, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), labelTimeout)
		defer cancel()
		obj, err := n.client.CoreV1().Namespaces().Get(rctx, ns, metav1.GetOptions{})
		var e namespaceLevel
		switch {
		case apierrors.IsNotFound(err):
			// No namespace, no label: the submission is refused for
			// the missing namespace elsewhere.
		case err != nil:
			return e, err
		default:
			e.lv, e.set = levelOfLabels(obj.Labels)
			e.value = obj.Labels[psapi.EnforceLevelLabel]
		}
		e.expires = n.clock.Now().Add(n.ttl)
		n.mu.Lock()
		if len(n.entries) >= n.max {
			n.entries = map[string]namespaceLevel{}
		}
		n.entries[ns] = e
		n.mu.Unlock()
		return e, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return namespaceLevel{}, r.Err
		}
		return r.Val.(namespaceLevel), nil
	case <-ctx.Done():
		return namespaceLevel{}, ctx.Err()
	}
}

// levelOfLabels is the enforce level and version a namespace's labels set,
// as the API server's Pod Security admission reads them (an invalid label
// value counts as restricted, as there).
func levelOfLabels(labels map[string]string) (psapi.LevelVersion, bool) {
	if _, ok := labels[psapi.EnforceLevelLabel]; !ok {
		return psapi.LevelVersion{}, false
	}
	pol, _ := psapi.PolicyToEvaluate(labels, psapi.Policy{
		Enforce: psapi.LevelVersion{Level: psapi.LevelPrivileged, Version: psapi.LatestVersion()},
	})
	return pol.Enforce, true
}
