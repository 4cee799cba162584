package simulation

import (
	"strings"
	"testing"
)

// h builds a hand-made history: each line "kind task/attempt uid [code=N]
// [phase/reason] [note]" in order.
func h(lines ...string) []Event {
	var out []Event
	for i, l := range lines {
		f := strings.Fields(l)
		e := Event{Seq: i + 1, Kind: f[0]}
		for _, x := range f[1:] {
			switch {
			case strings.HasPrefix(x, "t") && strings.Contains(x, "/") && e.Task == "":
				parts := strings.SplitN(x, "/", 2)
				e.Task = parts[0]
				e.Attempt = int(parts[1][0] - '0')
			case strings.HasPrefix(x, "u"):
				e.UID = x
			case strings.HasPrefix(x, "code="):
				c := int32(0)
				for _, d := range x[5:] {
					c = c*10 + int32(d-'0')
				}
				e.Code = &c
			case strings.Contains(x, "/"):
				parts := strings.SplitN(x, "/", 2)
				e.Phase, e.Reason = parts[0], parts[1]
			default:
				e.Note = x
			}
		}
		out = append(out, e)
	}
	return out
}

// A correct run of one attempt: the base every case below breaks once.
var good = []string{
	"submit t0/0",
	"create t0/0 u1 gated",
	"record t0/0 u1",
	"ungate t0/0 u1",
	"bind t0/0 u1",
	"start t0/0 u1",
	"exit t0/0 u1 code=0",
	"stopped t0/0 u1",
	"outcome t0/0 u1 code=0 Succeeded/Completed",
	"final t0/0 code=0 Succeeded/Completed",
	"delete t0/0 u1 client",
	"gone t0/0 u1",
	"end quiet",
}

// lostRun is a history of attempt 0 declared lost with its cluster while
// its pod u1 ran, attempt 1 run elsewhere beside it, and then what u1's
// end brought (its exit, a discarded end).
func lostRun(end ...string) []string {
	l := []string{
		"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "ungate t0/0 u1", "bind t0/0 u1", "start t0/0 u1",
		"outcome t0/0 u1 Failed/ClusterLost",
		"create t0/1 u2 gated", "record t0/1 u2", "ungate t0/1 u2", "bind t0/1 u2", "start t0/1 u2",
		"exit t0/1 u2 code=0", "stopped t0/1 u2", "outcome t0/1 u2 code=0 Succeeded/Completed", "final t0/1 code=0 Succeeded/Completed",
		"delete t0/1 u2 client", "gone t0/1 u2",
	}
	l = append(l, end...)
	return append(l, "stopped t0/0 u1", "delete t0/0 u1 client", "gone t0/0 u1", "end quiet")
}

