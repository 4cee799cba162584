package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubetask/kubetask/pkg/task"
)

// dryRuns is a fake API server that answers pod dry runs with answer and
// counts them.
type dryRuns struct {
	client *fake.Clientset
	n      atomic.Int32
	mu     sync.Mutex
	answer error
	hold   chan struct{} // when set, each dry run waits for it to close
}

func newDryRuns() *dryRuns {
	d := &dryRuns{client: fake.NewClientset()}
	d.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		c := a.(k8stesting.CreateActionImpl)
		if len(c.GetCreateOptions().DryRun) == 0 {
			return true, nil, errors.New("not a dry run")
		}
		d.n.Add(1)
		d.mu.Lock()
		answer, hold := d.answer, d.hold
		d.mu.Unlock()
		if hold != nil {
			<-hold
		}
		return true, c.GetObject(), answer
	})
	return d
}

func (d *dryRuns) set(answer error, hold chan struct{}) {
	d.mu.Lock()
	d.answer, d.hold = answer, hold
	d.mu.Unlock()
}

func validTask(t *testing.T, name, image string) *task.Task {
	t.Helper()
	tk, err := task.Parse([]byte("apiVersion: kubetask.dev/v1alpha1\nkind: Task\nmetadata: {name: " + name + "}\nspec:\n  template:\n    spec:\n      containers: [{name: main, image: " + image + "}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestValidationsAskOncePerSpec: the API server is asked about a spec in a
// namespace once per TTL, whatever the tasks' names; another spec, another
// namespace or a passed TTL is asked again; refusals and failures to ask
// are never kept.
func TestValidationsAskOncePerSpec(t *testing.T) {
	ctx := context.Background()
	d := newDryRuns()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_000_000, 0))
	v := newValidations(d.client, clk, time.Minute, 100)
	step := func(what string, tk *task.Task, ns string, wantCached bool, wantAsked int32, wantInvalid bool) {
		t.Helper()
		source, err := v.validate(ctx, tk, ns)
		var inv *task.InvalidError
		want := verdictDryRun
		if wantCached {
			want = verdictCached
		}
		if source != want || d.n.Load() != wantAsked || errors.As(err, &inv) != wantInvalid {
			t.Fatalf("%s: verdict %s, %d dry runs, err %v; want %s, %d, invalid %v", what, source, d.n.Load(), err, want, wantAsked, wantInvalid)
		}
	}
	step("first", validTask(t, "a", "busybox"), "ns", false, 1, false)
	step("same spec, another name", validTask(t, "b", "busybox"), "ns", true, 1, false)
	step("another namespace", validTask(t, "a", "busybox"), "other", false, 2, false)
	step("another spec", validTask(t, "a", "alpine"), "ns", false, 3, false)
	clk.SetTime(clk.Now().Add(59 * time.Second))
	step("within the TTL", validTask(t, "c", "busybox"), "ns", true, 3, false)
	clk.SetTime(clk.Now().Add(time.Second))
	step("the TTL passed", validTask(t, "c", "busybox"), "ns", false, 4, false)

	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "x", field.ErrorList{field.Invalid(field.NewPath("spec", "containers").Index(0).Child("image"), "bad image", "bad")})
	d.set(invalid, nil)
	step("refused", validTask(t, "r", "refused"), "ns", false, 5, true)
	step("refused again: asked again", validTask(t, "r", "refused"), "ns", false, 6, true)
	d.set(apierrors.NewInternalError(errors.New("etcd is down")), nil)
	step("cannot tell", validTask(t, "u", "unknown"), "ns", false, 7, false)
	d.set(nil, nil)
	step("asked again after a failure", validTask(t, "u", "unknown"), "ns", false, 8, false)
	step("kept after a success", validTask(t, "u2", "unknown"), "ns", true, 8, false)

	off := newValidations(d.client, clk, -1, 100)
	for range 2 {
		if source, err := off.validate(ctx, validTask(t, "a", "busybox"), "ns"); source != verdictDryRun || err != nil {
			t.Fatalf("TTL off: %s, %v", source, err)
		}
	}
	if n := d.n.Load(); n != 10 {
		t.Errorf("TTL off: %d dry runs in all, want 10", n)
	}
}

// TestValidationsShareADryRun: submissions of one spec that arrive while
// its dry run is in flight wait for it instead of sending their own, and a
// waiter whose request ends does not end the dry run for the others.
func TestValidationsShareADryRun(t *testing.T) {
	d := newDryRuns()
	hold := make(chan struct{})
	d.set(nil, hold)
	v := newValidations(d.client, clocktesting.NewFakePassiveClock(time.Unix(1_000_000, 0)), time.Minute, 100)

	first, cancelFirst := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() { _, err := v.validate(first, validTask(t, "first", "busybox"), "ns"); firstDone <- err }()
	waitFor(t, "the first dry run", func() bool { return d.n.Load() == 1 })
	var wg sync.WaitGroup
	errs := make([]error, 8)
	sources := make([]string, 8)
	for i := range errs {
		wg.Go(func() { sources[i], errs[i] = v.validate(context.Background(), validTask(t, "other", "busybox"), "ns") })
	}
	cancelFirst() // the first submission's client goes away
	if err := <-firstDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled submission: %v", err)
	}
	close(hold)
	wg.Wait()
	for i, err := range errs {
		if err != nil || sources[i] == verdictDryRun {
			t.Errorf("submission %d: %s, %v; want a shared or cached verdict", i, sources[i], err)
		}
	}
	// Those that joined the flight sent nothing; any that came after it
	// found the acceptance cached.
	if n := d.n.Load(); n != 1 {
		t.Errorf("%d dry runs for one spec, want 1", n)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
