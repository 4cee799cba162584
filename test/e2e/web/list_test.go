package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
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
		// The page says who submitted and who cancelled it (the token's
		// subject).
		if tk.SubmittedBy == nil || tk.CancelledBy == nil || tk.CancelledBy.User != tk.SubmittedBy.User {
			t.Errorf("the cancelled task's submitter %+v and canceller %+v: want the token's subject", tk.SubmittedBy, tk.CancelledBy)
		} else {
			b.wait(20*time.Second, "the page to name the submitter and the canceller", fmt.Sprintf(
				`(() => { const f = Object.fromEntries([...document.querySelectorAll('.facts dt')].map((dt) => [dt.textContent, dt.nextElementSibling.textContent])); return f['Submitted by'] === %s && f['Cancelled by'] === %s; })()`,
				jsString(tk.SubmittedBy.User), jsString(tk.CancelledBy.User)))
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

// An event that reaches the list while its first read of a new task is in
// flight is not lost: the read's answer predates the event, so the list
// reads the task again. The test holds the answer to that first read in
// the browser (the Fetch domain, at the response stage: the server has
// answered Pending) until the page has taken the task's Running event
// (its counts say so), then lets it through: the row must end up Running.
// Deterministic: with one parallelism slot, held by a gated task, the new
// task cannot start before its first read is held.
func TestWebListEventDuringFirstRead(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env, "--parallelism", "1")
	b := newBrowser(t, s.URL, 1280, 900)
	b.signIn(s.Token)

	dir := t.TempDir()
	gateA, gateB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	gated := func(name, gate string) []byte {
		return shTask(name, "", fmt.Sprintf(`echo started; while [ ! -e %s ]; do sleep 0.1; done; echo done`, gate))
	}
	first := s.submit(gated("first", gateA))
	b.wait(time.Minute, "the first task Running in the list", fmt.Sprintf(`%s?.dataset.phase === 'Running'`, row(first.ID)))

	// Hold the page's first read of the second task (its ID chosen here,
	// so that the pattern matches nothing else).
	id := "held-" + env.Namespace
	paused := chromedp.Events(b.ctx, fetch.RequestPaused)
	if _, err := chromedp.Call(b.ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{
		{URLPattern: "*" + api.Prefix + "/tasks/" + id, RequestStage: fetch.RequestStageResponse},
	}}); err != nil {
		t.Fatalf("enabling the Fetch domain: %v", err)
	}
	held := make(chan *fetch.EventRequestPaused, 1)
	pctx, stopPaused := context.WithCancel(b.ctx)
	defer stopPaused()
	go func() {
		n := 0
		for ev, err := range paused {
			if err != nil || pctx.Err() != nil {
				return
			}
			if n++; n == 1 {
				held <- &ev
				continue
			}
			_, _ = chromedp.Call(pctx, fetch.ContinueResponse, fetch.ContinueResponseParams{RequestID: ev.RequestID})
		}
	}()

	resp, body := s.do(s.Token, http.MethodPost, api.Prefix+"/namespaces/"+env.Namespace+"/tasks?id="+id, "application/yaml", gated("second", gateB))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("submit: %s\n%s", resp.Status, body)
	}
	var ev *fetch.EventRequestPaused
	select {
	case ev = <-held:
	case <-time.After(time.Minute):
		b.fatalf("the page never read the new task %s", id)
	}
	answer, err := chromedp.Call(b.ctx, fetch.GetResponseBody, fetch.GetResponseBodyParams{RequestID: ev.RequestID})
	if err != nil {
		t.Fatalf("reading the held answer: %v", err)
	}
	var was api.Task
	if err := json.Unmarshal(answer.Body, &was); err != nil {
		t.Fatalf("the held answer: %v\n%s", err, answer.Body)
	}
	if was.Phase != "Pending" {
		t.Fatalf("the held answer is %s/%s, want Pending (the task must wait for the slot)", was.Phase, was.Reason)
	}
	if eval[bool](b, "!!"+row(id)) {
		b.fatalf("the new task has a row before its first read returned")
	}

	// Free the slot: the second task starts, and its Running event reaches
	// the page while the read is held.
	if err := os.WriteFile(gateA, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.waitTask(id, time.Minute, "the second task Running", func(tk api.Task) bool { return tk.Phase == "Running" })
	b.wait(time.Minute, "the page to take the Running event (counts: 1 running, 0 pending)", fmt.Sprintf(`%s === '1' && %s === '0'`, count("Running"), count("Pending")))

	if _, err := chromedp.Call(b.ctx, fetch.ContinueResponse, fetch.ContinueResponseParams{RequestID: ev.RequestID}); err != nil {
		t.Fatalf("releasing the held answer: %v", err)
	}
	b.wait(20*time.Second, "the second task's row Running (the held answer said Pending)", fmt.Sprintf(`%s?.dataset.phase === 'Running'`, row(id)))
	b.notReloaded()

	if err := os.WriteFile(gateB, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.waitTask(id, time.Minute, "the second task to end", func(tk api.Task) bool { return tk.Terminal })
}
