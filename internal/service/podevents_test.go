package service

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
)

// TestLimitedRecorder: which of a sequence of events (type, seconds after
// the start) the pods' events' limits let through and which they drop at
// once: Normal events within 2/s (burst 10), every event within 5/s (burst
// 20), so that Warnings keep the rest of the rate under load.
func TestLimitedRecorder(t *testing.T) {
	type burst struct {
		typ string
		at  float64 // seconds after the start
		n   int
	}
	for name, tc := range map[string]struct {
		bursts                   []burst
		wantNormal, wantWarning  int // recorded
		dropNormal, dropWarnings int
	}{
		"a few of each: all recorded": {
			bursts:     []burst{{corev1.EventTypeNormal, 0, 3}, {corev1.EventTypeWarning, 0, 3}},
			wantNormal: 3, wantWarning: 3,
		},
		"Normal beyond its burst: dropped at once, not queued": {
			bursts:     []burst{{corev1.EventTypeNormal, 0, 15}},
			wantNormal: 10, dropNormal: 5,
		},
		"Warnings after a Normal burst keep the rest of the overall burst": {
			bursts:     []burst{{corev1.EventTypeNormal, 0, 15}, {corev1.EventTypeWarning, 0, 15}},
			wantNormal: 10, dropNormal: 5, wantWarning: 10, dropWarnings: 5,
		},
		"Warnings alone: the overall burst": {
			bursts:      []burst{{corev1.EventTypeWarning, 0, 25}},
			wantWarning: 20, dropWarnings: 5,
		},
		"Normal refills at 2/s": {
			bursts:     []burst{{corev1.EventTypeNormal, 0, 10}, {corev1.EventTypeNormal, 1, 5}},
			wantNormal: 12, dropNormal: 3,
		},
		"the overall rate refills at 5/s": {
			bursts:      []burst{{corev1.EventTypeWarning, 0, 20}, {corev1.EventTypeWarning, 1, 8}},
			wantWarning: 25, dropWarnings: 3,
		},
	} {
		t.Run(name, func(t *testing.T) {
			fake := record.NewFakeRecorder(100)
			start := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
			now := start
			dropped := newDroppedEvents(prometheus.NewRegistry())
			r := newLimitedRecorder(fake, func() time.Time { return now }, dropped)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
			for _, b := range tc.bursts {
				now = start.Add(time.Duration(b.at * float64(time.Second)))
				for range b.n {
					r.Eventf(pod, b.typ, "Reason", "event %d", 1)
				}
			}
			close(fake.Events)
			got := map[string]int{}
			for ev := range fake.Events { // "TYPE REASON MESSAGE"
				got[strings.Fields(ev)[0]]++
			}
			if got[corev1.EventTypeNormal] != tc.wantNormal || got[corev1.EventTypeWarning] != tc.wantWarning {
				t.Errorf("recorded %d Normal, %d Warning; want %d, %d", got[corev1.EventTypeNormal], got[corev1.EventTypeWarning], tc.wantNormal, tc.wantWarning)
			}
			if n, w := testutil.ToFloat64(dropped.WithLabelValues(corev1.EventTypeNormal)), testutil.ToFloat64(dropped.WithLabelValues(corev1.EventTypeWarning)); int(n) != tc.dropNormal || int(w) != tc.dropWarnings {
				t.Errorf("dropped %v Normal, %v Warning; want %d, %d", n, w, tc.dropNormal, tc.dropWarnings)
			}
		})
	}
}
