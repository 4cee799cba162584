package server

import (
	"fmt"
	"slices"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	corev1 "k8s.io/api/core/v1"
)

// The flags that refuse Secret references and runtimeClassName in some
// namespaces, for the refusal to say how to change it.
const (
	flagRefuseSecrets      = "--refuse-secrets"
	flagRefuseRuntimeClass = "--refuse-runtime-class"
)

// EveryNamespace in PodPolicy.RefuseSecrets or RefuseRuntimeClass names
// every namespace.
const EveryNamespace = "*"

// refuses reports whether the list (of PodPolicy.RefuseSecrets or
// RefuseRuntimeClass) names ns.
func refuses(list []string, ns string) bool {
	return slices.Contains(list, ns) || slices.Contains(list, EveryNamespace)
}

// podRef is one field of a pod spec that names something, and what.
type podRef struct {
	field string // under the pod template: spec.volumes[0].secret
	name  string
}

// secretRefs is every field of spec that names a Secret of the pod's
// namespace, which kubelet then gives the pod: image pull secrets, volumes
// (secret, projected, and the secret references of the volume plugins),
// and each container's env and envFrom. A ServiceAccount's own token is
// not a Secret reference (serviceAccountName: the ServiceAccounts option).
func secretRefs(spec *corev1.PodSpec) []podRef {
	var out []podRef
	add := func(field, name string) { out = append(out, podRef{field: field, name: name}) }
	ref := func(field string, r *corev1.LocalObjectReference) {
		if r != nil {
			add(field, r.Name)
		}
	}
	for i, s := range spec.ImagePullSecrets {
		add(fmt.Sprintf("spec.imagePullSecrets[%d]", i), s.Name)
	}
	for i, v := range spec.Volumes {
		at := fmt.Sprintf("spec.volumes[%d]", i)
		switch {
		case v.Secret != nil:
			add(at+".secret", v.Secret.SecretName)
		case v.Projected != nil:
			for j, s := range v.Projected.Sources {
				if s.Secret != nil {
					add(fmt.Sprintf("%s.projected.sources[%d].secret", at, j), s.Secret.Name)
				}
			}
		case v.AzureFile != nil:
			add(at+".azureFile.secretName", v.AzureFile.SecretName)
		case v.CephFS != nil:
			ref(at+".cephfs.secretRef", v.CephFS.SecretRef)
		case v.Cinder != nil:
			ref(at+".cinder.secretRef", v.Cinder.SecretRef)
		case v.FlexVolume != nil:
			ref(at+".flexVolume.secretRef", v.FlexVolume.SecretRef)
		case v.ISCSI != nil:
			ref(at+".iscsi.secretRef", v.ISCSI.SecretRef)
		case v.RBD != nil:
			ref(at+".rbd.secretRef", v.RBD.SecretRef)
		case v.ScaleIO != nil:
			ref(at+".scaleIO.secretRef", v.ScaleIO.SecretRef)
		case v.StorageOS != nil:
			ref(at+".storageos.secretRef", v.StorageOS.SecretRef)
		case v.CSI != nil:
			ref(at+".csi.nodePublishSecretRef", v.CSI.NodePublishSecretRef)
		}
	}
	containers := func(list string, cs []corev1.Container) {
		for i, c := range cs {
			at := fmt.Sprintf("spec.%s[%d]", list, i)
			for j, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					add(fmt.Sprintf("%s.env[%d].valueFrom.secretKeyRef", at, j), e.ValueFrom.SecretKeyRef.Name)
				}
			}
			for j, e := range c.EnvFrom {
				if e.SecretRef != nil {
					add(fmt.Sprintf("%s.envFrom[%d].secretRef", at, j), e.SecretRef.Name)
				}
			}
		}
	}
	containers("initContainers", spec.InitContainers)
	containers("containers", spec.Containers)
	eph := make([]corev1.Container, len(spec.EphemeralContainers))
	for i, c := range spec.EphemeralContainers {
		eph[i] = corev1.Container(c.EphemeralContainerCommon)
	}
	containers("ephemeralContainers", eph)
	return out
}

// checkRefusedFields returns nil when spec uses nothing the operator
// refuses in ns (PodPolicy.RefuseSecrets, RefuseRuntimeClass), else a 422
// naming each field and the option that refuses it.
func (p *podSecurity) checkRefusedFields(spec *corev1.PodSpec, ns string) error {
	var details []error
	var what []string
	if refuses(p.refuseSecrets, ns) {
		refs := secretRefs(spec)
		for _, r := range refs {
			details = append(details, &huma.ErrorDetail{Location: "body.spec.template." + r.field, Value: r.name,
				Message: fmt.Sprintf("names Secret %q: namespace %q refuses Secret references (%s)", r.name, ns, flagRefuseSecrets)})
		}
		if len(refs) > 0 {
			what = append(what, fmt.Sprintf("Secret references (%s)", flagRefuseSecrets))
		}
	}
	if refuses(p.refuseRuntimeClass, ns) && spec.RuntimeClassName != nil {
		details = append(details, &huma.ErrorDetail{Location: "body.spec.template.spec.runtimeClassName", Value: *spec.RuntimeClassName,
			Message: fmt.Sprintf("namespace %q refuses runtimeClassName (%s)", ns, flagRefuseRuntimeClass)})
		what = append(what, fmt.Sprintf("runtimeClassName (%s)", flagRefuseRuntimeClass))
	}
	if len(details) == 0 {
		return nil
	}
	return huma.Error422UnprocessableEntity(
		fmt.Sprintf("the operator refuses %s in namespace %q: remove them from the task's pod, or ask the operator to take the namespace out of that option (kubetask serve; refuseSecrets, refuseRuntimeClass in the configuration file)",
			strings.Join(what, " and "), ns), details...)
}
