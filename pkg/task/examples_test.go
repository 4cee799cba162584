package task_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// Every file in examples/ is a task Load accepts.
func TestExamplesLoad(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			tk, err := task.Load(r)
			if err != nil {
				t.Fatalf("Load(%s): %v", f, err)
			}
			if _, err := task.BuildPod(tk, task.Identity{Namespace: "jobs", Name: tk.Name, RunID: "r1", Executor: "e1"}, 0); err != nil {
				t.Fatalf("BuildPod: %v", err)
			}
		})
	}
}
