package localnode

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRemoveLegacyTaint: a node started on a Node object that still has the
// taint of earlier versions loses that taint and keeps the others.
func TestRemoveLegacyTaint(t *testing.T) {
	other := corev1.Taint{Key: "example.com/dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	api := fake.NewClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "local-0"},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{legacyTaint, other}},
	})
	if err := removeLegacyTaint(context.Background(), api, "local-0"); err != nil {
		t.Fatal(err)
	}
	n, err := api.CoreV1().Nodes().Get(context.Background(), "local-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.Spec.Taints, []corev1.Taint{other}) {
		t.Errorf("taints %v, want only %v", n.Spec.Taints, other)
	}
	// Nothing to do: no write.
	before := len(api.Actions())
	if err := removeLegacyTaint(context.Background(), api, "local-0"); err != nil {
		t.Fatal(err)
	}
	for _, a := range api.Actions()[before:] {
		if a.GetVerb() != "get" {
			t.Errorf("unexpected %s on a node without the taint", a.GetVerb())
		}
	}
}

// steppingClock is a fake clock that a test steps at the worst moment: just
// before the first timer is armed.
type steppingClock struct {
	*clocktesting.FakeClock
	step    time.Duration
	stepped bool
}

func (c *steppingClock) NewTimer(d time.Duration) clock.Timer {
	if !c.stepped {
		c.stepped = true
		c.Step(c.step)
	}
	return c.FakeClock.NewTimer(d)
}

// TestTimerAtClockMovedWhileArming: a clock that moves between reading the
// time and arming the timer still gets a timer that fires at the instant
// asked for, not one step later.
func TestTimerAtClockMovedWhileArming(t *testing.T) {
	start := time.Now()
	c := &steppingClock{FakeClock: clocktesting.NewFakeClock(start), step: 5 * time.Second}
	timer := timerAt(c, start.Add(10*time.Second))
	if timer == nil {
		t.Fatal("no timer for an instant 10s ahead")
	}
	c.Step(5 * time.Second) // now exactly the instant asked for
	select {
	case <-timer.C():
	default:
		t.Fatal("the timer did not fire at the instant asked for")
	}
	if timerAt(c, start.Add(10*time.Second)) != nil {
		t.Error("a timer for an instant already reached")
	}
}
