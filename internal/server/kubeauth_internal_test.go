package server

import "testing"

// TestDrainIsReviewedAsCordoning: in kubernetes mode draining a cluster is
// asked as patching nodes, cluster-wide (what cordoning needs), and every
// other action as what it does to pods, or to /metrics.
func TestDrainIsReviewedAsCordoning(t *testing.T) {
	for action, want := range map[Action]string{
		ActionDrain:   "patch nodes in \"\"",
		ActionList:    "list pods in \"\"",
		ActionCancel:  "delete pods in \"\"",
		ActionMetrics: "get /metrics",
	} {
		ra, nra := reviewAttributes(action, AllNamespaces)
		var got string
		switch {
		case ra != nil:
			got = ra.Verb + " " + ra.Resource + " in \"" + ra.Namespace + "\""
		case nra != nil:
			got = nra.Verb + " " + nra.Path
		}
		if got != want {
			t.Errorf("%s: reviewed as %q, want %q", action, got, want)
		}
	}
}
