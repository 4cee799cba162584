// Command importcheck uses one exported identifier of each kubetask library package,
// so that building it proves another module can import them (see check.sh).
package main

import (
	"fmt"
	"os"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/logcapture"
	"github.com/kubetask/kubetask/pkg/podlog"
	"github.com/kubetask/kubetask/pkg/runner"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

var (
	_ api.Task
	_ client.Client
	_ executor.Config
	_ logcapture.Config
	_ podlog.Config
	_ runner.Options
	_ store.Store
)

const doc = `apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata: {name: hello}
spec:
  template:
    spec:
      containers: [{name: main, image: busybox:1.37, command: [echo, hello]}]
`

func main() {
	t, err := task.Parse([]byte(doc))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(t.Name)
}
