package web

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// unnamedControls lists the visible form controls without an accessible
// name (a label, aria-label or aria-labelledby; a button's text) and the
// images without alt.
const unnamedControls = `[...document.querySelectorAll('input, select, textarea, button, img, [role=tab]')]
  .filter((e) => e.getClientRects().length && !e.closest('dialog:not([open])'))
  .filter((e) => e.tagName === 'IMG' ? !e.hasAttribute('alt')
    : !(e.labels?.length || e.getAttribute('aria-label') || e.getAttribute('aria-labelledby') || (/^(BUTTON)$/.test(e.tagName) || e.getAttribute('role') === 'tab') && e.textContent.trim()))
  .map((e) => e.outerHTML.slice(0, 120))`

// lowContrast lists the visible text whose contrast with its background is
// under WCAG AA: 4.5:1, or 3:1 for large text (24px, or 18.66px bold).
// The background is the nearest one painted (white when none is).
const lowContrast = `(() => {
  const rgb = (s) => (s.match(/[\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
    .reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i], 0);
  const bgOf = (e) => {
    for (; e && e.nodeType === 1; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] >= 0.5)) return c;
    }
    return [255, 255, 255];
  };
  const bad = [];
  for (const e of document.querySelectorAll('body *')) {
    if (![...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    if (!e.getClientRects().length || e.closest('dialog:not([open]), [hidden], .sr-only') || e.matches(':disabled')) continue;
    const st = getComputedStyle(e);
    if (st.visibility === 'hidden') continue;
    const l1 = lum(rgb(st.color)), l2 = lum(bgOf(e));
    const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    const size = parseFloat(st.fontSize), bold = Number(st.fontWeight) >= 700;
    const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    if (ratio < need) bad.push(e.tagName + '.' + e.className + ' "' + e.textContent.trim().slice(0, 30) + '" ' + ratio.toFixed(2));
  }
  return bad;
})()`

// noSideScroll is true when the page is no wider than the window and no
// element's content spills out of it sideways (but those made to scroll:
// the log's lines, preformatted text).
const noSideScroll = `document.documentElement.scrollWidth <= window.innerWidth && ![...document.querySelectorAll('body *')].some((e) =>
  e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1 && !['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowX))`

func (b *tab) checkAccessible(where string) {
	b.t.Helper()
	if bad := eval[[]string](b, unnamedControls); len(bad) > 0 {
		b.t.Errorf("%s: controls without a name:\n%s", where, strings.Join(bad, "\n"))
	}
	if bad := eval[[]string](b, lowContrast); len(bad) > 0 {
		b.t.Errorf("%s: text with too little contrast:\n%s", where, strings.Join(bad, "\n"))
	}
}

