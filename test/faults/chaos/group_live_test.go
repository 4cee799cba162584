package chaos

import (
	"slices"
	"testing"

	"github.com/kubetask/kubetask/pkg/client"
)

// TestLiveOf: the stream submits only to replicas that run, are not
// stopped and have their client. A replica being restarted was live before
// its client existed, and the first full run on the fence panicked
// submitting through its nil client.
func TestLiveOf(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	close(exited)
	running := func() chan struct{} { return make(chan struct{}) }
	cases := map[string]struct {
		replicas map[string]*replicaProc
		want     []string
	}{
		"all three ready": {
			replicas: map[string]*replicaProc{"r0": {id: "r0", done: running(), client: c}, "r1": {id: "r1", done: running(), client: c}, "r2": {id: "r2", done: running(), client: c}},
			want:     []string{"r0", "r1", "r2"},
		},
		"one starting, without its client yet": {
			replicas: map[string]*replicaProc{"r0": {id: "r0", done: running()}, "r1": {id: "r1", done: running(), client: c}},
			want:     []string{"r1"},
		},
		"one stopped, one exited": {
			replicas: map[string]*replicaProc{"r0": {id: "r0", done: running(), client: c, stopped: true}, "r1": {id: "r1", done: exited, client: c}, "r2": {id: "r2", done: running(), client: c}},
			want:     []string{"r2"},
		},
		"none": {replicas: map[string]*replicaProc{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, r := range liveOf(tc.replicas) {
				got = append(got, r.id)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("live %v, want %v", got, tc.want)
			}
		})
	}
}
