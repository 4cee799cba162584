package serve

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// logPayload is what a test container writes: lines from 1 byte to 300 KiB
// (over the runtime's 16 KiB record, so split into partial records), empty
// lines, UTF-8, CR characters (not before a newline: the runtime turns CRLF
// into LF), tabs, text that looks like a timestamp, and a last line without
// a newline.
func logPayload() []byte {
	var b bytes.Buffer
	pattern := bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz0123456789 é✓\r\t"), 8000)
	for _, n := range []int{1, 2, 0, 100, 4095, 4096, 4097, 0, 16383, 16384, 16385, 65536, 1, 300 << 10, 7, 3} {
		b.Write(pattern[:n])
		b.WriteByte('\n')
	}
	b.WriteString("\r\rcarriage returns\r in\rthe middle\r and at the end\r\t\n")
	b.WriteString("2026-01-02T03:04:05.000000000Z looks like a kubelet timestamp\n")
	b.WriteString("UTF-8: héllo wörld ✓ 日本語 🚀\n\n\n")
	b.WriteString("the last line, without a newline ✓\r")
	return b.Bytes()
}

// gatedTask writes part1 of payload, waits for the file gate, writes part2
// and exits 0. It returns the task document and the gate's path.
func gatedTask(t *testing.T, name string, part1, part2 []byte) ([]byte, string) {
	t.Helper()
	dir := t.TempDir()
	for f, b := range map[string][]byte{"p1": part1, "p2": part2} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The shell's own stderr goes nowhere: on SIGTERM it reports its killed
	// sleep ("Terminated"), which would be part of the log.
	script := fmt.Sprintf(`exec 2>/dev/null; d=%s; cat $d/p1; while [ ! -e $d/gate ]; do sleep 0.05; done; cat $d/p2`, dir)
	return taskDoc(name, "", fmt.Sprintf(`      containers:
        - {name: main, image: busybox, command: [sh, -c, %q]}`, script)), filepath.Join(dir, "gate")
}

// checkLog fails unless the archived log of the task's attempt 0 is
// complete and equals want, byte for byte.
func checkLog(t *testing.T, s *service, id string, attempt int, want []byte) {
	t.Helper()
	got, complete := s.log(id, attempt)
	if !complete {
		t.Errorf("the archived log of %s is not complete", id)
	}
	if i := firstDifference(want, got); i >= 0 {
		lo := max(i-40, 0)
		t.Errorf("the archived log of attempt %d differs from the container's output at byte %d (got %d bytes, want %d):\ngot  %q\nwant %q",
			attempt, i, len(got), len(want), got[lo:min(i+40, len(got))], want[lo:min(i+40, len(want))])
	}
}

// waitArchived waits until the archive of the task's attempt 0 holds the
// whole lines of part (the runtime writes a line's last piece to the node's
// log only with its newline, or when the container's output ends).
func waitArchived(t *testing.T, s *service, id string, attempt int, part []byte) {
	t.Helper()
	whole := part[:bytes.LastIndexByte(part, '\n')+1]
	eventually(t, time.Minute, fmt.Sprintf("%d bytes in the archive", len(whole)), func() bool {
		got, _ := s.log(id, attempt)
		return len(got) >= len(whole)
	})
}

