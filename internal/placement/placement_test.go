package placement

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/pkg/store"
)

var (
	east    = Cluster{Name: "east", Labels: map[string]string{"region": "eu", "gpu": "a100"}, State: store.ClusterReady, Free: 3}
	west    = Cluster{Name: "west", Labels: map[string]string{"region": "us"}, State: store.ClusterReady, Free: 5}
	north   = Cluster{Name: "north", Labels: map[string]string{"region": "eu"}, State: store.ClusterReady, Free: 5}
	inEU    = &metav1.LabelSelector{MatchLabels: map[string]string{"region": "eu"}}
	withGPU = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "gpu", Operator: metav1.LabelSelectorOpExists}}}
)

func in(c Cluster, st store.ClusterState, free int) Cluster {
	c.State, c.Free = st, free
	return c
}

func TestChoose(t *testing.T) {
	for name, tc := range map[string]struct {
		want     Want
		clusters []Cluster
		name     string // "": none now
	}{
		"any: the most free slots":                 {Want{}, []Cluster{east, west}, "west"},
		"any: a tie goes to the first name":        {Want{}, []Cluster{west, north}, "north"},
		"any: the order given does not matter":     {Want{}, []Cluster{north, west}, "north"},
		"a named cluster, though others have more": {Want{Cluster: "east"}, []Cluster{east, west}, "east"},
		"a named cluster that is full":             {Want{Cluster: "east"}, []Cluster{in(east, store.ClusterReady, 0), west}, ""},
		"a selector: only the clusters it allows":  {Want{ClusterSelector: inEU}, []Cluster{east, west}, "east"},
		"a selector by a label's existence":        {Want{ClusterSelector: withGPU}, []Cluster{north, east, west}, "east"},
		"a selector: the most free of those":       {Want{ClusterSelector: inEU}, []Cluster{east, north, west}, "north"},
		"never an unreachable cluster":             {Want{}, []Cluster{in(west, store.ClusterUnreachable, 9), east}, "east"},
		"never a draining cluster":                 {Want{}, []Cluster{in(west, store.ClusterDraining, 9), east}, "east"},
		"never a lost cluster":                     {Want{}, []Cluster{in(west, store.ClusterLost, 9), east}, "east"},
		"never a returning cluster":                {Want{}, []Cluster{in(west, store.ClusterReturning, 9), east}, "east"},
		"a named cluster that is draining: none":   {Want{Cluster: "west"}, []Cluster{in(west, store.ClusterDraining, 9), east}, ""},
		"no free slot anywhere":                    {Want{}, []Cluster{in(east, store.ClusterReady, 0), in(west, store.ClusterReady, -1)}, ""},
		"no cluster":                               {Want{}, nil, ""},
		"both a name and a selector: none":         {Want{Cluster: "east", ClusterSelector: inEU}, []Cluster{east}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := Choose(tc.want, tc.clusters)
			if got != tc.name || ok != (tc.name != "") {
				t.Errorf("Choose = %q, %v; want %q", got, ok, tc.name)
			}
		})
	}
}

