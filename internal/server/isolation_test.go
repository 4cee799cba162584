package server_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// The tests of this file check that no caller learns anything of a task in
// a namespace it may not see (issue 21 §3).

// isolationTokens are three token-mode callers: every namespace, team-a and
// team-b, team-a only.
func isolationTokens(t *testing.T) *server.TokenAuth {
	t.Helper()
	auth, err := server.NewTokenAuth([]server.Token{
		{Token: "root", Subject: "admin", Namespaces: server.Namespaces{"*"}},
		{Token: "ab", Subject: "ci", Namespaces: server.Namespaces{"team-a", "team-b"}},
		{Token: "a", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

// A caller of several namespaces lists without a namespace filter: every
// page holds its namespaces' tasks only, full pages until the last, and no
// continue token names a task of another namespace. Before the store read
// the caller's namespaces, pages were read across all of them and filtered
// afterwards: the token carried the last record's ID whatever its
// namespace, and with labels= and namePrefix= it spelled out another
// team's task IDs (an empty page with a token said that a hidden task
// matched).
func TestListReadsOnlyTheCallersNamespaces(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = isolationTokens(t) })
	hidden := map[string]bool{}
	var visible []string
	for i := range 4 { // interleaved, so team-c's tasks lie between the others in page order
		_, tk := h.submit("team-c", taskDoc(fmt.Sprintf("payroll-run-%d", i), "app", "payroll"), bearer("root")...)
		hidden[tk.ID] = true
		for _, ns := range []string{"team-a", "team-b"} {
			visible = append(visible, h.mustSubmit(ns, taskDoc(fmt.Sprintf("job-%d", i)), bearer("root")...).ID)
		}
	}
	// leaks reports the hidden IDs a continue token carries, in whatever
	// form it encodes them.
	leaks := func(cont string) []string {
		raw, _ := base64.RawURLEncoding.DecodeString(cont)
		var out []string
		for id := range hidden {
			if strings.Contains(cont, id) || strings.Contains(string(raw), id) {
				out = append(out, id)
			}
		}
		return out
	}
	list := func(query string) api.TaskList {
		t.Helper()
		resp, b := h.do(http.MethodGet, api.Prefix+"/tasks?"+query, nil, bearer("ab")...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("list %s: %s %s", query, resp.Status, b)
		}
		var l api.TaskList
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, filters := range []string{"", "&labels=app=payroll", "&namePrefix=payroll-", "&labels=app=payroll&namePrefix=payroll-"} {
		for _, limit := range []int{1, 3} {
			var got []string
			cont := ""
			for page := 0; ; page++ {
				if page > 20 {
					t.Fatal("more than 20 pages")
				}
				q := fmt.Sprintf("limit=%d%s", limit, filters)
				if cont != "" {
					q += "&continue=" + cont
				}
				l := list(q)
				for _, tk := range l.Items {
					if tk.Namespace != "team-a" && tk.Namespace != "team-b" {
						t.Fatalf("filters %q: a task of %s listed: %+v", filters, tk.Namespace, tk)
					}
					got = append(got, tk.ID)
				}
				if l.Continue == "" {
					break
				}
				if len(l.Items) != limit {
					t.Errorf("filters %q, limit %d, page %d: %d tasks and a continue token: only the last page may be short (a hidden task took a place)", filters, limit, page, len(l.Items))
				}
				if ids := leaks(l.Continue); len(ids) > 0 {
					t.Fatalf("filters %q, limit %d, page %d: the continue token carries team-c's %v", filters, limit, page, ids)
				}
				cont = l.Continue
			}
			var want []string // the payroll filters match team-c's tasks only
			if filters == "" {
				want = slices.Clone(visible)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("filters %q, limit %d: listed %v, want %v", filters, limit, got, want)
			}
		}
	}
}

// A task ID names another record once retention deleted the first: the
// events of a new team-c task with the ID of a deleted team-a task reach
// team-c's watchers only, never team-a's. The watch metadata cache kept the
// deleted task's namespace by ID, and published the new task's events as
// team-a's (the first case failed before). The other cases are the new
// record's Submitted event never arriving (created by another replica, its
// event lost: PublishMissed says so) and an event that carries a pod of
// another namespace than the cached one.
func TestWatchEventsOfAReusedIDReachOnlyItsNamespace(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = isolationTokens(t) })
	ctx := context.Background()
	marker := h.mustSubmit("team-a", taskDoc("marker"), bearer("a")...)
	// retire runs a team-a task with id to its end, its metadata cached,
	// and lets retention delete it.
	retire := func(id string) {
		t.Helper()
		old := h.mustSubmit("team-a", taskDoc("old"), append(bearer("a"), "Idempotency-Key", id)...)
		h.publish(old.ID, "old event")
		h.finish(old.ID, "Succeeded", "Completed")
		if _, err := h.store.(store.Retention).DeleteFinishedBefore(ctx, time.Now().Add(time.Hour), 100); err != nil {
			t.Fatal(err)
		}
		if _, err := h.store.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("retention left %s: %v", id, err)
		}
	}
	// check fails unless the next event of w that is not Expired is
	// the marker's (nothing of team-c came before it), then publishes to
	// team-c's task and checks that team-c's watcher gets it as team-c's.
	check := func(name string, alice, carol *sseStream, id string, publish func()) {
		t.Helper()
		publish()
		h.publish(marker.ID, "marker "+name)
		for {
			ev := alice.next()
			if ev.Type == api.EventExpired {
				continue
			}
			if ev.TaskID != marker.ID || ev.Message != "marker "+name {
				t.Fatalf("%s: alice (team-a) receives %+v, want only the marker", name, ev)
			}
			break
		}
		for {
			ev := carol.next()
			if ev.Type == api.EventExpired || ev.Type == string(executor.EventSubmitted) {
				continue
			}
			if ev.TaskID != id || ev.Namespace != "team-c" || ev.Name != "payroll-secret" {
				t.Fatalf("%s: team-c's watcher receives %+v, want the event of team-c's %s", name, ev, id)
			}
			break
		}
	}
	watchers := func() (*sseStream, *sseStream) {
		alice := h.watch(api.Prefix+"/watch", bearer("a")...)
		alice.next() // bookmark
		carol := h.watch(api.Prefix+"/watch?namespace=team-c", bearer("root")...)
		carol.next()
		return alice, carol
	}
	secret := func(id string) func() {
		return func() {
			h.srv.Publish(executor.Event{ID: id, Type: executor.EventState, Phase: "Running", Reason: "Running", Message: "salary file s3://hr/salaries.csv processed", Time: time.Now()})
		}
	}

	retire("nightly-1")
	alice, carol := watchers()
	h.mustSubmit("team-c", taskDoc("payroll-secret"), append(bearer("root"), "Idempotency-Key", "nightly-1")...)
	check("submitted here", alice, carol, "nightly-1", secret("nightly-1"))

	// created by another replica whose Submitted event was lost
	direct := func(id string) {
		t.Helper()
		rec := store.Record{ID: id, Namespace: "team-c", Name: "payroll-secret", Executor: "srv", Task: []byte(`{}`), Phase: "Pending", Reason: "Submitted", Nonce: "n-" + id}
		if _, created, err := h.store.Create(ctx, rec); err != nil || !created {
			t.Fatalf("create %s: %v %v", id, created, err)
		}
	}
	retire("nightly-2")
	alice, carol = watchers()
	direct("nightly-2")
	h.srv.PublishMissed("another replica could not share some of its events")
	check("submitted elsewhere, missed", alice, carol, "nightly-2", secret("nightly-2"))

	retire("nightly-3")
	alice, carol = watchers()
	direct("nightly-3")
	check("an event with a pod of another namespace", alice, carol, "nightly-3", func() {
		h.srv.Publish(executor.Event{ID: "nightly-3", Type: executor.EventPodCreated, Pod: "team-c/payroll-secret-0", Time: time.Now()})
	})
	check("after it, without a pod", alice, carol, "nightly-3", secret("nightly-3"))
}

