package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// The attacks of issue 33 ("Tenants kept apart") against the built service,
// each over the network as a tenant or an outsider would run it. Each failed
// on the code before its fix (KUBETASK_E2E_BIN names that code's binary).

// tenantTokens writes a token file with one token per namespace (token
// "<subject>-token") and returns its path.
func tenantTokens(t *testing.T, subjects map[string]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("tokens:\n")
	for subject, ns := range subjects {
		fmt.Fprintf(&b, "- {token: %s-token, subject: %s, namespaces: [%s]}\n", subject, subject, ns)
	}
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// retainOnce runs retention once on s's SQLite store, as the service's own
// loop does at its start and every hour: a second `kubetask serve` on the
// same store with --retention keep deletes the tasks finished longer ago,
// and is stopped. s keeps running, with its events.
func (s *service) retainOnce(keep time.Duration) {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubetaskBin(t), "serve", "--kubeconfig", s.env.Kubeconfig, "--namespaces", s.env.Namespace,
		"--listen", "127.0.0.1:0", "--instance-id", "retention-"+s.env.Namespace, "--state-dir", t.TempDir(),
		"--store", "sqlite:"+filepath.Join(s.stateDir, "tasks.db"), "--retention", keep.String())
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	eventually(t, time.Minute, "retention to delete the finished task", func() bool {
		return strings.Contains(out.String(), "retention: deleted finished tasks")
	})
}

// A task ID is global and free again once retention deleted its task
// (issue 33, High): carol's task in her namespace ran and was deleted;
// alice submits a task with the same ID in hers and watches it from a
// cursor taken before carol's task. She receives her own task's events
// only: before, the watch matched by ID and sent her carol's (namespace,
// task name, pod, states).
func TestServeReusedTaskIDWatchShowsOnlyItsRecord(t *testing.T) {
	envA, envC := clustertest.New(t), clustertest.New(t)
	file := tenantTokens(t, map[string]string{"alice": envA.Namespace, "carol": envC.Namespace})
	s := startService(t, envA, "--token-file", file, "--namespaces", envC.Namespace)
	s.Token = "alice-token"
	old := s.cursor()

	id := "nightly-" + rand.String(6)
	s.Token = "carol-token"
	resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+envC.Namespace+"/tasks?id="+id, "application/yaml",
		taskDoc("payroll-secret", "", `      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo salary file s3://hr/salaries.csv processed"]}`))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("carol submits %s: %s %s", id, resp.Status, b)
	}
	s.waitTask(id, 2*time.Minute, "carol's task to end", func(tk api.Task) bool { return tk.Terminal })
	time.Sleep(1500 * time.Millisecond) // older than the retention below
	s.retainOnce(time.Second)
	if resp, b := s.do(http.MethodGet, api.Prefix+"/tasks/"+id, "", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("carol's task after retention: %s %s, want 404", resp.Status, b)
	}

	s.Token = "alice-token"
	resp, b = s.do(http.MethodPost, api.Prefix+"/namespaces/"+envA.Namespace+"/tasks?id="+id, "application/yaml", quickTask("mine"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("alice submits the free ID %s: %s %s", id, resp.Status, b)
	}
	evs := s.events(id, old, 2*time.Minute)
	own := false
	for _, ev := range evs {
		if ev.Namespace != envA.Namespace || ev.Name == "payroll-secret" || (ev.Pod != "" && !strings.HasPrefix(ev.Pod, envA.Namespace+"/")) {
			t.Errorf("alice's watch of %s from an old cursor sends an event of carol's earlier task: %+v", id, ev)
		}
		own = own || (ev.Terminal && ev.Namespace == envA.Namespace)
	}
	if !own {
		t.Errorf("alice's watch of %s: %d events, none her task's outcome: %+v", id, len(evs), evs)
	}
}

// saTokens creates, in env's namespace, a Role allowing verbs on pods, and
// n ServiceAccounts bound to it, and returns a token of each.
func saTokens(t *testing.T, env *clustertest.Env, prefix string, n int, verbs ...string) []string {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.RbacV1().Roles(env.Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: prefix},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: verbs}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Client.RbacV1().RoleBindings(env.Namespace).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: prefix},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: env.Namespace}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := env.Client.CoreV1().ServiceAccounts(env.Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tr.Status.Token)
	}
	return tokens
}