// firstDifference returns the first offset where a and b differ, -1 if equal.
func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// waitPodGone waits until the task's pod of attempt 0 is gone from the API.
func waitPodGone(t *testing.T, env *clustertest.Env, pod string) {
	t.Helper()
	eventually(t, 2*time.Minute, "pod "+pod+" to be gone", func() bool {
		_, err := env.Client.CoreV1().Pods(env.Namespace).Get(context.Background(), pod, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// podOf waits for the pod of the task's attempt n and returns its name.
func podOf(s *service, id string, n int) string {
	tk := s.waitTask(id, time.Minute, fmt.Sprintf("the pod of attempt %d", n), func(tk api.Task) bool { return len(tk.Attempts) > n && tk.Attempts[n].Pod != "" })
	return tk.Attempts[n].Pod
}

// oneOutcome fails unless the watch from cursor shows exactly
// one terminal event for the task, and the task is terminal with attempts
// attempts.
func oneOutcome(t *testing.T, s *service, id, cursor string, attempts int) api.Task {
	t.Helper()
	tk := s.waitTask(id, 2*time.Minute, "the task's outcome", func(tk api.Task) bool { return tk.Terminal })
	var terminal []api.Event
	for _, ev := range s.events(id, cursor, 30*time.Second) {
		if ev.Terminal {
			terminal = append(terminal, ev)
		}
	}
	if len(terminal) != 1 {
		t.Errorf("%d terminal events for %s, want 1: %+v", len(terminal), id, terminal)
	}
	if len(tk.Attempts) != attempts || tk.Attempt != attempts-1 {
		t.Errorf("task %s: attempt %d, %d attempts; want %d", id, tk.Attempt, len(tk.Attempts), attempts)
	}
	return tk
}

// A pod force-deleted (`kubectl delete --force --grace-period=0`) and a pod
// evicted, each in the middle of its log: the archive of that attempt holds
// exactly what its container wrote, after the pod is gone; the task is
// retried (an infrastructure failure), the retry writes its whole log, and
// the task has one outcome.
func TestServeLogsSurviveDeletionAndEviction(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	payload := logPayload()
	cut := bytes.Index(payload, bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz0123456789 é✓\r\t"), 1600)) + 40000 // inside the 300 KiB line
	part1 := payload[:cut]

	for _, tc := range []struct {
		name   string
		remove func(pod string) error
	}{
		{"force-deleted", func(pod string) error {
			zero := int64(0)
			return env.Client.CoreV1().Pods(env.Namespace).Delete(context.Background(), pod, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}},
		{"evicted", func(pod string) error {
			return env.Client.CoreV1().Pods(env.Namespace).EvictV1(context.Background(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: env.Namespace}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := s.with(t)
			doc, gate := gatedTask(t, tc.name, part1, payload[cut:])
			cursor := s.cursor()
			tk := s.submit(doc)
			pod := podOf(s, tk.ID, 0)
			waitArchived(t, s, tk.ID, 0, part1)
			if err := tc.remove(pod); err != nil {
				t.Fatal(err)
			}
			waitPodGone(t, env, pod)
			first := s.waitTask(tk.ID, time.Minute, "the first attempt's outcome", func(tk api.Task) bool {
				return len(tk.Attempts) > 0 && tk.Attempts[0].FinishedAt != nil
			}).Attempts[0]
			t.Logf("attempt 0, pod %s: %s/%s %s", tc.name, first.Phase, first.Reason, first.Message)
			if first.Phase == "Succeeded" {
				t.Errorf("an attempt whose pod was %s before its main container finished succeeded", tc.name)
			}
			checkLog(t, s, tk.ID, 0, part1)

			// The retry runs the task again: its container finds the gate open.
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			tk = oneOutcome(t, s, tk.ID, cursor, 2)
			if tk.Phase != "Succeeded" {
				t.Errorf("task %s/%s %s, want Succeeded", tk.Phase, tk.Reason, tk.Message)
			}
			checkLog(t, s, tk.ID, 0, part1)
			checkLog(t, s, tk.ID, 1, payload)
		})
	}
}

// kubetask serve stopped in the middle of a log (SIGTERM: it leaves the pod
// under its finalizer; SIGKILL), the container writing the rest and ending
// while no service runs, the service started again: it adopts the pod, the
// archive goes on where it ended (no gap, no duplicate), and the task has
// one outcome.
func TestServeLogsSurviveServiceStop(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	payload := logPayload()
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			s := s.with(t)
			cut := len(payload) / (3 + i)
			doc, gate := gatedTask(t, fmt.Sprintf("stopped-%d", i), payload[:cut], payload[cut:])
			tk := s.submit(doc)
			pod := podOf(s, tk.ID, 0)
			waitArchived(t, s, tk.ID, 0, payload[:cut])
			s.stop(sig)
			if p, err := env.Client.CoreV1().Pods(env.Namespace).Get(context.Background(), pod, metav1.GetOptions{}); err != nil || len(p.Finalizers) == 0 {
				t.Fatalf("after %v the pod is gone or has no finalizer: %v", sig, err)
			}

			// The container writes the rest and exits while nobody captures.
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, time.Minute, "the pod to succeed", func() bool {
				p, err := env.Client.CoreV1().Pods(env.Namespace).Get(context.Background(), pod, metav1.GetOptions{})
				return err == nil && p.Status.Phase == "Succeeded"
			})
			s.start()
			tk = s.waitTask(tk.ID, 2*time.Minute, "the task's outcome", func(tk api.Task) bool { return tk.Terminal })
			if tk.Phase != "Succeeded" || len(tk.Attempts) != 1 {
				t.Errorf("task %s/%s with %d attempts, want Succeeded with one", tk.Phase, tk.Reason, len(tk.Attempts))
			}
			waitPodGone(t, env, pod)
			checkLog(t, s, tk.ID, 0, payload)
		})
	}
}
