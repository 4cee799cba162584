package localnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// configError is a container configuration problem the kubelet reports as
// CreateContainerConfigError (a missing ConfigMap or Secret, or key).
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

// envList keeps variables in definition order; a redefinition replaces the value.
type envList struct {
	names []string
	vals  map[string]string
}

func (e *envList) set(k, v string) {
	if e.vals == nil {
		e.vals = map[string]string{}
	}
	if _, ok := e.vals[k]; !ok {
		e.names = append(e.names, k)
	}
	e.vals[k] = v
}

func (e *envList) list() []string {
	out := make([]string, 0, len(e.names))
	for _, k := range e.names {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// resolveEnv computes a container's environment as the kubelet does: a few runtime
// variables, envFrom, then env with $(VAR) expansion, reading ConfigMaps and Secrets
// from the API (not a cache, so one created just before the pod is found).
func (w *podWorker) resolveEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (*envList, error) {
	env := &envList{}
	env.set("HOSTNAME", pod.Name)
	// In-cluster clients find the apiserver here: pods share the host network, where
	// the kubernetes service's cluster IP is not routable.
	if w.p.cfg.apiHost != "" {
		env.set("KUBERNETES_SERVICE_HOST", w.p.cfg.apiHost)
		env.set("KUBERNETES_SERVICE_PORT", w.p.cfg.apiPort)
		env.set("KUBERNETES_SERVICE_PORT_HTTPS", w.p.cfg.apiPort)
	}
	cms := map[string]*corev1.ConfigMap{}
	secrets := map[string]*corev1.Secret{}
	getCM := func(name string) (*corev1.ConfigMap, error) {
		if cm, ok := cms[name]; ok {
			return cm, nil
		}
		cm, err := w.p.cfg.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, &configError{fmt.Sprintf("configmap %q not found", name)}
		}
		if err != nil {
			return nil, fmt.Errorf("get configmap %q: %w", name, err)
		}
		cms[name] = cm
		return cm, nil
	}
	getSecret := func(name string) (*corev1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		s, err := w.p.cfg.client.CoreV1().Secrets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, &configError{fmt.Sprintf("secret %q not found", name)}
		}
		if err != nil {
			return nil, fmt.Errorf("get secret %q: %w", name, err)
		}
		secrets[name] = s
		return s, nil
	}
	isOptional := func(b *bool) bool { return b != nil && *b }

	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := getCM(ef.ConfigMapRef.Name)
			if err != nil {
				if ce := (*configError)(nil); errors.As(err, &ce) && isOptional(ef.ConfigMapRef.Optional) {
					continue
				}
				return nil, err
			}
			for k, v := range cm.Data {
				env.set(ef.Prefix+k, v)
			}
		case ef.SecretRef != nil:
			s, err := getSecret(ef.SecretRef.Name)
			if err != nil {
				if ce := (*configError)(nil); errors.As(err, &ce) && isOptional(ef.SecretRef.Optional) {
					continue
				}
				return nil, err
			}
			for k, v := range s.Data {
				env.set(ef.Prefix+k, string(v))
			}
		}
	}

	for _, ev := range c.Env {
		if ev.ValueFrom == nil {
			env.set(ev.Name, expandVars(ev.Value, env.vals))
			continue
		}
		vf := ev.ValueFrom
		switch {
		case vf.FieldRef != nil:
			v, err := podFieldValue(pod, vf.FieldRef.FieldPath)
			if err != nil {
				return nil, err
			}
			env.set(ev.Name, v)
		case vf.ResourceFieldRef != nil:
			v, err := w.resourceFieldValue(pod, c, vf.ResourceFieldRef)
			if err != nil {
				return nil, err
			}
			env.set(ev.Name, v)
		case vf.ConfigMapKeyRef != nil:
			ref := vf.ConfigMapKeyRef
			cm, err := getCM(ref.Name)
			if err != nil {
				if ce := (*configError)(nil); errors.As(err, &ce) && isOptional(ref.Optional) {
					continue
				}
				return nil, err
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				if b, isBin := cm.BinaryData[ref.Key]; isBin {
					v, ok = string(b), true
				}
			}
			if !ok {
				if isOptional(ref.Optional) {
					continue
				}
				return nil, &configError{fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)}
			}
			env.set(ev.Name, v)
		case vf.SecretKeyRef != nil:
			ref := vf.SecretKeyRef
			s, err := getSecret(ref.Name)
			if err != nil {
				if ce := (*configError)(nil); errors.As(err, &ce) && isOptional(ref.Optional) {
					continue
				}
				return nil, err
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				if isOptional(ref.Optional) {
					continue
				}
				return nil, &configError{fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)}
			}
			env.set(ev.Name, string(v))
		case vf.FileKeyRef != nil:
			return nil, &configError{fmt.Sprintf("env %q: fileKeyRef is not supported by the kubetask local node", ev.Name)}
		}
	}
	return env, nil
}

// resourceFieldValue resolves limits.* and requests.*; a missing limit is the node's
// capacity, as the kubelet defaults it to allocatable.
func (w *podWorker) resourceFieldValue(pod *corev1.Pod, self *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	c := self
	if ref.ContainerName != "" && ref.ContainerName != self.Name {
		c = nil
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == ref.ContainerName {
				c = &pod.Spec.Containers[i]
			}
		}
		for i := range pod.Spec.InitContainers {
			if pod.Spec.InitContainers[i].Name == ref.ContainerName {
				c = &pod.Spec.InitContainers[i]
			}
		}
		if c == nil {
			return "", &configError{fmt.Sprintf("resourceFieldRef: no container %q", ref.ContainerName)}
		}
	}
	kind, name, _ := strings.Cut(ref.Resource, ".")
	res := corev1.ResourceName(name)
	var q resource.Quantity
	switch kind {
	case "limits":
		if v, ok := c.Resources.Limits[res]; ok {
			q = v
		} else {
			switch res {
			case corev1.ResourceCPU:
				q = w.p.cfg.cpu
			case corev1.ResourceMemory:
				q = w.p.cfg.memory
			}
		}
	case "requests":
		q = c.Resources.Requests[res]
	default:
		return "", &configError{fmt.Sprintf("unsupported resourceFieldRef %q", ref.Resource)}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if res == corev1.ResourceCPU {
		return fmt.Sprint(int64(math.Ceil(float64(q.MilliValue()) / float64(divisor.MilliValue())))), nil
	}
	return fmt.Sprint(int64(math.Ceil(float64(q.Value()) / float64(divisor.Value())))), nil
}
