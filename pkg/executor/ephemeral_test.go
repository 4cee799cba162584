package executor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// TestInstanceLeaseRequests: the requests an executor makes for its
// instance Lease until it acts (OnLeading) and once Start returned, and
// whether the Lease is left behind. An ephemeral Lease takes a free
// instance with one create and lets it go with one delete; leaderelection's
// LeaseLock reads before it creates and reads before it releases. A Lease
// left by a killed process is taken once expired, as the LeaseLock takes it.
// (leaderelection renews right after it took the Lease, concurrently with
// the executor's start: those updates are left out.)
func TestInstanceLeaseRequests(t *testing.T) {
	expired := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: LeaseName("inst")},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("killed"), LeaseDurationSeconds: ptr.To[int32](1),
			AcquireTime: &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}, RenewTime: &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}},
	}
	for name, tc := range map[string]struct {
		ephemeral bool
		existing  *coordinationv1.Lease
		noDelete  bool // RBAC forbids deleting Leases
		// until: the requests until the Lease is taken, repeated gets
		// (waiting for an expiry) counted once; release: those once Start
		// returned, renewals left out.
		until, release []string
		leftBehind     bool
	}{
		"leaderelection's lease, free":          {until: []string{"get", "create"}, release: []string{"get", "update"}, leftBehind: true},
		"ephemeral lease, free":                 {ephemeral: true, until: []string{"create"}, release: []string{"delete"}},
		"ephemeral lease, left by a killed one": {ephemeral: true, existing: expired, until: []string{"create", "get", "update"}, release: []string{"delete"}},
		"ephemeral lease, no right to delete":   {ephemeral: true, noDelete: true, until: []string{"create"}, release: []string{"delete"}, leftBehind: true},
	} {
		t.Run(name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing.DeepCopy())
			}
			client := fake.NewClientset(objs...)
			var mu sync.Mutex
			var verbs []string
			client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				verbs = append(verbs, a.GetVerb())
				mu.Unlock()
				if tc.noDelete && a.GetVerb() == "delete" {
					return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), LeaseName("inst"), errors.New("RBAC"))
				}
				return false, nil, nil
			})
			taken := make(chan int, 1)
			ex, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Client: client, InstanceID: "inst",
				EphemeralLease: tc.ephemeral, LeaseDuration: 8 * time.Second, RenewDeadline: 5 * time.Second, RetryPeriod: time.Second,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				OnLeading: func(context.Context) error {
					mu.Lock()
					taken <- len(verbs)
					mu.Unlock()
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- ex.Start(ctx) }()
			var n int
			select {
			case n = <-taken:
			case <-time.After(20 * time.Second):
				t.Fatal("never took the lease")
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			until, rest := acquiring(verbs[:n]), verbs[n:]
			mu.Unlock()
			if d := cmp.Diff(tc.until, until); d != "" {
				t.Errorf("requests until the lease is taken (-want +got):\n%s", d)
			}
			// Renewals (updates) may come before the release, and an
			// ephemeral Lease's release is not an update.
			got := rest[max(len(rest)-len(tc.release), 0):]
			if tc.ephemeral {
				got = slices.DeleteFunc(slices.Clone(rest), func(v string) bool { return v == "update" })
			}
			if !slices.Equal(tc.release, got) {
				t.Errorf("requests once it acted: %v, want renewals and then %v", rest, tc.release)
			}
			lease, err := client.CoordinationV1().Leases("default").Get(context.Background(), LeaseName("inst"), metav1.GetOptions{})
			if left := !apierrors.IsNotFound(err); left != tc.leftBehind {
				t.Errorf("lease left behind: %v, want %v (err %v)", left, tc.leftBehind, err)
			}
			if err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
				t.Errorf("the lease left behind is held by %q, want it released", *lease.Spec.HolderIdentity)
			}
		})
	}
}

// acquiring returns the requests up to the one that took the Lease (the
// first create or update after which OnLeading ran), repeated gets counted
// once: leaderelection renews at once after it took it.
func acquiring(verbs []string) []string {
	var out []string
	for _, v := range verbs {
		if v == "get" && len(out) > 0 && out[len(out)-1] == "get" {
			continue
		}
		out = append(out, v)
	}
	// The renewals that followed the taking write.
	for len(out) > 1 && out[len(out)-1] == "update" && (out[len(out)-2] == "update" || out[len(out)-2] == "create") {
		out = out[:len(out)-1]
	}
	return out
}

