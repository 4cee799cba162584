package server_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// kubeUsers makes the harness authenticate in kubernetes mode: a token is its
// user's name, each user has a UID and groups, and everyone may do anything.
func kubeUsers(c *server.Config) {
	cs := c.Client.(*fake.Clientset)
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{
			Username: tr.Spec.Token, UID: "uid-" + tr.Spec.Token, Groups: []string{"team-a", "system:authenticated"},
		}}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		sar.Status.Allowed = true
		return true, sar, nil
	})
	auth, err := server.NewKubernetesAuth(server.KubernetesAuthConfig{Client: c.Client})
	if err != nil {
		panic(err)
	}
	c.Auth = auth
}

// Every task says who submitted it, who cancelled it and who reran it, in
// the store and in get and list, whatever the auth mode.
func TestTasksAttributed(t *testing.T) {
	kube := func(u string) *api.Actor {
		return &api.Actor{Auth: "kubernetes", User: u, UID: "uid-" + u, Groups: []string{"team-a", "system:authenticated"}}
	}
	for _, tc := range []struct {
		name             string
		mod              func(*server.Config)
		alice, bob, carl []string // request headers
		wantA, wantB     *api.Actor
		wantC            *api.Actor
	}{
		{
			name: "token",
			mod: func(c *server.Config) {
				auth, err := server.NewTokenAuth([]server.Token{
					{Token: "ta", Subject: "alice", Namespaces: server.Namespaces{"team-a"}},
					{Token: "tb", Subject: "bob", Namespaces: server.Namespaces{"*"}},
					{Token: "tc", Subject: "carl", Namespaces: server.Namespaces{"team-a"}},
				})
				if err != nil {
					t.Fatal(err)
				}
				c.Auth = auth
			},
			alice: []string{"Authorization", "Bearer ta"}, bob: []string{"Authorization", "Bearer tb"}, carl: []string{"Authorization", "Bearer tc"},
			wantA: &api.Actor{Auth: "token", User: "alice"}, wantB: &api.Actor{Auth: "token", User: "bob"}, wantC: &api.Actor{Auth: "token", User: "carl"},
		},
		{
			name:  "kubernetes",
			mod:   kubeUsers,
			alice: []string{"Authorization", "Bearer alice"}, bob: []string{"Authorization", "Bearer bob"}, carl: []string{"Authorization", "Bearer carl"},
			wantA: kube("alice"), wantB: kube("bob"), wantC: kube("carl"),
		},
		{
			name:  "none",
			wantA: &api.Actor{Auth: "none", User: "anonymous"}, wantB: &api.Actor{Auth: "none", User: "anonymous"}, wantC: &api.Actor{Auth: "none", User: "anonymous"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.mod)
			tk := h.mustSubmit("team-a", taskDoc("job"), tc.alice...)
			if diff := cmp.Diff(tc.wantA, tk.SubmittedBy); diff != "" {
				t.Errorf("submit's answer: submittedBy (-want +got):\n%s", diff)
			}
			r, b := h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/cancel", nil, tc.bob...)
			if r.StatusCode != 200 {
				t.Fatalf("cancel: %s %s", r.Status, b)
			}
			h.finish(tk.ID, "Failed", "Cancelled")
			r, b = h.do(http.MethodPost, api.Prefix+"/tasks/"+tk.ID+"/rerun", nil, tc.carl...)
			if r.StatusCode != 201 {
				t.Fatalf("rerun: %s %s", r.Status, b)
			}
			var re api.Task
			if err := json.Unmarshal(b, &re); err != nil {
				t.Fatal(err)
			}
			r, b = h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID, nil, tc.bob...)
			var got api.Task
			if err := json.Unmarshal(b, &got); err != nil || r.StatusCode != 200 {
				t.Fatalf("get: %s %s", r.Status, b)
			}
			if diff := cmp.Diff(tc.wantA, got.SubmittedBy); diff != "" {
				t.Errorf("get: submittedBy (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantB, got.CancelledBy); diff != "" {
				t.Errorf("get: cancelledBy (-want +got):\n%s", diff)
			}
			r, b = h.do(http.MethodGet, api.Prefix+"/tasks?namespace=team-a", nil, tc.bob...)
			var l api.TaskList
			if err := json.Unmarshal(b, &l); err != nil || r.StatusCode != 200 || len(l.Items) != 2 {
				t.Fatalf("list: %s %s", r.Status, b)
			}
			for _, it := range l.Items {
				want := tc.wantA
				if it.ID == re.ID {
					want = tc.wantC
					if it.Origin != tk.ID {
						t.Errorf("rerun's origin %q", it.Origin)
					}
				}
				if diff := cmp.Diff(want, it.SubmittedBy); diff != "" {
					t.Errorf("list: %s submittedBy (-want +got):\n%s", it.ID, diff)
				}
			}
			rec, err := h.store.Get(t.Context(), re.ID)
			if err != nil || rec.SubmittedBy.User != tc.wantC.User {
				t.Errorf("stored rerun: %+v %v", rec.SubmittedBy, err)
			}
			if want := (store.Actor{}); !cmp.Equal(want, rec.CancelledBy) {
				t.Errorf("stored rerun's canceller: %+v", rec.CancelledBy)
			}
		})
	}
}
