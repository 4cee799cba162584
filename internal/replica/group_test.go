package replica

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

func TestBeyondShards(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts map[string]int
		shards int
		want   string // "" for no error, else a part of it
	}{
		{"none", nil, 4, ""},
		{"all within", map[string]int{"g-shard-0": 3, "g-shard-3": 1}, 4, ""},
		{"one beyond", map[string]int{"g-shard-0": 3, "g-shard-4": 2}, 4, "2 unfinished tasks of group g belong to shards up to 4, beyond the 4 of --shards"},
		{"fix names the count", map[string]int{"g-shard-7": 1, "g-shard-5": 2}, 2, "start with --shards 8"},
		{"another group", map[string]int{"h-shard-9": 1, "g-shard-x-shard-9": 1}, 1, ""},
		{"a one-process executor", map[string]int{"kubetask": 5}, 1, ""},
		{"not a number", map[string]int{"g-shard-": 1, "g-shard-1a": 1}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := beyondShards(tc.counts, "g", tc.shards)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// fakeGroups is a store.Groups kept in memory.
type fakeGroups struct {
	unfinished map[string]int
	members    []store.Member
	failures   int // calls that fail before the first answer
}

func (f *fakeGroups) Heartbeat(context.Context, string, string, string) error { return nil }
func (f *fakeGroups) Leave(context.Context, string, string) error             { return nil }
func (f *fakeGroups) Members(context.Context, string, time.Duration) ([]store.Member, error) {
	return f.members, nil
}

func (f *fakeGroups) UnfinishedByExecutor(context.Context) (map[string]int, error) {
	if f.failures > 0 {
		f.failures--
		return nil, store.ErrUnavailable
	}
	return f.unfinished, nil
}

func TestCheckGroup(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    *fakeGroups
		want string
	}{
		{"agrees", &fakeGroups{members: []store.Member{{Identity: "r1", LeaseNamespace: "leases"}}}, ""},
		{"own earlier entry elsewhere", &fakeGroups{members: []store.Member{{Identity: "r0", LeaseNamespace: "other"}}}, ""},
		{"member in another namespace", &fakeGroups{members: []store.Member{{Identity: "r1", LeaseNamespace: "other", Age: 3 * time.Second}}},
			`replica r1 of group g holds its Leases in namespace "other" (heard of 3s ago), this one in "leases"`},
		{"records beyond the shards", &fakeGroups{unfinished: map[string]int{"g-shard-2": 1}}, "beyond the 2 of --shards"},
		{"store errors are retried", &fakeGroups{failures: 2, unfinished: map[string]int{"g-shard-2": 1}}, "beyond the 2 of --shards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{
				Client: fake.NewClientset(), Namespace: "leases", Group: "g", Identity: "r0", Shards: 2,
				LeaseDuration: 3 * time.Second, RetryPeriod: time.Millisecond,
				Executor: func(int) executor.Config { return executor.Config{} },
				Groups:   tc.g, Logger: slog.New(slog.DiscardHandler),
			}
			if err := cfg.defaults(); err != nil {
				t.Fatal(err)
			}
			r := &Replica{cfg: cfg, log: cfg.Logger}
			err := r.checkGroup(context.Background())
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
			if tc.g.failures != 0 {
				t.Fatalf("%d failures not retried", tc.g.failures)
			}
		})
	}
}
