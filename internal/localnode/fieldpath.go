package localnode

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// podFieldValue resolves a downward-API field path (env fieldRef and downwardAPI
// volume items) the way the kubelet does. The host's IP is 127.0.0.1; the pod's is
// its status.podIP(s), which the node sets when it chooses the pod's network
// (127.0.0.1 for a pod in the node's network, and before that). An unsupported
// path or a malformed key subscript is a configError.
func podFieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return "127.0.0.1", nil
	case "status.podIP":
		if pod.Status.PodIP == "" {
			return "127.0.0.1", nil
		}
		return pod.Status.PodIP, nil
	case "status.podIPs":
		ips := make([]string, 0, len(pod.Status.PodIPs))
		for _, ip := range pod.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		if len(ips) == 0 {
			return "127.0.0.1", nil
		}
		return strings.Join(ips, ","), nil
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	}
	if p, key, ok := splitSubscript(path); ok {
		// The kubelet checks annotation keys case-insensitively and label keys as written.
		switch p {
		case "metadata.labels":
			if errs := validation.IsQualifiedName(key); len(errs) > 0 {
				return "", &configError{fmt.Sprintf("field path %q: invalid key subscript: %s", path, strings.Join(errs, "; "))}
			}
			return pod.Labels[key], nil
		case "metadata.annotations":
			if errs := validation.IsQualifiedName(strings.ToLower(key)); len(errs) > 0 {
				return "", &configError{fmt.Sprintf("field path %q: invalid key subscript: %s", path, strings.Join(errs, "; "))}
			}
			return pod.Annotations[key], nil
		}
		return "", &configError{fmt.Sprintf("field path %q does not support a subscript", path)}
	}
	return "", &configError{fmt.Sprintf("unsupported field path %q", path)}
}

// splitSubscript splits "metadata.labels['k']" into "metadata.labels" and "k".
func splitSubscript(path string) (string, string, bool) {
	s, ok := strings.CutSuffix(path, "']")
	if !ok {
		return "", "", false
	}
	p, key, ok := strings.Cut(s, "['")
	if !ok || p == "" {
		return "", "", false
	}
	return p, key, true
}

// formatMap renders a whole label or annotation map as the kubelet does: one
// key="quoted value" per line, sorted by key.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b []byte
	for _, k := range keys {
		if len(b) > 0 {
			b = append(b, '\n')
		}
		b = append(b, k...)
		b = append(b, '=')
		b = strconv.AppendQuote(b, m[k])
	}
	return string(b)
}
