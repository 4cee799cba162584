package podtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubetask/kubetask/pkg/task"
)

// RealisticTask returns a task of the size real ones have: a main container
// ("main") and an envoy-like sidecar ("envoy"), each with ten env vars and a
// field reference, resources, volume mounts, the sidecar with a port and a
// readiness probe; a ConfigMap and an emptyDir volume; template labels and
// annotations of its own. It is defaulted, as Submit defaults a task.
func RealisticTask(name string) *task.Task {
	t := &task.Task{ObjectMeta: metav1.ObjectMeta{Name: name}}
	t.Spec.MainContainer = "main"
	t.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "etl", "app.kubernetes.io/component": "task", "team": "data-platform"}
	t.Spec.Template.Annotations = map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "15090"}
	env := func(prefix string) []corev1.EnvVar {
		var out []corev1.EnvVar
		for i := range 10 {
			out = append(out, corev1.EnvVar{Name: fmt.Sprintf("%s_SETTING_%d", prefix, i), Value: fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", 16))})
		}
		return append(out, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	}
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: "/etc/task"}, {Name: "scratch", MountPath: "/scratch"}}
	t.Spec.Template.Spec.Containers = []corev1.Container{
		{
			Name: "main", Image: "registry.example.com/data-platform/etl:v2.14.1",
			Command:   []string{"/bin/sh", "-c", "python -m etl.run --date $(DATE) --input s3://bucket/input --output s3://bucket/output"},
			Env:       env("MAIN"),
			Resources: res, VolumeMounts: mounts,
		},
		{
			Name: "envoy", Image: "docker.io/envoyproxy/envoy:v1.31.2",
			Args:      []string{"proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local", "--proxyLogLevel=warning"},
			Env:       env("PROXY"),
			Resources: res, VolumeMounts: mounts[:1],
			Ports: []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/healthz/ready", Port: intstr.FromInt32(15021)}}, PeriodSeconds: 2},
		},
	}
	t.Spec.Template.Spec.Volumes = []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "etl-config"}}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	t.Default()
	return t
}

// RunningPod returns the pod of attempt of run id of t (defaulted, as
// RealisticTask's) as a real API server returns it once every container
// runs: task.BuildPod's pod, with what the API server adds at creation
// (defaults, the ServiceAccount admission plugin's projected token volume and
// mounts, the DefaultTolerationSeconds plugin's not-ready and unreachable
// tolerations, uid, resourceVersion, generation, qosClass), a managedFields
// entry for the creating manager (kubetask: metadata and spec) and one for
// the kubelet's status updates, and the status the kubelet reports: phase
// Running, five conditions, host and pod IPs, and per container the resolved
// image, image ID, container ID, started, ready, mounts, resources and user.
// seq makes the uid, resourceVersion, node, IPs and container IDs differ from
// pod to pod (100 pods per node).
func RunningPod(t *task.Task, id task.Identity, attempt, seq int) (*corev1.Pod, error) {
	pod, err := task.BuildPod(t, id, attempt)
	if err != nil {
		return nil, err
	}
	created := metav1.NewTime(T0.Add(time.Duration(seq) * time.Second))
	running := metav1.NewTime(created.Add(3 * time.Second))
	pod.TypeMeta = metav1.TypeMeta{}
	pod.UID = types.UID(uuidOf(seq))
	pod.ResourceVersion = fmt.Sprint(1_000_000 + 3*seq)
	pod.Generation = 1
	pod.CreationTimestamp = created

	spec := &pod.Spec
	tokenVolume := "kube-api-access-" + hashOf("vol", seq)[:5]
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: tokenVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: ptr(int64(3607)), Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace",
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
		DefaultMode: ptr(int32(420)),
	}}})
	for i := range spec.Volumes {
		if cm := spec.Volumes[i].ConfigMap; cm != nil && cm.DefaultMode == nil {
			cm.DefaultMode = ptr(int32(420))
		}
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: tokenVolume, ReadOnly: true, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"})
		if c.TerminationMessagePath == "" {
			c.TerminationMessagePath = corev1.TerminationMessagePathDefault
		}
		if c.TerminationMessagePolicy == "" {
			c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
		}
		if c.ImagePullPolicy == "" {
			c.ImagePullPolicy = corev1.PullIfNotPresent
		}
		for j := range c.Ports {
			if c.Ports[j].Protocol == "" {
				c.Ports[j].Protocol = corev1.ProtocolTCP
			}
		}
		for j := range c.Env {
			if f := c.Env[j].ValueFrom; f != nil && f.FieldRef != nil && f.FieldRef.APIVersion == "" {
				f.FieldRef.APIVersion = "v1"
			}
		}
		if p := c.ReadinessProbe; p != nil {
			p.TimeoutSeconds, p.SuccessThreshold, p.FailureThreshold = 1, 1, 3
			if p.HTTPGet != nil && p.HTTPGet.Scheme == "" {
				p.HTTPGet.Scheme = corev1.URISchemeHTTP
			}
		}
	}
	spec.DNSPolicy = corev1.DNSClusterFirst
	spec.TerminationGracePeriodSeconds = ptr(int64(30))
	spec.SecurityContext = &corev1.PodSecurityContext{}
	spec.SchedulerName = corev1.DefaultSchedulerName
	spec.ServiceAccountName, spec.DeprecatedServiceAccount = "default", "default"
	spec.EnableServiceLinks = ptr(true)
	spec.Priority = ptr(int32(0))
	spec.PreemptionPolicy = ptr(corev1.PreemptLowerPriority)
	spec.Tolerations = append(spec.Tolerations,
		corev1.Toleration{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
		corev1.Toleration{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))})
	spec.NodeName = fmt.Sprintf("worker-%03d.cluster.example.com", seq/100)

	hostIP := fmt.Sprintf("10.0.%d.%d", seq/100/250, seq/100%250+1)
	podIP := fmt.Sprintf("10.244.%d.%d", seq/250, seq%250+2)
	st := &pod.Status
	st.Phase = corev1.PodRunning
	st.ObservedGeneration = 1
	for _, c := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: running})
	}
	st.Conditions[len(st.Conditions)-1].LastTransitionTime = created
	st.HostIP, st.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
	st.PodIP, st.PodIPs = podIP, []corev1.PodIP{{IP: podIP}}
	st.StartTime = &created
	st.QOSClass = corev1.PodQOSBurstable
	for _, c := range spec.Containers {
		image := c.Image
		if !strings.Contains(image, "/") {
			image = "docker.io/library/" + image
		}
		repo, _, _ := strings.Cut(image, ":")
		var mounts []corev1.VolumeMountStatus
		for _, m := range c.VolumeMounts {
			mounts = append(mounts, corev1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly,
				RecursiveReadOnly: ptr(corev1.RecursiveReadOnlyDisabled)})
		}
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: running}},
			Ready: true, Started: ptr(true),
			Image: image, ImageID: repo + "@sha256:" + hashOf(repo, 0), ContainerID: "containerd://" + hashOf(c.Name, seq),
			VolumeMounts: mounts, Resources: c.Resources.DeepCopy(),
			User: &corev1.ContainerUser{Linux: &corev1.LinuxContainerUser{UID: 1000, GID: 1000, SupplementalGroups: []int64{1000}}},
		})
	}

	pod.ManagedFields = []metav1.ManagedFieldsEntry{
		managedFields("kubetask", "", created, pod, "metadata", "spec"),
		managedFields("kubelet", "status", running, pod, "status"),
	}
	return pod, nil
}