func TestCheck(t *testing.T) {
	valid := map[string]bool{"t0": true}
	for name, tc := range map[string]struct {
		events []string
		want   string // the invariant broken; "" none
	}{
		"a correct run": {good, ""},
		"a retry after the first pod stopped": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "exit t0/0 u1 code=3", "stopped t0/0 u1",
			"outcome t0/0 u1 code=3 Failed/ExitCode", "delete t0/0 u1 client", "gone t0/0 u1",
			"create t0/1 u2", "bind t0/1 u2", "exit t0/1 u2 code=0", "stopped t0/1 u2",
			"outcome t0/1 u2 code=0 Succeeded/Completed", "final t0/1 code=0 Succeeded/Completed", "end quiet"}, ""},
		"a stale gated pod that never ran": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "create t0/0 u2 gated", "record t0/0 u2", "ungate t0/0 u2", "bind t0/0 u2",
			"delete t0/0 u1 client", "gone t0/0 u1", "exit t0/0 u2 code=0", "stopped t0/0 u2",
			"outcome t0/0 u2 code=0 Succeeded/Completed", "final t0/0 code=0 Succeeded/Completed", "end quiet"}, ""},
		"two pods of one attempt ran": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "stopped t0/0 u1", "create t0/0 u2", "bind t0/0 u2",
			"exit t0/0 u2 code=0", "stopped t0/0 u2", "outcome t0/0 u2 code=0 Succeeded/Completed", "final t0/0 code=0 Succeeded/Completed", "end quiet"}, InvOneRun},
		"a gate removed after the outcome (cancelled)": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "cancel t0/0",
			"outcome t0/0 u1 Failed/Cancelled", "final t0/0 Failed/Cancelled", "ungate t0/0 u1", "bind t0/0 u1",
			"delete t0/0 u1 client", "stopped t0/0 u1", "gone t0/0 u1", "end quiet"}, InvAfter},
		"a pod released before the outcome and bound after it": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "ungate t0/0 u1", "cancel t0/0",
			"outcome t0/0 u1 Failed/Cancelled", "final t0/0 Failed/Cancelled", "bind t0/0 u1",
			"delete t0/0 u1 client", "stopped t0/0 u1", "gone t0/0 u1", "end quiet"}, ""},
		"a gate removed after the cancellation was recorded, bound after the outcome": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "cancel t0/0", "cancelled t0/0", "ungate t0/0 u1",
			"outcome t0/0 u1 Failed/Cancelled", "final t0/0 Failed/Cancelled", "bind t0/0 u1",
			"delete t0/0 u1 client", "stopped t0/0 u1", "gone t0/0 u1", "end quiet"}, InvAfter},
		"a gate removed after the cancellation was recorded, bound before the outcome": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "cancel t0/0", "cancelled t0/0", "ungate t0/0 u1",
			"bind t0/0 u1", "delete t0/0 u1 client", "stopped t0/0 u1", "gone t0/0 u1",
			"outcome t0/0 u1 Failed/Cancelled", "final t0/0 Failed/Cancelled", "end quiet"}, ""},
		"deleted externally, but kubetask deleted it": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "ungate t0/0 u1", "delete t0/0 u1 client", "gone t0/0 u1",
			"outcome t0/0 u1 Failed/DeletedExternally", "final t0/0 Failed/DeletedExternally", "end quiet"}, InvBlame},
		"deleted externally by an eviction": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "ungate t0/0 u1", "bind t0/0 u1", "delete t0/0 u1 eviction",
			"delete t0/0 u1 kubelet", "stopped t0/0 u1", "gone t0/0 u1",
			"outcome t0/0 u1 Failed/DeletedExternally", "final t0/0 Failed/DeletedExternally", "end quiet"}, ""},
		"two pods of a task run at once": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "outcome t0/0 u1 Failed/Evicted",
			"create t0/1 u2", "bind t0/1 u2", "stopped t0/0 u1", "exit t0/1 u2 code=0", "stopped t0/1 u2",
			"outcome t0/1 u2 code=0 Succeeded/Completed", "final t0/1 code=0 Succeeded/Completed", "end quiet"}, InvConcurrent},
		"an exit reported before the outcome is not in it": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "delete t0/0 u1 eviction", "delete t0/0 u1 kubelet", "stopped t0/0 u1",
			"exit t0/0 u1 code=0", "outcome t0/0 u1 Failed/Evicted", "final t0/0 Failed/Evicted", "end quiet"}, InvOutcome},
		"an exit reported after the outcome": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "delete t0/0 u1 podgc", "stopped t0/0 u1",
			"outcome t0/0 u1 Failed/Evicted", "final t0/0 Failed/Evicted", "exit t0/0 u1 code=0", "end quiet"}, ""},
		"an exit code nobody reported": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "stopped t0/0 u1",
			"outcome t0/0 u1 code=0 Succeeded/Completed", "final t0/0 code=0 Succeeded/Completed", "end quiet"}, InvOutcome},
		"two outcomes of one attempt": {[]string{
			"submit t0/0", "create t0/0 u1", "bind t0/0 u1", "exit t0/0 u1 code=1", "stopped t0/0 u1",
			"outcome t0/0 u1 code=1 Failed/ExitCode", "outcome t0/0 u1 code=1 Failed/ExitCode", "final t0/0 code=1 Failed/ExitCode", "end quiet"}, InvOutcome},
		"a pod left":                {append(append([]string{}, good[:len(good)-1]...), "end liveness", "left t0/0 u1 finalizer"), InvLeft},
		"a task without an outcome": {[]string{"submit t0/0", "create t0/0 u1 gated", "end liveness", "open t0/0"}, InvLiveness},
		"a valid task refused":      {[]string{"submit t0/0", "refused t0/0", "outcome t0/0 Failed/ConfigError", "final t0/0 Failed/ConfigError", "end quiet"}, InvValid},
		"a lost attempt's pod runs beside the next, and its end is recorded as discarded": {lostRun("exit t0/0 u1 code=3", "discarded t0/0 u1 code=3"), ""},
		"a discarded end with another exit code than the pod's":                           {lostRun("exit t0/0 u1 code=3", "discarded t0/0 u1 code=0"), InvDiscarded},
		"a discarded end of an attempt not declared lost": {append(append([]string{}, good[:len(good)-1]...),
			"discarded t0/0 u1 code=0", "end quiet"), InvDiscarded},
		"kubetask deletes its running pod before the outcome": {[]string{
			"submit t0/0", "create t0/0 u1 gated", "record t0/0 u1", "ungate t0/0 u1", "bind t0/0 u1", "delete t0/0 u1 client",
			"stopped t0/0 u1", "outcome t0/0 u1 Failed/DeletedExternally", "final t0/0 Failed/DeletedExternally", "end quiet"}, InvOwnPod},
	} {
		t.Run(name, func(t *testing.T) {
			vs := Check(h(tc.events...), valid)
			if tc.want == "" {
				for _, v := range vs {
					t.Errorf("unexpected violation %s", v)
				}
				return
			}
			found := false
			for _, v := range vs {
				found = found || v.Invariant == tc.want
			}
			if !found {
				t.Errorf("want a violation of %q, got %v", tc.want, vs)
			}
		})
	}
}

