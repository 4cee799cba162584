package executor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// The test binary doubles as an executor process: with childEnv set,
// TestMain runs runChild instead of the tests.
const (
	childEnv        = "KUBETASK_TEST_EXECUTOR_CHILD"
	childKubeconfig = "KUBETASK_TEST_KUBECONFIG"
	childNamespace  = "KUBETASK_TEST_NAMESPACE"
	childStore      = "KUBETASK_TEST_STORE"
	childTasks      = "KUBETASK_TEST_TASKS"
	childEvents     = "KUBETASK_TEST_EVENTS"
)

// runChild runs an executor with a SQLite store until SIGTERM, submitting
// the tasks of the tasks file (again after a restart: Submit is idempotent)
// and appending every event as a JSON line to the events file.
func runChild() int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "executor child:", err); return 1 }
	rc, err := clientcmd.BuildConfigFromFlags("", os.Getenv(childKubeconfig))
	if err != nil {
		return fail(err)
	}
	st, err := store.OpenSQLite(ctx, os.Getenv(childStore))
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	data, err := os.ReadFile(os.Getenv(childTasks))
	if err != nil {
		return fail(err)
	}
	var tasks map[string]*task.Task
	if err := json.Unmarshal(data, &tasks); err != nil {
		return fail(err)
	}
	out, err := os.OpenFile(os.Getenv(childEvents), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	var mu sync.Mutex
	ns := os.Getenv(childNamespace)
	ex, err := executor.New(executor.Config{
		RESTConfig: rc, InstanceID: "crashy", Namespaces: []string{ns}, DefaultNamespace: ns, Store: st,
		QPS: 200, Burst: 400,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		OnEvent: func(ev executor.Event) {
			line, _ := json.Marshal(ev)
			mu.Lock()
			out.Write(append(line, '\n'))
			mu.Unlock()
		},
	})
	if err != nil {
		return fail(err)
	}
	for id, t := range tasks {
		if _, err := ex.Submit(ctx, id, t); err != nil {
			return fail(err)
		}
	}
	if err := ex.Start(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// child is one executor process.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startChild(t *testing.T, env []string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.signal(syscall.SIGKILL) })
	return c
}

func (c *child) signal(sig syscall.Signal) {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
	}
}

// readEvents parses the events file.
func readEvents(t *testing.T, path string) []executor.Event {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []executor.Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev executor.Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil { // a torn last line after SIGKILL is skipped
			evs = append(evs, ev)
		}
	}
	return evs
}

// TestExecutorKilledAndRestarted: an executor process is SIGKILLed while
// tasks run, tasks finish while it is down, and a new process with the same
// instance ID and SQLite store finishes the job: no duplicate pod, every task
// recorded exactly once with the right outcome, no report twice, no pod left.
func TestExecutorKilledAndRestarted(t *testing.T) {
	env := clustertest.New(t)
	dir := t.TempDir()
	specs := map[string]simSpec{}
	tasks := map[string]*task.Task{}
	for i := 0; i < 30; i++ {
		id := fmt.Sprintf("k%02d", i)
		specs[id] = simSpec{delay: time.Duration(2+i) * time.Second, code: []int{0, 1, 0}[i%3]}
		tasks[id] = specs[id].task(id)
	}
	data, err := json.Marshal(tasks)
	if err != nil {
		t.Fatal(err)
	}
	tasksFile, eventsFile, storeFile := filepath.Join(dir, "tasks.json"), filepath.Join(dir, "events.jsonl"), filepath.Join(dir, "tasks.db")
	if err := os.WriteFile(tasksFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	childEnvs := []string{childEnv + "=1", childKubeconfig + "=" + env.Kubeconfig, childNamespace + "=" + env.Namespace,
		childStore + "=" + storeFile, childTasks + "=" + tasksFile, childEvents + "=" + eventsFile}

	// Every pod name the API server ever shows, per task.
	podNames := map[string]map[string]bool{}
	var mu sync.Mutex
	factory := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(env.Namespace))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		p := obj.(*corev1.Pod)
		mu.Lock()
		defer mu.Unlock()
		id := p.Labels[task.LabelRun]
		if podNames[id] == nil {
			podNames[id] = map[string]bool{}
		}
		podNames[id][p.Name] = true
	}})
	ictx, icancel := context.WithCancel(context.Background())
	defer icancel()
	factory.Start(ictx.Done())

	first := startChild(t, childEnvs)
	terminalCount := func() int {
		n := 0
		for _, ev := range readEvents(t, eventsFile) {
			if ev.Terminal {
				n++
			}
		}
		return n
	}
	clustertest.Eventually(t, 2*time.Minute, "a few tasks finished", func(context.Context) error {
		if n := terminalCount(); n < 5 {
			return fmt.Errorf("%d terminal", n)
		}
		return nil
	})
	first.signal(syscall.SIGKILL)
	killedAt := terminalCount()
	t.Logf("executor SIGKILLed after %d terminal reports", killedAt)

	// Let more main containers finish while no executor runs.
	clustertest.Eventually(t, time.Minute, "tasks finish while the executor is down", func(ctx context.Context) error {
		pods, err := env.Client.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: task.ManagedSelector().String()})
		if err != nil {
			return err
		}
		done := 0
		for i := range pods.Items {
			if podstate.Derive(&pods.Items[i], podstate.Policy{MainContainer: "main"}, time.Now()).Terminal() {
				done++
			}
		}
		if done < 3 {
			return fmt.Errorf("%d finished pods waiting", done)
		}
		return nil
	})

	second := startChild(t, childEnvs)
	st, err := store.OpenSQLite(context.Background(), storeFile)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clustertest.Eventually(t, 3*time.Minute, "every task recorded terminal", func(ctx context.Context) error {
		recs, err := st.List(ctx, store.ListOptions{NonTerminal: true})
		if err != nil {
			return err
		}
		all, err := st.List(ctx, store.ListOptions{})
		if err != nil {
			return err
		}
		if len(all) != len(specs) || len(recs) > 0 {
			return fmt.Errorf("%d of %d records, %d not terminal", len(all), len(specs), len(recs))
		}
		return nil
	})
	exectest.WaitNoTaskPods(t, env, 2*time.Minute)
	second.signal(syscall.SIGTERM)

	terminal := map[string]int{}
	for _, ev := range readEvents(t, eventsFile) {
		if ev.Terminal {
			terminal[ev.ID]++
		}
	}
	for id, s := range specs {
		rec := exectest.Record(t, st, id)
		phase, code := s.want()
		if len(rec.Attempts) != 1 || podstate.Phase(rec.Phase) != phase || rec.ExitCode == nil || *rec.ExitCode != code {
			t.Errorf("%s: record %s exit %v attempts %d, want %s exit %d once", id, rec.Phase, rec.ExitCode, len(rec.Attempts), phase, code)
		}
		if terminal[id] > 1 {
			t.Errorf("%s reported terminal %d times", id, terminal[id])
		}
		mu.Lock()
		if n := len(podNames[id]); n != 1 {
			t.Errorf("%s had %d pods: %v", id, n, podNames[id])
		}
		mu.Unlock()
	}
	missing := 0
	for id := range specs {
		if terminal[id] == 0 {
			missing++
		}
	}
	// A report can only be missing if the kill fell between the durable
	// write and the event line; the store has those outcomes.
	if missing > 1 {
		t.Errorf("%d tasks have no terminal event line; at most the one in flight at the SIGKILL may", missing)
	}
}
