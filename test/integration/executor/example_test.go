package executor_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/task"
)

// Example embeds the executor: run it, submit a task, wait for its outcome.
func Example() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		panic(err)
	}
	done := make(chan executor.Event, 1)
	ex, err := executor.New(executor.Config{RESTConfig: cfg, InstanceID: "example",
		OnEvent: func(ev executor.Event) {
			if ev.Terminal {
				done <- ev
			}
		}})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ex.Start(ctx)
	t, err := task.Load(strings.NewReader(`{"apiVersion": "kubetask.dev/v1alpha1", "kind": "Task",
	  "metadata": {"name": "hello"},
	  "spec": {"template": {"spec": {
	    "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "echo hello; exit 3"]}]}}}}`))
	if err != nil {
		panic(err)
	}
	if _, err := ex.Submit(ctx, "hello-1", t); err != nil {
		panic(err)
	}
	ev := <-done
	fmt.Println(ev.Phase, ev.Reason, *ev.ExitCode)
	// Output: Failed ExitCode 3
}