// TestQueue: with no free slot anywhere, the Ready cluster allowed with
// the shortest line (the most Free); Choose's answer whenever it has one.
func TestQueue(t *testing.T) {
	for name, tc := range map[string]struct {
		want     Want
		clusters []Cluster
		name     string // "": no Ready cluster allowed
	}{
		"a free slot: as Choose":            {Want{}, []Cluster{east, west}, "west"},
		"none free: the shortest line":      {Want{}, []Cluster{in(east, store.ClusterReady, -3), in(west, store.ClusterReady, -1)}, "west"},
		"none free: a tie by name":          {Want{}, []Cluster{in(west, store.ClusterReady, 0), in(east, store.ClusterReady, 0)}, "east"},
		"a named cluster that is full":      {Want{Cluster: "east"}, []Cluster{in(east, store.ClusterReady, -5), west}, "east"},
		"a selector: only those it allows":  {Want{ClusterSelector: inEU}, []Cluster{in(east, store.ClusterReady, -9), west}, "east"},
		"never a cluster that is not Ready": {Want{}, []Cluster{in(west, store.ClusterUnreachable, 9), in(east, store.ClusterReady, -2)}, "east"},
		"none Ready":                        {Want{Cluster: "west"}, []Cluster{in(west, store.ClusterDraining, 9), east}, ""},
		"no cluster":                        {Want{}, nil, ""},
		"both a name and a selector: none":  {Want{Cluster: "east", ClusterSelector: inEU}, []Cluster{east}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := Queue(tc.want, tc.clusters)
			if got != tc.name || ok != (tc.name != "") {
				t.Errorf("Queue = %q, %v; want %q", got, ok, tc.name)
			}
			if c, ok := Choose(tc.want, tc.clusters); ok && c != got {
				t.Errorf("Choose = %q but Queue = %q", c, got)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "region", Operator: "Near"}}}
	for name, tc := range map[string]struct {
		want  Want
		err   []string // substrings of the error; none: no error
		unmet bool     // the error wraps ErrNoCluster
	}{
		"any":                                 {Want{}, nil, false},
		"a configured cluster, even draining": {Want{Cluster: "west"}, nil, false},
		"a selector that matches one":         {Want{ClusterSelector: withGPU}, nil, false},
		"a cluster not configured":            {Want{Cluster: "south"}, []string{`spec.placement.cluster "south"`, "east (gpu=a100,region=eu), west (region=us)"}, true},
		"a selector that matches none": {Want{ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "ap"}}},
			[]string{"spec.placement.clusterSelector", "matches none", "east (gpu=a100,region=eu)"}, true},
		"an invalid selector":        {Want{ClusterSelector: bad}, []string{"spec.placement.clusterSelector", "Near"}, false},
		"both a name and a selector": {Want{Cluster: "east", ClusterSelector: inEU}, []string{"spec.placement", "exclusive"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			err := Check(tc.want, []Cluster{in(west, store.ClusterDraining, 0), east})
			if len(tc.err) == 0 {
				if err != nil {
					t.Fatalf("Check: %v; want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check: no error; want one saying %q", tc.err)
			}
			for _, s := range tc.err {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Check: %v; want it to say %q", err, s)
				}
			}
			if errors.Is(err, ErrNoCluster) != tc.unmet {
				t.Errorf("Check: %v; wraps ErrNoCluster: %v, want %v", err, errors.Is(err, ErrNoCluster), tc.unmet)
			}
		})
	}
	if err := Check(Want{}, nil); err == nil || !strings.Contains(err.Error(), "none is configured") {
		t.Errorf("Check with no cluster: %v; want it to say none is configured", err)
	}
}

func TestMovable(t *testing.T) {
	ended := func(stopped bool, cluster, reason string) store.AttemptOutcome {
		return store.AttemptOutcome{Attempt: 0, Phase: "Failed", Reason: reason, Cluster: cluster, PodStopped: stopped}
	}
	for name, tc := range map[string]struct {
		rec  store.Record
		want bool
	}{
		"a first attempt, no pod":                        {store.Record{Cluster: "east"}, true},
		"a first attempt with its pod":                   {store.Record{Cluster: "east", PodCreated: true}, false},
		"finished":                                       {store.Record{Cluster: "east", Terminal: true}, false},
		"the previous attempt's pod stopped":             {store.Record{Cluster: "east", Attempt: 1, Attempts: []store.AttemptOutcome{ended(true, "east", "ExitCode")}}, true},
		"the previous attempt's pod may still stop here": {store.Record{Cluster: "east", Attempt: 1, Attempts: []store.AttemptOutcome{ended(false, "east", "ExitCode")}}, false},
		"the previous attempt ran on another cluster":    {store.Record{Cluster: "west", Attempt: 1, Attempts: []store.AttemptOutcome{ended(false, "east", "ExitCode")}}, true},
		"the previous attempt was lost with its cluster": {store.Record{Cluster: "", Attempt: 1, Attempts: []store.AttemptOutcome{ended(false, "east", "ClusterLost")}}, true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Movable(tc.rec); got != tc.want {
				t.Errorf("Movable = %v, want %v", got, tc.want)
			}
		})
	}
}