// TestEphemeralLockRenewals: leaderelection renews at once after it took
// the Lease; an ephemeral lock answers a renewal that comes less than
// fresh after its own write with that write, and sends every other one.
func TestEphemeralLockRenewals(t *testing.T) {
	const fresh = 500 * time.Millisecond
	killed := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "l"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("killed"), LeaseDurationSeconds: ptr.To[int32](1)},
	}
	for name, tc := range map[string]struct {
		existing *coordinationv1.Lease
		fresh    time.Duration
		after    time.Duration // from the taking write to the renewal
		holder   string        // of the renewal's record
		// sent: the requests from the renewal on.
		sent []string
	}{
		"at once after creating it":    {fresh: fresh, holder: "me"},
		"just before fresh":            {fresh: fresh, after: fresh - time.Millisecond, holder: "me"},
		"at fresh":                     {fresh: fresh, after: fresh, holder: "me", sent: []string{"update"}},
		"at once after taking it over": {existing: killed, fresh: fresh, holder: "me"},
		"fresh zero":                   {holder: "me", sent: []string{"update"}},
		"a record of another holder":   {fresh: fresh, holder: "other", sent: []string{"update"}},
		"later, after taking it over":  {existing: killed, fresh: fresh, after: time.Second, holder: "me", sent: []string{"update"}},
	} {
		t.Run(name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing.DeepCopy())
			}
			client := fake.NewClientset(objs...)
			var verbs []string
			client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
				verbs = append(verbs, a.GetVerb())
				return false, nil, nil
			})
			clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			l := &ephemeralLock{client: client.CoordinationV1(), meta: metav1.ObjectMeta{Namespace: "default", Name: "l"},
				identity: "me", duration: 8 * time.Second, fresh: tc.fresh, clock: clk, renewClock: clk}
			ctx := context.Background()
			rec := resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaseDurationSeconds: 8}
			// Taking it, as leaderelection does: Get, then Create when it
			// is not found, else Update.
			if _, _, err := l.Get(ctx); apierrors.IsNotFound(err) {
				if err := l.Create(ctx, rec); err != nil {
					t.Fatal(err)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if err := l.Update(ctx, rec); err != nil {
				t.Fatal(err)
			}
			took := len(verbs)
			clk.SetTime(clk.Now().Add(tc.after))
			renewal := rec
			renewal.HolderIdentity = tc.holder
			renewal.RenewTime = metav1.NewTime(clk.Now())
			if err := l.Update(ctx, renewal); err != nil {
				t.Fatal(err)
			}
			if got := verbs[took:]; !slices.Equal(got, tc.sent) {
				t.Errorf("requests for the renewal: %v, want %v", got, tc.sent)
			}
			lease, err := client.CoordinationV1().Leases("default").Get(ctx, "l", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := ptr.Deref(lease.Spec.HolderIdentity, ""), "me"; tc.holder == "me" && got != want {
				t.Errorf("holder %q, want %q", got, want)
			}
		})
	}
}

// TestEphemeralFresh: how soon after its write a renewal is answered by it.
func TestEphemeralFresh(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry, want time.Duration
	}{
		{8 * time.Second, 8 * time.Second * 2 / 3, 8 * time.Second / 6, 8 * time.Second / 12}, // kubetask run's
		{15 * time.Second, 10 * time.Second, 2 * time.Second, time.Second},                    // the defaults
		{10 * time.Second, 8 * time.Second, 1900 * time.Millisecond, 100 * time.Millisecond},  // the margin is less
		{6 * time.Second, 5 * time.Second, time.Second, 0},                                    // no margin
	} {
		if got := ephemeralFresh(tc.lease, tc.renew, tc.retry); got != tc.want {
			t.Errorf("ephemeralFresh(%s, %s, %s) = %s, want %s", tc.lease, tc.renew, tc.retry, got, tc.want)
		}
	}
}