// openWatch opens a watch as token, held until the test ends; it returns
// the status and, when refused, the body.
func (s *service) openWatch(token, path string) (int, string) {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	return resp.StatusCode, ""
}

// One namespace's ServiceAccounts cannot take every stream slot (issue 33,
// High): in kubernetes mode each ServiceAccount is a caller of its own, so
// team-a's four accounts, three watches each (the per-caller limit), filled
// the server's 12 before and team-c's account got 429. Now team-a stops at
// its share (half of --max-streams by default), refused with a 429 that
// names it, and team-c's account opens a watch.
func TestServeOneNamespaceCannotTakeEveryStream(t *testing.T) {
	envA, envC := clustertest.New(t), clustertest.New(t)
	greedy := saTokens(t, envA, "watcher", 4, "get", "list", "watch")
	other := saTokens(t, envC, "watcher", 1, "get", "list", "watch")[0]
	s := startService(t, envA, "--auth", "kubernetes", "--namespaces", envC.Namespace,
		"--max-streams", "12", "--max-streams-per-caller", "3")
	codes := map[int]int{}
	var refusal string
	for _, token := range greedy {
		for range 3 {
			code, b := s.openWatch(token, api.Prefix+"/watch?namespace="+envA.Namespace)
			codes[code]++
			if code != http.StatusOK {
				refusal = b
			}
		}
	}
	t.Logf("team-a's 12 watches: %v %s", codes, refusal)
	if code, b := s.openWatch(other, api.Prefix+"/watch?namespace="+envC.Namespace); code != http.StatusOK {
		t.Fatalf("team-c's watch with team-a's open: %d %s, want 200", code, b)
	}
	if codes[http.StatusOK] != 6 || codes[http.StatusTooManyRequests] != 6 || !strings.Contains(refusal, fmt.Sprintf(`namespace \"%s\"'s share of 6`, envA.Namespace)) {
		t.Errorf("team-a's 12 watches: %v (%s), want 6 opened and 6 refused naming its share", codes, refusal)
	}
}

// An unauthenticated POST whose small body trickles (one byte of 1,000) is
// answered 401 at once and its connection closed (issue 33, Low): before,
// net/http read the rest of the body first, holding the connection for the
// body timeout (30 s) before the 401.
func TestServeUnauthenticatedSlowBodyAnsweredAtOnce(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env, "--token-file", tenantTokens(t, map[string]string{"alice": env.Namespace}))
	c := s.rawConn()
	start := time.Now()
	fmt.Fprintf(c, "POST %s/namespaces/%s/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/yaml\r\nContent-Length: 1000\r\n\r\na", api.Prefix, env.Namespace)
	_ = c.SetReadDeadline(start.Add(5 * time.Second))
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("no answer within 5 s: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("%s, want 401", resp.Status)
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the 401: %v, want the connection closed by the server", err)
	}
	t.Logf("401 and the connection closed after %s", time.Since(start).Round(time.Millisecond))
}

// An unauthenticated request with a 60 KB path (and a 200-byte method)
// writes an audit line of a few KB that says how long they were (issue 33,
// Low): before, every such request wrote the whole path to the log.
func TestServeAuditLineOfAHugePathIsBounded(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env, "--token-file", tenantTokens(t, map[string]string{"alice": env.Namespace}))
	long := api.Prefix + "/tasks/" + strings.Repeat("x", 60000) + "/cancel"
	for _, method := range []string{http.MethodPost, strings.Repeat("P", 200)} {
		if resp, b := s.doAs("", method, long, "", nil); resp.StatusCode < 400 {
			t.Fatalf("%.20s %.40s...: %s %s, want a refusal", method, long, resp.Status, b)
		}
	}
	var lines []string
	eventually(t, 10*time.Second, "both audit lines", func() bool {
		lines = nil
		for _, line := range strings.Split(s.stderr.String(), "\n") {
			if strings.Contains(line, "msg=audit") && strings.Contains(line, "xxxxxxxxxx") {
				lines = append(lines, line)
			}
		}
		return len(lines) == 2
	})
	for _, line := range lines {
		if len(line) > 3000 || !strings.Contains(line, fmt.Sprintf("...(%d bytes)", len(long))) {
			t.Errorf("audit line of %d bytes: %.300s...; want at most 3000, saying how long the path was", len(line), line)
		}
	}
	if !strings.Contains(lines[1], "...(200 bytes)") {
		t.Errorf("the made-up method's audit line: %.300s...; want it cut, saying how long it was", lines[1])
	}
}

