package e2eweb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// row is the JavaScript expression of the list's row of task id.
func row(id string) string {
	return fmt.Sprintf(`document.querySelector('tr[data-id=%s]')`, jsString(id))
}

// count is the JavaScript expression of the list's count of phase.
func count(phase string) string {
	return fmt.Sprintf(`document.querySelector('[data-count=%s] strong')?.textContent`, phase)
}

// Tasks submitted through the API show up in the list and change state
// there as they run, without a reload; the counts follow. A failed task's
// page says why, with its log. Cancel on a running task's page stops it;
// rerun on the finished task creates a new task whose page opens.
func TestWebListTaskPageCancelRerun(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	b := newBrowser(t, s.URL, 1280, 900)
	b.signIn(s.Token)

	gate := filepath.Join(t.TempDir(), "gate")
	gated := s.submit(shTask("gated", "", fmt.Sprintf(`echo started; while [ ! -e %s ]; do sleep 0.1; done; echo done`, gate)))
	failing := s.submit(shTask("fails", "", `echo "loading the configuration"; printf '\033[33mwarning: the cache is cold\033[0m\n'; `+
		`echo "reading the input"; printf '\033[31merror: no such file: /data/input.csv\033[0m\n'; exit 3`))
	long := s.submit(shTask("long", "", `echo "working for ten minutes"; exec sleep 600`))

	b.wait(time.Minute, "the three tasks in the list", fmt.Sprintf(`%s && %s && %s`, row(gated.ID), row(failing.ID), row(long.ID)))
	b.wait(2*time.Minute, "gated and long Running, fails Failed, live", fmt.Sprintf(
		`%s.dataset.phase === 'Running' && %s.dataset.phase === 'Running' && %s.dataset.phase === 'Failed'`, row(gated.ID), row(long.ID), row(failing.ID)))
	b.wait(10*time.Second, "the counts: 2 running, 1 failed", fmt.Sprintf(`%s === '2' && %s === '1'`, count("Running"), count("Failed")))
	if got := eval[string](b, row(failing.ID)+`.querySelector('td[data-label=Reason]').textContent`); got != "ExitCode" {
		b.fatalf("the failed task's reason in the list: %q, want ExitCode", got)
	}
	b.screenshot("web-list.png")

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.wait(time.Minute, "gated to succeed in the list", fmt.Sprintf(`%s.dataset.phase === 'Succeeded'`, row(gated.ID)))
	b.wait(10*time.Second, "the counts: 1 running", fmt.Sprintf(`%s === '1'`, count("Running")))
	b.notReloaded()

	t.Run("a failed task's page says why", func(t *testing.T) {
		b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] td.name a`, failing.ID))))
		b.wait(20*time.Second, "the failed task's page", fmt.Sprintf(`location.pathname === '/tasks/%s' && document.querySelector('.summary .headline')`, failing.ID))
		headline := eval[string](b, `document.querySelector('.summary .headline').textContent`)
		detail := eval[string](b, `document.querySelector('.summary .detail').textContent`)
		message := eval[string](b, `document.querySelector('.summary .message').textContent`)
		t.Logf("the page says: %s / %s / %s", headline, detail, message)
		if headline != "Failed: the program failed (exit code 3)" || !strings.Contains(detail, "exited with a non-zero code") || !strings.Contains(message, "exited with code 3") {
			b.fatalf("the failed task's page does not say why: %q / %q / %q", headline, detail, message)
		}
		// Its log, with the program's red error line in red.
		b.wait(20*time.Second, "the failed task's log with its colours", `[...document.querySelectorAll('.log-lines .line .f1')].some((e) => e.textContent === 'error: no such file: /data/input.csv')`)
		b.wait(20*time.Second, "the log complete", `document.querySelector('.logview').dataset.state === 'complete'`)
		b.screenshot("web-task.png")
	})

	t.Run("cancel stops a running task", func(t *testing.T) {
		b.do(chromedp.Click(chromedp.CSS(`.crumbs a`)))
		b.wait(20*time.Second, "the list", row(long.ID))
		b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] td.name a`, long.ID))))
		b.wait(20*time.Second, "the running task's page", `document.querySelector('main').dataset.phase === 'Running' && !document.querySelector('.actions button.danger').hidden`)
		b.wait(20*time.Second, "its log", `[...document.querySelectorAll('.log-lines .line')].some((e) => e.textContent.includes('working for ten minutes'))`)
		b.do(chromedp.Click(chromedp.CSS(`.actions button.danger`)))
		b.wait(5*time.Second, "the confirmation", `document.querySelector('dialog.confirm').open`)
		start := time.Now()
		b.do(chromedp.Click(chromedp.CSS(`dialog.confirm button.danger`)))
		b.wait(time.Minute, "the page to show the task cancelled", `document.querySelector('main').dataset.terminal === 'true' && document.querySelector('.summary .headline').textContent.startsWith('Failed: cancelled')`)
		tk := s.get(long.ID)
		t.Logf("cancelled in %s: %s/%s %s", time.Since(start).Round(time.Millisecond), tk.Phase, tk.Reason, tk.Message)
		if !tk.Terminal || tk.Phase != "Failed" || tk.Reason != "Cancelled" || tk.CancelledAt == nil {
			t.Errorf("after cancel from the page the task is %s/%s (terminal %v)", tk.Phase, tk.Reason, tk.Terminal)
		}
		// The container (sleep 600) was stopped: its attempt ended now, and
		// its pod is gone.
		a := tk.Attempts[len(tk.Attempts)-1]
		if a.FinishedAt == nil || time.Since(*a.FinishedAt) > time.Minute {
			t.Errorf("the cancelled attempt: %+v", a)
		}
		eventually(t, time.Minute, "the cancelled task's pod to be gone", func() bool {
			_, err := env.Client.CoreV1().Pods(env.Namespace).Get(context.Background(), a.Pod, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		b.notReloaded()
	})

	t.Run("rerun creates a new task", func(t *testing.T) {
		b.wait(10*time.Second, "the rerun button", `!document.querySelector('.actions button:not(.danger)').hidden`)
		b.do(chromedp.Click(chromedp.CSS(`.actions button:not(.danger)`)))
		b.wait(20*time.Second, "the new task's page", fmt.Sprintf(`location.pathname.startsWith('/tasks/') && location.pathname !== '/tasks/%s' && document.querySelector('.facts a')?.textContent === %s`, long.ID, jsString(long.ID)))
		id := strings.TrimPrefix(eval[string](b, `location.pathname`), "/tasks/")
		rerun := s.get(id)
		if rerun.Origin != long.ID || rerun.Name != "long" {
			t.Errorf("the rerun %s: origin %q, name %q; want a rerun of %s", id, rerun.Origin, rerun.Name, long.ID)
		}
		b.wait(time.Minute, "the rerun running on its page", `document.querySelector('main').dataset.phase === 'Running'`)
		b.notReloaded()
		// Stop it: its pod would outlive the test.
		if resp, body := s.do(s.Token, "POST", api.Prefix+"/tasks/"+id+"/cancel", "", nil); resp.StatusCode != 200 {
			t.Fatalf("cancel %s: %s %s", id, resp.Status, body)
		}
		s.waitTask(id, time.Minute, "the rerun to end", func(tk api.Task) bool { return tk.Terminal })
	})
}
