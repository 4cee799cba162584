package placement

import (
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
)

func TestNext(t *testing.T) {
	now := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	const after = 30 * time.Second
	quiet := func(d time.Duration) time.Time { return now.Add(-d) }
	for name, tc := range map[string]struct {
		seen Seen
		want store.ClusterState // "": no change
	}{
		"ready, answers":                       {Seen{State: store.ClusterReady, Answers: true}, ""},
		"ready, quiet for less than the delay": {Seen{State: store.ClusterReady, QuietSince: quiet(29 * time.Second)}, ""},
		"ready, quiet for the delay":           {Seen{State: store.ClusterReady, QuietSince: quiet(after)}, store.ClusterUnreachable},
		"ready, quiet, no since known":         {Seen{State: store.ClusterReady}, ""},
		"ready, quiet, credentials refused":    {Seen{State: store.ClusterReady, QuietSince: quiet(after), Refused: "403"}, store.ClusterUnreachable},
		"unreachable, answers again":           {Seen{State: store.ClusterUnreachable, Answers: true}, store.ClusterReady},
		"unreachable, still quiet":             {Seen{State: store.ClusterUnreachable, QuietSince: quiet(time.Hour)}, ""},
		"draining stays, quiet":                {Seen{State: store.ClusterDraining, QuietSince: quiet(time.Hour)}, ""},
		"draining stays, answers":              {Seen{State: store.ClusterDraining, Answers: true}, ""},
		"lost, quiet":                          {Seen{State: store.ClusterLost, QuietSince: quiet(time.Hour)}, ""},
		"lost, answers":                        {Seen{State: store.ClusterLost, Answers: true, Stranded: 3}, store.ClusterReturning},
		"lost, answers, nothing stranded":      {Seen{State: store.ClusterLost, Answers: true}, store.ClusterReturning},
		"returning, lost pods left":            {Seen{State: store.ClusterReturning, Answers: true, Stranded: 1}, ""},
		"returning, none left":                 {Seen{State: store.ClusterReturning, Answers: true}, store.ClusterReady},
		"returning, quiet again (none known)":  {Seen{State: store.ClusterReturning, QuietSince: quiet(time.Minute)}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			got, reason, _, change := Next(tc.seen, now, after)
			if change != (tc.want != "") || change && got != tc.want {
				t.Errorf("Next = %s (%s), change %v; want %q", got, reason, change, tc.want)
			}
			if !change && got != tc.seen.State {
				t.Errorf("no change, yet the state %s is not the row's %s", got, tc.seen.State)
			}
			if want := map[bool]string{false: ReasonNotAnswering, true: ReasonCredentialsRefused}[tc.seen.Refused != ""]; change && got == store.ClusterUnreachable && reason != want {
				t.Errorf("Unreachable because %s, want %s", reason, want)
			}
		})
	}
}
