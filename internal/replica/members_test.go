package replica

import (
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func lease(name, holder string, renew time.Time, secs int32) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if holder != "" {
		l.Spec.HolderIdentity = &holder
	}
	if !renew.IsZero() {
		rt := metav1.NewMicroTime(renew)
		l.Spec.RenewTime = &rt
	}
	l.Spec.LeaseDurationSeconds = &secs
	return l
}

// TestLiveMembers: a member is live while its renew time changed within
// its duration by this process's clock (the renew time's own value, from
// another machine's clock, is never compared with ours).
func TestLiveMembers(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	far := t0.Add(-time.Hour) // a remote clock far behind: does not matter
	for _, tc := range []struct {
		name     string
		steps    [][]*coordinationv1.Lease // lease lists seen at t0, t0+5s, t0+10s...
		leaving  bool
		want     []string // at the last step
		wantSeen int      // observations kept
	}{
		{name: "self only", steps: [][]*coordinationv1.Lease{nil}, want: []string{"me"}},
		{name: "leaving: not self", steps: [][]*coordinationv1.Lease{nil}, leaving: true, want: nil},
		{name: "a new lease counts at once, whatever its renew time", steps: [][]*coordinationv1.Lease{{lease("a", "A", far, 15)}}, want: []string{"me", "A"}, wantSeen: 1},
		{name: "renewed: stays", steps: [][]*coordinationv1.Lease{
			{lease("a", "A", far, 15)}, {lease("a", "A", far.Add(2*time.Second), 15)}, {lease("a", "A", far.Add(4*time.Second), 15)}, {lease("a", "A", far.Add(6*time.Second), 15)},
		}, want: []string{"me", "A"}, wantSeen: 1},
		{name: "not renewed for its duration: gone", steps: [][]*coordinationv1.Lease{
			{lease("a", "A", far, 15)}, {lease("a", "A", far, 15)}, {lease("a", "A", far, 15)}, {lease("a", "A", far, 15)},
		}, want: []string{"me"}, wantSeen: 1},
		{name: "released (no holder)", steps: [][]*coordinationv1.Lease{{lease("a", "", far, 15)}}, want: []string{"me"}, wantSeen: 1},
		{name: "deleted: forgotten", steps: [][]*coordinationv1.Lease{{lease("a", "A", far, 15)}, nil}, want: []string{"me"}},
		{name: "a stale lease of my own identity counts once", steps: [][]*coordinationv1.Lease{{lease("m", "me", far, 15), lease("b", "B", far, 15)}}, want: []string{"me", "B"}, wantSeen: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			observed := map[string]observation{}
			var got []string
			for i, ls := range tc.steps {
				got = liveMembers(ls, observed, "me", tc.leaving, t0.Add(time.Duration(i)*5*time.Second))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("live = %v, want %v", got, tc.want)
			}
			if len(observed) != tc.wantSeen {
				t.Errorf("%d observations kept, want %d", len(observed), tc.wantSeen)
			}
		})
	}
}
