package executor

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// The submitter is kept on the record and stamped on every pod of the task
// (the pod is created with the executor's identity: the annotation is what
// admission policies and audits can see of the submitter); the canceller is
// kept by the call that cancels.
func TestSubmitterStampedOnPodsAndCancellerKept(t *testing.T) {
	f := newFx(t, nil)
	alice := store.Actor{Auth: "kubernetes", User: "alice", UID: "u-1", Groups: []string{"team-a", "system:authenticated"}}
	f.submit("x", newTask(), SubmittedBy(alice))
	if got := f.record("x").SubmittedBy; !cmp.Equal(got, alice) {
		t.Fatalf("recorded submitter %+v, want %+v", got, alice)
	}
	if _, _, err := f.sync("x"); err != nil {
		t.Fatal(err)
	}
	f.drainCreations()
	p := f.serverPod(task.PodName(identOf(f, "x"), 0))
	if p == nil {
		t.Fatal("no pod created")
	}
	got, err := store.ParseActor(p.Annotations[task.AnnotationSubmittedBy])
	if err != nil || !cmp.Equal(got, alice) {
		t.Errorf("pod annotation %s=%q (%v), want %+v", task.AnnotationSubmittedBy, p.Annotations[task.AnnotationSubmittedBy], err, alice)
	}

	ops := store.Actor{Auth: "token", User: "ops"}
	if err := f.ex.Cancel(context.Background(), "x", CancelledBy(ops)); err != nil {
		t.Fatal(err)
	}
	if err := f.ex.Cancel(context.Background(), "x", CancelledBy(store.Actor{Auth: "token", User: "late"})); err != nil {
		t.Fatal(err)
	}
	if got := f.record("x").CancelledBy; !cmp.Equal(got, ops) {
		t.Errorf("recorded canceller %+v, want the first, %+v", got, ops)
	}

	// A task submitted without one: no annotation.
	f.submit("y", newTask())
	if _, _, err := f.sync("y"); err != nil {
		t.Fatal(err)
	}
	f.drainCreations()
	if p := f.serverPod(task.PodName(identOf(f, "y"), 0)); p == nil || p.Annotations[task.AnnotationSubmittedBy] != "" {
		t.Errorf("pod of an unattributed task: %v", p)
	}
}
