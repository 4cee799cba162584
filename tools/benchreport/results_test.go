package main

import "testing"

// TestSmaller: a run is a smoke run when its size or a size variable says
// so; the binaries it measures do not make it one.
func TestSmaller(t *testing.T) {
	for env, want := range map[string]bool{
		"":                                      false,
		"KUBETASK_BENCH_BIN=/tmp/kubetask-head": false,
		"KUBETASK_BENCH_BASELINE_BIN=/tmp/kubetask-016ccbf KUBETASK_BENCH_BIN=/tmp/kubetask-head": false,
		"KUBETASK_BENCH_BIN=/tmp/kubetask-head KUBETASK_BENCH_PAIRS=6":                            true,
		"KUBETASK_BENCH_SIZE=tiny": true,
	} {
		r := &run{config: map[string]string{"env": env}}
		if got := r.smaller(); got != want {
			t.Errorf("env %q: smaller %v, want %v", env, got, want)
		}
	}
}
