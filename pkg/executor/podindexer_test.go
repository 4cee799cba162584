package executor

import (
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubetask/kubetask/pkg/task"
)

// TestPodIndexer checks the run index of podIndexer against what
// client-go's indexer with indexByRun's function answers, after each step of
// a table of changes: a task's first pod, its second, a pod that changes
// task, one deleted, a tombstone, a pod with no run, a Replace; and its
// counts of pods by namespace against the keys'.
func TestPodIndexer(t *testing.T) {
	pod := func(name, run, rv string) *cachedPod {
		ns := "ns"
		if strings.HasPrefix(name, "b-") {
			ns = "other" // b's pods: another namespace, for the counts
		}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
		if run != "" {
			p.Labels = map[string]string{task.LabelRun: run}
			p.Annotations = map[string]string{task.AnnotationRun: run}
		}
		return compactPod(p)
	}
	type step struct {
		op   string // add, update, delete, tombstone, replace
		pods []*cachedPod
	}
	steps := []step{
		{"add", []*cachedPod{pod("a-0", "a", "1")}},
		{"add", []*cachedPod{pod("b-0", "b", "2")}},
		{"add", []*cachedPod{pod("a-1", "a", "3")}},       // a second pod of a
		{"update", []*cachedPod{pod("a-0", "a", "4")}},    // a's first, newer
		{"add", []*cachedPod{pod("a-2", "a", "5")}},       // a third
		{"update", []*cachedPod{pod("a-1", "c", "6")}},    // moves from a to c
		{"delete", []*cachedPod{pod("a-0", "a", "7")}},    // a has one left
		{"add", []*cachedPod{pod("stray", "", "8")}},      // no run: not indexed
		{"tombstone", []*cachedPod{pod("a-2", "a", "9")}}, // a has none
		{"delete", []*cachedPod{pod("gone", "a", "10")}},  // not cached: nothing
		{"replace", []*cachedPod{pod("b-0", "b", "11"), pod("b-1", "b", "12"), pod("d-0", "d", "13")}},
		{"update", []*cachedPod{pod("b-1", "d", "14")}},
	}
	got := newPodIndexer()
	want := cache.NewIndexer(podKey, cache.Indexers{runIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*cachedPod); ok && p.run() != "" {
			return []string{p.run()}, nil
		}
		return nil, nil
	}})
	names := func(objs []any) []string {
		var out []string
		for _, o := range objs {
			p := o.(*cachedPod)
			out = append(out, p.name()+"@"+p.resourceVersion)
		}
		slices.Sort(out)
		return out
	}
	for i, s := range steps {
		for _, idx := range []cache.Indexer{got, want} {
			var err error
			switch s.op {
			case "add":
				err = idx.Add(s.pods[0])
			case "update":
				err = idx.Update(s.pods[0])
			case "delete":
				err = idx.Delete(s.pods[0])
			case "tombstone":
				err = idx.Delete(cache.DeletedFinalStateUnknown{Key: s.pods[0].key(), Obj: s.pods[0]})
			case "replace":
				objs := make([]any, len(s.pods))
				for j, p := range s.pods {
					objs[j] = p
				}
				err = idx.Replace(objs, "")
			}
			if err != nil {
				t.Fatalf("step %d (%s): %v", i, s.op, err)
			}
		}
		for _, run := range []string{"a", "b", "c", "d", ""} {
			g, err := got.ByIndex(runIndex, run)
			if err != nil {
				t.Fatal(err)
			}
			w, _ := want.ByIndex(runIndex, run)
			if !slices.Equal(names(g), names(w)) {
				t.Errorf("step %d (%s %s): pods of %q = %v, client-go's index says %v", i, s.op, s.pods[0].name(), run, names(g), names(w))
			}
		}
		if g, w := got.ListKeys(), want.ListKeys(); !slices.Equal(slices.Sorted(slices.Values(g)), slices.Sorted(slices.Values(w))) {
			t.Errorf("step %d: keys %v, want %v", i, g, w)
		}
		// The counts by namespace are the keys' (what the slots count).
		wantNS := map[string]int{}
		for _, k := range want.ListKeys() {
			ns, _, _ := strings.Cut(k, "/")
			wantNS[ns]++
		}
		gotNS := map[string]int{}
		got.addCounts(gotNS)
		if !maps.Equal(gotNS, wantNS) || got.count() != len(want.ListKeys()) {
			t.Errorf("step %d (%s): counts by namespace %v (%d in all), want %v (%d)", i, s.op, gotNS, got.count(), wantNS, len(want.ListKeys()))
		}
	}
	if len(got.one)+len(got.more) != 2 || got.one["b"] == nil || len(got.more["d"]) != 2 {
		t.Errorf("index maps at the end: one %v, more %v; want b's one pod and d's two", got.one, got.more)
	}
	if _, err := got.ByIndex("other", "a"); err == nil {
		t.Error("ByIndex of another index: no error")
	}
}
