package executor

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/internal/podtest"
	"github.com/kubetask/kubetask/pkg/task"
)

var benchPods = flag.Int("podcache.pods", 10_000, "pods BenchmarkPodCacheMemory caches")

// BenchmarkPodCacheMemory measures the heap a pod cache holds per pod for
// podcache.pods realistic running task pods (podtest.RunningPod of
// podtest.RealisticTask: 9.4 KB in protobuf, 12.6 KB in JSON), each decoded
// from the wire as the informer decodes it (protobuf, which the executor's
// client uses for pods, and JSON), transformed, and stored in a cache.Indexer
// with the executor's key function and run index. B/pod is the heap after
// two GCs with the pods cached minus the heap before. Variants: whole pods
// (no transform), podstate.Trim as it was before issue 13 (trimBefore13), a
// fresh *corev1.Pod with only what the executor reads (cachedPod.pod), and
// cachedPod, which the executor caches; "alone" is without the indexer.
//
//	go test -run '^$' -bench BenchmarkPodCacheMemory -benchtime 1x ./pkg/executor
func BenchmarkPodCacheMemory(b *testing.B) {
	n := *benchPods
	tk := podtest.RealisticTask("etl")
	codecs := []struct {
		name   string
		encode func(*corev1.Pod) ([]byte, error)
		decode func([]byte) (*corev1.Pod, error)
	}{
		{"protobuf", func(p *corev1.Pod) ([]byte, error) { return p.Marshal() },
			func(b []byte) (*corev1.Pod, error) { p := &corev1.Pod{}; return p, p.Unmarshal(b) }},
		{"json", func(p *corev1.Pod) ([]byte, error) { return json.Marshal(p) },
			func(b []byte) (*corev1.Pod, error) { p := &corev1.Pod{}; return p, json.Unmarshal(b, p) }},
	}
	byRunOfPod := func() cache.Indexer {
		return cache.NewIndexer(podKey, cache.Indexers{runIndex: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok && p.Labels[task.LabelRun] != "" {
				return []string{p.Labels[task.LabelRun]}, nil
			}
			return nil, nil
		}})
	}
	variants := []struct {
		name      string
		transform func(*corev1.Pod) any
		store     func() cache.Indexer // nil: not in an indexer
	}{
		{"whole", func(p *corev1.Pod) any { return p }, byRunOfPod},
		{"trimBefore13", func(p *corev1.Pod) any { trimBefore13(p); return p }, byRunOfPod},
		{"compactCorev1Pod", func(p *corev1.Pod) any { return compactPod(p).pod() }, byRunOfPod},
		{"cachedPod", func(p *corev1.Pod) any { return compactPod(p) }, func() cache.Indexer { return newPodIndexer() }},
		{"cachedPodAlone", func(p *corev1.Pod) any { return compactPod(p) }, nil},
	}
	var table []string
	for _, codec := range codecs {
		wire := make([][]byte, n)
		for i := range wire {
			id := task.Identity{Namespace: "data", Name: fmt.Sprintf("etl-%05d", i), RunID: fmt.Sprintf("r-%05d", i), Executor: "kubetask-0"}
			tk.Name = id.Name
			pod, err := podtest.RunningPod(tk, id, 0, i)
			if err != nil {
				b.Fatal(err)
			}
			if wire[i], err = codec.encode(pod); err != nil {
				b.Fatal(err)
			}
		}
		row := []string{fmt.Sprintf("%-8s", codec.name)}
		for _, v := range variants {
			b.Run(codec.name+"/"+v.name, func(b *testing.B) {
				var perPod float64
				for b.Loop() {
					held := make([]any, n)
					var idx cache.Indexer
					if v.store != nil {
						idx = v.store()
					}
					before := heapAfterGC()
					for i, raw := range wire {
						pod, err := codec.decode(raw)
						if err != nil {
							b.Fatal(err)
						}
						obj := v.transform(pod)
						if idx == nil {
							held[i] = obj
						} else if err := idx.Add(obj); err != nil {
							b.Fatal(err)
						}
					}
					after := heapAfterGC()
					if idx != nil && len(idx.ListKeys()) != n {
						b.Fatalf("%d pods cached, want %d", len(idx.ListKeys()), n)
					}
					runtime.KeepAlive(held)
					runtime.KeepAlive(idx)
					perPod = float64(int64(after)-int64(before)) / float64(n)
				}
				b.ReportMetric(perPod, "B/pod")
				row = append(row, fmt.Sprintf("%8.0f", perPod))
			})
		}
		table = append(table, strings.Join(row, " | "))
	}
	var head []string
	for _, v := range variants {
		head = append(head, v.name)
	}
	fmt.Fprintf(os.Stderr, "heap per pod (bytes), %d realistic running pods:\ncodec    | %s\n%s\n", n, strings.Join(head, " | "), strings.Join(table, "\n"))
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// trimBefore13 is podstate.Trim as the executor's pod caches used it before
// issue 13 (cachedPod replaced it), kept for the comparison.
func trimBefore13(pod *corev1.Pod) {
	pod.ManagedFields = nil
	pod.Spec.Volumes = nil
	pod.Spec.Tolerations = nil
	pod.Spec.Affinity = nil
	pod.Spec.NodeSelector = nil
	pod.Spec.SecurityContext = nil
	pod.Spec.TopologySpreadConstraints = nil
	pod.Spec.ImagePullSecrets = nil
	trim := func(cs []corev1.Container) []corev1.Container {
		if cs == nil {
			return nil
		}
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Image: c.Image, RestartPolicy: c.RestartPolicy, RestartPolicyRules: c.RestartPolicyRules,
				TerminationMessagePath: c.TerminationMessagePath, TerminationMessagePolicy: c.TerminationMessagePolicy}
		}
		return out
	}
	pod.Spec.Containers = trim(pod.Spec.Containers)
	pod.Spec.InitContainers = trim(pod.Spec.InitContainers)
	pod.Spec.EphemeralContainers = nil
	delete(pod.Annotations, corev1.LastAppliedConfigAnnotation)
}
