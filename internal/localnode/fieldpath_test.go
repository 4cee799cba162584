package localnode

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodFieldValue lists every field path the kubelet resolves in an env fieldRef or
// a downwardAPI volume item, and the paths it rejects.
func TestPodFieldValue(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "p1", Namespace: "ns1", UID: "uid-1",
			Labels:      map[string]string{"app": "etl", "example.com/tier": "batch"},
			Annotations: map[string]string{"note": `say "hi"`, "Example.com/Mixed": "m"},
		},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "runner"},
	}
	cases := map[string]struct {
		path    string
		own     bool // the pod has a network of its own, address 10.244.7.3
		want    string
		wantErr bool
	}{
		"name":                       {path: "metadata.name", want: "p1"},
		"namespace":                  {path: "metadata.namespace", want: "ns1"},
		"uid":                        {path: "metadata.uid", want: "uid-1"},
		"one label":                  {path: "metadata.labels['app']", want: "etl"},
		"a prefixed label":           {path: "metadata.labels['example.com/tier']", want: "batch"},
		"a missing label is empty":   {path: "metadata.labels['nope']", want: ""},
		"one annotation":             {path: "metadata.annotations['note']", want: `say "hi"`},
		"an upper-case annotation":   {path: "metadata.annotations['Example.com/Mixed']", want: "m"},
		"every label, sorted":        {path: "metadata.labels", want: "app=\"etl\"\nexample.com/tier=\"batch\""},
		"every annotation, quoted":   {path: "metadata.annotations", want: "Example.com/Mixed=\"m\"\nnote=\"say \\\"hi\\\"\""},
		"node name":                  {path: "spec.nodeName", want: "node-1"},
		"service account":            {path: "spec.serviceAccountName", want: "runner"},
		"host IP":                    {path: "status.hostIP", want: "127.0.0.1"},
		"host IPs":                   {path: "status.hostIPs", want: "127.0.0.1"},
		"pod IP":                     {path: "status.podIP", want: "127.0.0.1"},
		"pod IPs":                    {path: "status.podIPs", want: "127.0.0.1"},
		"own pod IP":                 {path: "status.podIP", own: true, want: "10.244.7.3"},
		"own pod IPs":                {path: "status.podIPs", own: true, want: "10.244.7.3"},
		"host IP with an own pod IP": {path: "status.hostIP", own: true, want: "127.0.0.1"},
		"an invalid label key":       {path: "metadata.labels['a b']", wantErr: true},
		"an invalid annotation key":  {path: "metadata.annotations['-x']", wantErr: true},
		"a subscript elsewhere":      {path: "metadata.name['x']", wantErr: true},
		"an unsupported path":        {path: "spec.hostname", wantErr: true},
		"an empty path":              {path: "", wantErr: true},
		"a subscript without a path": {path: "['app']", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pod := pod.DeepCopy()
			if tc.own {
				pod.Status.PodIP, pod.Status.PodIPs = "10.244.7.3", []corev1.PodIP{{IP: "10.244.7.3"}}
			}
			got, err := podFieldValue(pod, tc.path)
			if tc.wantErr {
				var ce *configError
				if !errors.As(err, &ce) {
					t.Fatalf("podFieldValue(%q) = %q, %v; want a configError", tc.path, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("podFieldValue(%q) = %q, %v; want %q", tc.path, got, err, tc.want)
			}
		})
	}
}