// TestJudgeLog: the "logs archived" invariant on the end state's facts of
// one main container's log.
func TestJudgeLog(t *testing.T) {
	const written = "t0/0 started\ntick 1\nexit 0\n"
	marker := "[kubetask: the node did not serve the rest of this log for 1m0s after the container ended; the rest of the log is lost]\n"
	for name, tc := range map[string]struct {
		f    LogFacts
		want bool // broken
	}{
		"every byte, complete":                      {LogFacts{Written: written, Archived: written, Complete: true}, false},
		"every byte, not marked complete":           {LogFacts{Written: written, Archived: written}, true},
		"nothing archived":                          {LogFacts{Written: written, None: true}, true},
		"a line lost in the middle":                 {LogFacts{Written: written, Archived: "t0/0 started\nexit 0\n", Complete: true}, true},
		"a line twice":                              {LogFacts{Written: written, Archived: "t0/0 started\ntick 1\ntick 1\nexit 0\n", Complete: true}, true},
		"cut short with a marker, node lost":        {LogFacts{Written: written, Archived: "t0/0 started\n" + marker, Complete: true, Lost: true}, false},
		"only a marker, node lost":                  {LogFacts{Written: written, Archived: marker, Complete: true, Lost: true}, false},
		"cut short with a marker, node never lost":  {LogFacts{Written: written, Archived: "t0/0 started\n" + marker, Complete: true}, true},
		"cut short without a marker, node lost":     {LogFacts{Written: written, Archived: "t0/0 started\n", Complete: true, Lost: true}, true},
		"a wrong line before the marker, node lost": {LogFacts{Written: written, Archived: "t0/0 started\ntick 2\n" + marker, Complete: true, Lost: true}, true},
	} {
		t.Run(name, func(t *testing.T) {
			if msg := judgeLog(&tc.f); (msg != "") != tc.want {
				t.Errorf("judgeLog = %q, want broken %v", msg, tc.want)
			}
		})
	}
}

// TestCheckDeclaredCluster: a finished attempt's pod still stopping (its
// sidecar) on a cluster declared lost may run beside the next attempt's pod
// on another cluster (the declaration gives up waiting for that cluster);
// without a declaration it may not.
func TestCheckDeclaredCluster(t *testing.T) {
	events := func(declare bool) []Event {
		l := []string{
			"submit t0/0", "create t0/0 u1", "record t0/0 u1", "ungate t0/0 u1", "bind t0/0 u1", "start t0/0 u1",
			"exit t0/0 u1 code=1", "outcome t0/0 u1 code=1 Failed/ExitCode", "fault",
			"create t0/1 u2", "record t0/1 u2", "ungate t0/1 u2", "bind t0/1 u2", "start t0/1 u2",
			"exit t0/1 u2 code=0", "stopped t0/1 u2", "outcome t0/1 u2 code=0 Succeeded/Completed", "final t0/1 code=0 Succeeded/Completed",
			"delete t0/1 u2 client", "gone t0/1 u2", "stopped t0/0 u1", "delete t0/0 u1 client", "gone t0/0 u1", "end quiet",
		}
		evs := h(l...)
		for i := range evs {
			switch {
			case evs[i].Kind == KCreate && evs[i].UID == "u1":
				evs[i].Note = "gated, epoch 2 of sim-east, on cluster east"
			case evs[i].Kind == KCreate && evs[i].UID == "u2":
				evs[i].Note = "gated, epoch 1 of sim-west, on cluster west"
			case evs[i].Kind == KFault && declare:
				evs[i].Note = "the operator declares cluster east lost (began term 3 of sim-east)"
			}
		}
		return evs
	}
	if vs := Check(events(true), map[string]bool{"t0": true}); len(vs) > 0 {
		t.Errorf("declared: unexpected violations %v", vs)
	}
	vs := Check(events(false), map[string]bool{"t0": true})
	if len(vs) != 1 || vs[0].Invariant != InvConcurrent {
		t.Errorf("not declared: violations %v, want one of %q", vs, InvConcurrent)
	}
}