// A labels filter of 999 terms is a 400 naming the cap (20), for lists
// and watches (issue 33, Low): on SQLite the list was a 500 before (too many
// conditions in one query), and the watch opened.
func TestServeLabelTermsCapped(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env, "--token-file", tenantTokens(t, map[string]string{"alice": env.Namespace}))
	s.Token = "alice-token"
	s.submit(taskDoc("labelled", "", `      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo hello"]}`))
	terms := make([]string, 999)
	for i := range terms {
		terms[i] = fmt.Sprintf("k%d=v", i)
	}
	for _, path := range []string{"/tasks", "/watch"} {
		path = api.Prefix + path + "?namespace=" + env.Namespace + "&labels=" + strings.Join(terms, ",")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+s.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%.40s...: %v", path, err)
		}
		var b []byte
		if resp.StatusCode != http.StatusOK {
			b, _ = io.ReadAll(resp.Body)
		}
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "at most 20") {
			t.Errorf("%.40s... with 999 label terms: %s %s, want 400 naming the cap", path, resp.Status, b)
		}
	}
}

// One namespace cannot fill the store or the queue for the others (issue
// 33, Medium): with caps of 2 unfinished and 3 kept tasks per namespace,
// team-a's third waiting task is a 429 naming the unfinished cap while
// team-c submits as ever; once one finished, team-a submits again, and then
// a fourth kept task, or a rerun, is a 403 naming the kept cap. Nothing
// capped a namespace before.
func TestServeNamespaceQuotas(t *testing.T) {
	envA, envC := clustertest.New(t), clustertest.New(t)
	file := tenantTokens(t, map[string]string{"alice": envA.Namespace, "carol": envC.Namespace})
	s := startService(t, envA, "--token-file", file, "--namespaces", envC.Namespace,
		"--max-unfinished-tasks-per-namespace", "2", "--max-tasks-per-namespace", "3")
	// waiting never starts: no node has the label.
	waiting := func(name string) []byte {
		return taskDoc(name, "", `      nodeSelector: {kubetask.dev/test-no-such-node: "true"}
      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo never"]}`)
	}
	submit := func(token, ns, id string, doc []byte) (int, string) {
		t.Helper()
		resp, b := s.doAs(token, http.MethodPost, api.Prefix+"/namespaces/"+ns+"/tasks?id="+id, "application/yaml", doc)
		return resp.StatusCode, string(b)
	}
	for _, id := range []string{"a-0", "a-1"} {
		if code, b := submit("alice-token", envA.Namespace, id, waiting(id)); code != http.StatusCreated {
			t.Fatalf("team-a's %s: %d %s", id, code, b)
		}
		t.Cleanup(func() { s.doAs("alice-token", http.MethodPost, api.Prefix+"/tasks/"+id+"/cancel", "", nil) })
	}
	if code, b := submit("alice-token", envA.Namespace, "a-2", waiting("a-2")); code != http.StatusTooManyRequests || !strings.Contains(b, "maxUnfinishedTasksPerNamespace) is 2") {
		t.Fatalf("team-a's third unfinished task: %d %s, want 429 naming the cap", code, b)
	}
	if code, b := submit("carol-token", envC.Namespace, "c-0", quickTask("c-0")); code != http.StatusCreated {
		t.Fatalf("team-c with team-a at its cap: %d %s, want 201", code, b)
	}

	// a-0 finishes: its unfinished place is free once counted again (2 s).
	if resp, b := s.doAs("alice-token", http.MethodPost, api.Prefix+"/tasks/a-0/cancel", "", nil); resp.StatusCode >= 300 {
		t.Fatalf("cancel a-0: %s %s", resp.Status, b)
	}
	s.Token = "alice-token"
	s.waitTask("a-0", time.Minute, "a-0 to end", func(tk api.Task) bool { return tk.Terminal })
	eventually(t, 30*time.Second, "team-a's third task, a place free", func() bool {
		code, b := submit("alice-token", envA.Namespace, "a-2", quickTask("a-2"))
		if code != http.StatusCreated && code != http.StatusTooManyRequests {
			t.Fatalf("team-a's third task after a-0 ended: %d %s", code, b)
		}
		return code == http.StatusCreated
	})
	if code, b := submit("alice-token", envA.Namespace, "a-3", quickTask("a-3")); code != http.StatusForbidden || !strings.Contains(b, "maxTasksPerNamespace) is 3") {
		t.Errorf("team-a's fourth kept task: %d %s, want 403 naming the cap", code, b)
	}
	if resp, b := s.doAs("alice-token", http.MethodPost, api.Prefix+"/tasks/a-0/rerun", "", nil); resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "maxTasksPerNamespace) is 3") {
		t.Errorf("a rerun of a-0 at the kept cap: %s %s, want 403 naming the cap", resp.Status, b)
	}
}