// The basics of accessibility: every control named, enough contrast, the
// list and a task reached with the keyboard alone, and both pages usable
// 375 px wide. Also the results: JSON pretty-printed, binary offered as a
// download; and a Pending task's page says why it waits.
func TestWebAccessibleNarrowAndResults(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	jsonTask := s.submit(shTask("json-result", "  result: {from: TerminationMessage}",
		`echo computing; echo '{"rows": 5, "status": "ok", "files": ["a.csv", "b.csv"]}' > /dev/termination-log`))
	binTask := s.submit(shTask("binary-result", "  result: {from: File, path: /kubetask/result.bin}",
		`printf '\000\001\377\376 not text' > /kubetask/result.bin`))
	pending := s.submit(taskDoc("never-scheduled", "", `      nodeSelector: {kubetask.dev/no-such-node: "true"}
      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo never"]}`))
	for _, id := range []string{jsonTask.ID, binTask.ID} {
		s.waitTask(id, 2*time.Minute, "the task to succeed", func(tk api.Task) bool { return tk.Terminal })
	}
	s.waitTask(pending.ID, time.Minute, "Unschedulable", func(tk api.Task) bool { return tk.Reason == "Unschedulable" && len(tk.Events) > 0 })

	b := newBrowser(t, s.URL, 1280, 900)
	b.signIn(s.Token)
	b.wait(20*time.Second, "the three tasks", row(jsonTask.ID)+" && "+row(binTask.ID)+" && "+row(pending.ID))
	b.checkAccessible("the list")

	// The keyboard alone: Tab from the top of a freshly loaded page reaches
	// the skip link first, then the task's link; Enter opens the task and
	// puts the focus on its title.
	b.open("/")
	b.wait(20*time.Second, "the list", row(jsonTask.ID))
	b.do(chromedp.KeyEvent(kb.Tab))
	if got := eval[string](b, `document.activeElement.textContent`); got != "Skip to the content" {
		b.fatalf("the first Tab stop is %q, want the skip link", got)
	}
	link := fmt.Sprintf(`document.activeElement === document.querySelector('tr[data-id=%q] td.name a')`, jsonTask.ID)
	for i := 0; !eval[bool](b, link); i++ {
		if i == 40 {
			b.fatalf("40 Tab presses did not reach the task's link")
		}
		b.do(chromedp.KeyEvent(kb.Tab))
	}
	b.do(chromedp.KeyEvent(kb.Enter))
	b.wait(20*time.Second, "the task's page, its title focused", fmt.Sprintf(`location.pathname === '/tasks/%s' && document.activeElement.tagName === 'H1' && document.activeElement.textContent === 'json-result'`, jsonTask.ID))
	b.wait(20*time.Second, "the JSON result, pretty-printed", `document.querySelector('.result pre.json')?.textContent === JSON.stringify({rows: 5, status: 'ok', files: ['a.csv', 'b.csv']}, null, 2)`)
	b.wait(20*time.Second, "the log", lineVisible("computing"))
	b.checkAccessible("a task")

	// 375 px wide: no page wider than the screen, the log still readable.
	b.do(chromedp.EmulateViewport(375, 800, chromedp.EmulateMobile))
	b.wait(10*time.Second, "the task page to fit 375 px", noSideScroll+` && window.innerWidth === 375`)
	b.wait(10*time.Second, "the log at 375 px", lineVisible("computing"))
	b.do(chromedp.Click(chromedp.CSS(`.crumbs a`)))
	b.wait(20*time.Second, "the list at 375 px", row(pending.ID)+" && "+noSideScroll)
	if w := eval[float64](b, row(pending.ID)+`.getBoundingClientRect().width`); w > 375 {
		t.Errorf("a row of the list is %.0f px wide at 375 px", w)
	}
	b.checkAccessible("the list at 375 px")
	b.screenshot("web-list-narrow.png")
	b.do(chromedp.EmulateViewport(1280, 900))

	// A binary result is offered as a download.
	b.openTask(binTask.ID)
	b.wait(20*time.Second, "the binary result", `document.querySelector('.result pre.hex')?.textContent.startsWith('00 01 ff fe 20 6e 6f 74')`)
	if got := eval[string](b, `document.querySelector('.result button').textContent`); got != "Download the result" {
		t.Errorf("the binary result's button: %q", got)
	}

	// A Pending task says why it waits, with the scheduler's events.
	b.do(chromedp.Click(chromedp.CSS(`.crumbs a`)))
	b.openTask(pending.ID)
	b.wait(20*time.Second, "why it is pending", `document.querySelector('.summary .headline')?.textContent === 'Pending: unschedulable' && document.querySelector('.summary .detail').textContent.startsWith('No node can run the pod') && [...document.querySelectorAll('ul.events li strong')].some((e) => e.textContent === 'FailedScheduling')`)
	b.checkAccessible("a pending task")
	if resp, body := s.do(s.Token, "POST", api.Prefix+"/tasks/"+pending.ID+"/cancel", "", nil); resp.StatusCode != 200 {
		t.Fatalf("cancel: %s %s", resp.Status, body)
	}
	b.wait(time.Minute, "the cancelled task's page", `document.querySelector('main').dataset.terminal === 'true'`)
}

// In the kubernetes auth mode the page shows what the caller's RBAC lets it
// see: an account that may read pods in the namespace sees its tasks once
// it names the namespace (it may not list all of them); one that may not
// sees none, and a task's page tells it nothing about the task.
func TestWebKubernetesAuth(t *testing.T) {
	env := clustertest.New(t)
	ctx := context.Background()
	rbac := env.Client.RbacV1()
	if _, err := rbac.Roles(env.Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "task-user"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		t.Helper()
		if _, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	user, nobody := token("user"), token("nobody")
	if _, err := rbac.RoleBindings(env.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "task-user"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "task-user"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "user", Namespace: env.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := startService(t, env, "--auth", "kubernetes")
	tk := s.submitAs(user, shTask("visible", "", `echo "only for those who may read pods here"`))

	b := newBrowser(t, s.URL, 1280, 900)
	b.signIn(user)
	b.wait(20*time.Second, "the list to ask for a namespace", `document.querySelector('.error')?.textContent.includes('Give a namespace you may see') && document.activeElement.id === 'f-namespace'`)
	b.do(chromedp.SendKeys(chromedp.CSS("#f-namespace"), env.Namespace+kb.Enter))
	b.wait(20*time.Second, "the namespace's task", row(tk.ID))
	b.openTask(tk.ID)
	b.wait(time.Minute, "its log", lineVisible("only for those who may read pods here"))

	b.do(chromedp.Click(chromedp.CSS("#sign-out")))
	b.wait(10*time.Second, "the sign-in form", `document.querySelector('#token')`)
	b.do(chromedp.SendKeys(chromedp.CSS("#token"), nobody), chromedp.Click(chromedp.CSS("form.login button[type=submit]")))
	// Signed in again where it signed out: the task's page, which this
	// account may not see.
	b.wait(20*time.Second, "nothing about the task", `document.querySelector('h1')?.textContent === 'No such task'`)
	b.do(chromedp.Click(chromedp.CSS("header nav a")))
	b.wait(20*time.Second, "the list to ask for a namespace", `document.querySelector('h1')?.textContent === 'Tasks' && document.querySelector('.error')?.textContent.includes('Give a namespace')`)
	b.do(chromedp.SendKeys(chromedp.CSS("#f-namespace"), env.Namespace+kb.Enter))
	b.wait(20*time.Second, "the refusal", fmt.Sprintf(`document.querySelector('.error')?.textContent.includes('may not list tasks in namespace') && !%s`, row(tk.ID)))
	if strings.Contains(eval[string](b, `document.body.innerText`), "visible") {
		t.Errorf("the page shows the task's name to an account that may not read it")
	}
}