// managedFields is the entry the API server records for manager's update of
// the given top-level fields of pod, as a FieldsV1 set.
func managedFields(manager, subresource string, at metav1.Time, pod *corev1.Pod, fields ...string) metav1.ManagedFieldsEntry {
	b, err := json.Marshal(pod)
	if err != nil {
		panic(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		panic(err)
	}
	set := map[string]any{}
	for _, f := range fields {
		v := doc[f]
		if f == "metadata" {
			m := doc[f].(map[string]any)
			v = map[string]any{"labels": m["labels"], "annotations": m["annotations"], "finalizers": m["finalizers"]}
		}
		if f == "status" {
			s := doc[f].(map[string]any)
			delete(s, "qosClass") // the API server's, at creation
		}
		set["f:"+f] = fieldSet(f, v, false)
	}
	raw, err := json.Marshal(set)
	if err != nil {
		panic(err)
	}
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		Time: &at, FieldsType: "FieldsV1", FieldsV1: fieldsV1(raw), Subresource: subresource}
}

// listKeys are the keys of the associative lists of a pod, by field name.
var listKeys = map[string][]string{
	"containers": {"name"}, "initContainers": {"name"}, "env": {"name"}, "volumes": {"name"},
	"volumeMounts": {"mountPath"}, "ports": {"containerPort", "protocol"}, "conditions": {"type"},
	"podIPs": {"ip"}, "hostIPs": {"ip"},
}

// fieldSet is v (decoded JSON) as a FieldsV1 set: objects and associative
// lists by their members with "." for the node itself, sets of scalars
// (finalizers) by value, atomic lists and scalars as leaves.
func fieldSet(name string, v any, dot bool) map[string]any {
	out := map[string]any{}
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			return out
		}
		if dot {
			out["."] = map[string]any{}
		}
		for k, e := range v {
			if e != nil {
				out["f:"+k] = fieldSet(k, e, true)
			}
		}
	case []any:
		keys, assoc := listKeys[name]
		switch {
		case name == "finalizers":
			out["."] = map[string]any{}
			for _, e := range v {
				b, _ := json.Marshal(e)
				out["v:"+string(b)] = map[string]any{}
			}
		case assoc:
			out["."] = map[string]any{}
			for _, e := range v {
				m, _ := e.(map[string]any)
				key := map[string]any{}
				for _, k := range keys {
					if kv, ok := m[k]; ok {
						key[k] = kv
					}
				}
				b, _ := json.Marshal(key) // sorted keys, as the API server writes them
				out["k:"+string(b)] = fieldSet("", e, true)
			}
		}
	}
	return out
}

func hashOf(s string, n int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", s, n)))
	return hex.EncodeToString(sum[:])
}

func uuidOf(n int) string {
	h := hashOf("uid", n)
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

func fieldsV1(raw []byte) *metav1.FieldsV1 {
	var f metav1.FieldsV1
	f.SetRawBytes(raw)
	return &f
}