// A submitter reads any Secret of their namespace through a task's pod
// (issue 33): the task names it, kubelet gives it, the task prints it to the
// log the submitter reads. With the namespace in --refuse-secrets (and
// --refuse-runtime-class), the same task, its rerun, and a task setting
// runtimeClassName are 422s naming the field and the option; a namespace
// not listed submits as before. Nothing could refuse them before.
func TestServeRefusesSecretsAndRuntimeClass(t *testing.T) {
	env, other := clustertest.New(t), clustertest.New(t)
	ctx := context.Background()
	for _, ns := range []string{env.Namespace, other.Namespace} {
		if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "payroll"}, StringData: map[string]string{"salary": "s3cr3t-salary-42"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reader := taskDoc("reader", "", `      containers:
        - name: main
          image: busybox
          command: [sh, -c, "echo $SALARY"]
          env:
            - name: SALARY
              valueFrom: {secretKeyRef: {name: payroll, key: salary}}`)
	sandboxed := taskDoc("sandboxed", "", `      runtimeClassName: gvisor
      containers:
        - {name: main, image: busybox, command: [sh, -c, "echo hello"]}`)
	s := startService(t, env, "--namespaces", other.Namespace)
	tk := s.submit(reader)
	tk = s.waitTask(tk.ID, 2*time.Minute, "the Secret reader to end", func(tk api.Task) bool { return tk.Terminal })
	eventually(t, time.Minute, "the Secret in the task's log", func() bool {
		b, complete := s.log(tk.ID, 0)
		return complete && strings.Contains(string(b), "s3cr3t-salary-42")
	})

	s.stop(syscall.SIGTERM)
	s.args = append(s.args, "--refuse-secrets", env.Namespace, "--refuse-runtime-class", env.Namespace)
	s.start()
	refused := func(what string, resp *http.Response, b []byte, field, option string) {
		t.Helper()
		if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(b), `"location":"body.spec.template.spec.`+field+`"`) || !strings.Contains(string(b), option) {
			t.Errorf("%s: %s %s, want 422 naming %s and %s", what, resp.Status, b, field, option)
		}
	}
	submitPath := api.Prefix + "/namespaces/" + env.Namespace + "/tasks"
	resp, b := s.do(http.MethodPost, submitPath, "application/yaml", reader)
	refused("the Secret reader again", resp, b, "containers[0].env[0].valueFrom.secretKeyRef", "--refuse-secrets")
	resp, b = s.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/rerun", "", nil)
	refused("a rerun of the Secret reader", resp, b, "containers[0].env[0].valueFrom.secretKeyRef", "--refuse-secrets")
	resp, b = s.do(http.MethodPost, submitPath, "application/yaml", sandboxed)
	refused("a task with runtimeClassName", resp, b, "runtimeClassName", "--refuse-runtime-class")
	if resp, b := s.do(http.MethodPost, submitPath, "application/yaml", quickTask("plain")); resp.StatusCode != http.StatusCreated {
		t.Errorf("a task without them: %s %s, want 201", resp.Status, b)
	}
	if resp, b := s.do(http.MethodPost, api.Prefix+"/namespaces/"+other.Namespace+"/tasks", "application/yaml", reader); resp.StatusCode != http.StatusCreated {
		t.Errorf("the Secret reader in a namespace not listed: %s %s, want 201", resp.Status, b)
	}
}