// A caller who may submit in a namespace but not read it (create pods
// without get pods) resubmits a task's ID and document: 200, as for any
// idempotent retry, with the task's identity only, never its state,
// result, exit code or attempts, which a GET would not show it (404). It
// answered 200 with all of them before. A caller who may read gets the
// task as it is now; another document is 409 for both.
func TestResubmissionShowsNothingACallerMayNotGet(t *testing.T) {
	h := newHarness(t, func(c *server.Config) {
		cs := c.Client.(*fake.Clientset)
		cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
			return true, tr, nil
		})
		cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
			ra := sar.Spec.ResourceAttributes
			sar.Status.Allowed = ra != nil && ra.Namespace == "team-a" && (sar.Spec.User == "owner" || (sar.Spec.User == "creator" && ra.Verb == "create"))
			return true, sar, nil
		})
		auth, err := server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c.Client})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	as := func(user string) []string {
		return []string{"Authorization", "Bearer " + user, "Content-Type", "application/yaml", "Idempotency-Key", "report-7"}
	}
	if resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/team-a/tasks", []byte(taskDoc("report", "team", "finance")), as("owner")...); resp.StatusCode != http.StatusCreated {
		t.Fatalf("owner submits: %s %s", resp.Status, b)
	}
	h.finish("report-7", "Succeeded", "Completed")
	ctx := context.Background()
	rec, err := h.store.Get(ctx, "report-7")
	if err != nil {
		t.Fatal(err)
	}
	rec.Result, rec.Message = []byte("revenue: 1234567"), "main container exited with code 0"
	if _, err := h.store.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/tasks/report-7", nil, as("creator")...); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("creator gets the task: %s, want 404", resp.Status)
	}

	resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/team-a/tasks", []byte(taskDoc("report", "team", "finance")), as("creator")...)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Location") != api.Prefix+"/tasks/report-7" {
		t.Fatalf("creator resubmits: %s %s, want 200 with the task's Location", resp.Status, b)
	}
	for _, secret := range []string{"Succeeded", "Completed", "revenue", "exited", `"exitCode"`, `"attempts"`, `"terminal":true`, "createdAt\":\"20"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("creator's resubmission shows %s: %s", secret, b)
		}
	}
	var got api.Task
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != "report-7" || got.Namespace != "team-a" || got.Name != "report" || got.Labels["team"] != "finance" || got.Phase != "" {
		t.Errorf("creator's resubmission: %+v, want the task's identity only", got)
	}

	resp, b = h.do(http.MethodPost, api.Prefix+"/namespaces/team-a/tasks", []byte(taskDoc("report", "team", "finance")), as("owner")...)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"phase":"Succeeded"`) || !strings.Contains(string(b), "revenue") {
		t.Errorf("owner resubmits: %s %s, want 200 with the task as it is", resp.Status, b)
	}
	for _, user := range []string{"creator", "owner"} {
		if resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/team-a/tasks", []byte(taskDoc("other")), as(user)...); resp.StatusCode != http.StatusConflict || strings.Contains(string(b), "Succeeded") {
			t.Errorf("%s submits another document under the ID: %s %s, want 409", user, resp.Status, b)
		}
	}
}

// Open streams end once their caller may no longer do what opened them: a
// watch of a namespace, a watch of one task and a log follow, opened by a
// caller whose RoleBinding is then removed, end within AuthRecheck plus the
// authenticator's cache (5 s + 10 s here, on the injected clock) rather
// than at StreamTimeout (30 minutes); another caller's watch goes on. They
// went on streaming before.
func TestStreamsEndWhenAccessIsRevoked(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var aliceAllowed atomic.Bool
	aliceAllowed.Store(true)
	h := newHarness(t, func(c *server.Config) {
		c.Clock = clk
		cs := c.Client.(*fake.Clientset)
		cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: strings.TrimSuffix(tr.Spec.Token, "-token")}}
			return true, tr, nil
		})
		cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
			ra := sar.Spec.ResourceAttributes
			sar.Status.Allowed = ra != nil && ra.Namespace == "team-a" && (sar.Spec.User == "bob" || (sar.Spec.User == "alice" && aliceAllowed.Load()))
			return true, sar, nil
		})
		auth, err := server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c.Client, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	alice, bob := bearer("alice-token"), bearer("bob-token")
	tk := h.mustSubmit("team-a", taskDoc("job"), alice...)
	key := store.LogKey{TaskID: tk.ID, Container: "main"}
	h.logs.append(t, key, "first line\n", false)

	watch := h.watch(api.Prefix+"/watch?namespace=team-a", alice...)
	watch.next()
	taskWatch := h.watch(api.Prefix+"/tasks/"+tk.ID+"/watch", alice...)
	taskWatch.next()
	other := h.watch(api.Prefix+"/watch?namespace=team-a", bob...)
	other.next()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+api.Prefix+"/tasks/"+tk.ID+"/logs?follow=true", nil)
	req.Header.Set(alice[0], alice[1])
	logResp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer logResp.Body.Close()
	logBody := bufio.NewReader(logResp.Body)
	if line, err := logBody.ReadString('\n'); err != nil || line != "first line\n" {
		t.Fatalf("log follow: %q %v", line, err)
	}

	// While allowed, the checks keep every stream open.
	for range 30 {
		clk.Step(time.Second)
	}
	h.publish(tk.ID, "still allowed")
	for _, w := range []*sseStream{watch, taskWatch, other} {
		if ev := w.next(); ev.Message != "still allowed" {
			t.Fatalf("after 30 s of checks: %+v", ev)
		}
	}
	h.logs.append(t, key, "second line\n", false)
	h.srv.NotifyLog(key)
	if line, err := logBody.ReadString('\n'); err != nil || line != "second line\n" {
		t.Fatalf("log follow after 30 s of checks: %q %v", line, err)
	}

	aliceAllowed.Store(false) // the RoleBinding is removed
	ended := func(r io.Reader) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, r)
			close(done)
		}()
		return done
	}
	streams := map[string]<-chan struct{}{"watch": ended(watch.r), "task watch": ended(taskWatch.r), "log follow": ended(logBody)}
	revokedAt := clk.Now()
	for name, done := range streams {
		for open := true; open; {
			select {
			case <-done:
				open = false
			case <-time.After(200 * time.Millisecond):
				if clk.Since(revokedAt) > time.Minute {
					t.Fatalf("the %s is still open a minute after the revocation", name)
				}
				clk.Step(time.Second)
			}
		}
		t.Logf("%s ended within %s of the revocation (injected clock)", name, clk.Since(revokedAt))
	}
	if got := logResp.Trailer.Get(api.HeaderLogResume); got != "true" {
		t.Errorf("log follow trailer %s = %q, want true", api.HeaderLogResume, got)
	}
	h.publish(tk.ID, "after revocation")
	if ev := other.next(); ev.Message != "after revocation" {
		t.Errorf("another caller's watch: %+v", ev)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/watch?namespace=team-a", nil, alice...); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a new watch after the revocation: %s, want 403", resp.Status)
	}
}

// A task ID is global and free again once retention deleted its task, so a
// caller of any namespace may take it (issue 33). A watch of the task from
// an old cursor, even the ring's first, sends the new record's events only:
// never those of an earlier record with the ID, in another namespace or in
// the same one, whether the ring keeps the new record's Submitted event or
// not (created by another replica, its event lost). An event belongs to a
// record by its ID and namespace, by coming after the record's Submitted
// event, and, when it names a pod, by the pod's name, which holds a hash of
// the record's random nonce. It sent team-c's events to team-a before.
func TestTaskWatchOfAReusedIDSendsOnlyItsRecordsEvents(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Auth = isolationTokens(t) })
	ctx := context.Background()
	// events publishes a record's events: its pod's creation, then msg.
	events := func(rec store.Record, msg string) {
		h.srv.Publish(executor.Event{ID: rec.ID, Type: executor.EventPodCreated, Pod: rec.Namespace + "/" + task.PodName(
			task.Identity{Namespace: rec.Namespace, Name: rec.Name, RunID: rec.ID, Nonce: rec.Nonce}, 0), Message: msg, Time: time.Now()})
		h.srv.Publish(executor.Event{ID: rec.ID, Type: executor.EventState, Phase: "Running", Reason: "Running", Message: msg, Time: time.Now()})
	}
	// retire runs a task of ns with id to its end, with events, and lets
	// retention delete it.
	retire := func(ns, id string) {
		t.Helper()
		h.mustSubmit(ns, taskDoc("payroll-secret"), append(bearer("root"), "Idempotency-Key", id)...)
		rec, err := h.store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		events(rec, "salary file s3://hr/salaries.csv processed")
		h.finish(id, "Succeeded", "Completed")
		if _, err := h.store.(store.Retention).DeleteFinishedBefore(ctx, time.Now().Add(time.Hour), 100); err != nil {
			t.Fatal(err)
		}
	}
	w := h.watch(api.Prefix+"/watch", bearer("a")...)
	epoch, _, _ := strings.Cut(w.next().Cursor, "-")
	w.close()

	// check watches id as alice from the ring's first event: what comes
	// before her marker must be her record's own.
	check := func(name, id string) {
		t.Helper()
		s := h.watch(api.Prefix+"/tasks/"+url.PathEscape(id)+"/watch?cursor="+epoch+"-0", bearer("a")...)
		defer s.close()
		rec, err := h.store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		events(rec, "mine") // her own pod's events pass
		h.publish(id, "marker")
		for {
			ev := s.next()
			switch {
			case ev.Type == api.EventBookmark || ev.Type == api.EventExpired:
				continue
			case ev.Namespace != "team-a" || strings.Contains(ev.Message, "salaries"):
				t.Fatalf("%s: alice receives %+v, an event of an earlier record of %s", name, ev, id)
			case ev.Message == "marker":
				return
			}
		}
	}

	retire("team-c", "nightly-1")
	h.mustSubmit("team-a", taskDoc("mine"), append(bearer("a"), "Idempotency-Key", "nightly-1")...)
	check("another namespace's earlier record", "nightly-1")

	retire("team-a", "nightly-2")
	h.mustSubmit("team-a", taskDoc("mine"), append(bearer("a"), "Idempotency-Key", "nightly-2")...)
	s := h.watch(api.Prefix+"/tasks/nightly-2/watch?cursor="+epoch+"-0", bearer("a")...)
	if ev := s.next(); ev.Type != api.EventBookmark {
		t.Fatalf("first event %+v, want a bookmark", ev)
	}
	if ev := s.next(); ev.Type != string(executor.EventSubmitted) || ev.Name != "mine" {
		t.Fatalf("the same namespace's earlier record: first event %+v, want the new record's Submitted", ev)
	}
	s.close()

	// The new record's Submitted never reached this server: the earlier
	// record's pod and namespace still tell its events apart.
	retire("team-c", "nightly-3")
	retire("team-a", "nightly-4")
	for _, id := range []string{"nightly-3", "nightly-4"} {
		rec := store.Record{ID: id, Namespace: "team-a", Name: "mine", Executor: "srv", Task: []byte(`{}`), Phase: "Pending", Reason: "Submitted", Nonce: "n-" + id}
		if _, created, err := h.store.Create(ctx, rec); err != nil || !created {
			t.Fatalf("create %s: %v %v", id, created, err)
		}
	}
	check("another namespace's, the Submitted missed", "nightly-3")
}
