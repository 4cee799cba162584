package replica

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/store/storetest"
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

// fakeGroups is a store.Groups kept in memory (storetest.Members), by the
// real clock, that passes storetest.RunGroups (TestFakeGroups): its Joins
// are serial.
type fakeGroups struct {
	mu         sync.Mutex
	unfinished map[string]int
	failures   int // calls that fail before the first answer
	table      storetest.Members
	joins      int // Join calls that answered
	// beforeJoin, when set, is called (without mu) at the start of every
	// Join: a test holds joins there to make them meet.
	beforeJoin func(m store.Member)
	// onLeave, when set, is called (with mu held) on every Leave.
	onLeave func(member string)
}

// newFakeGroups returns a fakeGroups whose group g has members, heard of
// now, with the Joined, Shards and LeaseNamespace they have (Age ignored).
func newFakeGroups(members ...store.Member) *fakeGroups {
	f := &fakeGroups{}
	for _, m := range members {
		f.table.Put("g", m, time.Now())
	}
	return f
}

func (f *fakeGroups) fail() error {
	if f.failures > 0 {
		f.failures--
		return store.ErrUnavailable
	}
	return nil
}

func (f *fakeGroups) Join(_ context.Context, group string, m store.Member, within time.Duration) ([]store.Member, error) {
	if f.beforeJoin != nil {
		f.beforeJoin(m)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail(); err != nil {
		return nil, err
	}
	f.table.Register(group, m, within, time.Now())
	f.joins++
	return f.table.List(group, within, m.Identity, time.Now()), nil
}

func (f *fakeGroups) Heartbeat(_ context.Context, group string, m store.Member) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.table.Register(group, m, 0, time.Now())
	return nil
}

func (f *fakeGroups) Leave(_ context.Context, group, member string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.table.Leave(group, member)
	if f.onLeave != nil {
		f.onLeave(member)
	}
	return nil
}

func (f *fakeGroups) Members(_ context.Context, group string, within time.Duration) ([]store.Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail(); err != nil {
		return nil, err
	}
	return f.table.List(group, within, "", time.Now()), nil
}

func (f *fakeGroups) UnfinishedByExecutor(context.Context) (map[string]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail(); err != nil {
		return nil, err
	}
	return f.unfinished, nil
}

// TestFakeGroups: the fake the tests of this package use keeps the
// contract of store.Groups.
func TestFakeGroups(t *testing.T) {
	storetest.RunGroups(t, func(*testing.T) store.Groups { return &fakeGroups{} })
}

func TestCheckGroup(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    *fakeGroups
		want string
	}{
		{"agrees", newFakeGroups(store.Member{Identity: "r1", LeaseNamespace: "leases"}), ""},
		{"own earlier entry elsewhere", newFakeGroups(store.Member{Identity: "r0", LeaseNamespace: "other"}), ""},
		{"member in another namespace", newFakeGroups(store.Member{Identity: "r1", LeaseNamespace: "other"}),
			`replica r1 of group g holds its Leases in namespace "other" (heard of `},
		{"member in another namespace that joined after this one: it refuses, not this one", newFakeGroups(
			store.Member{Identity: "r0", LeaseNamespace: "leases", Shards: 2, Joined: 1},
			store.Member{Identity: "r1", LeaseNamespace: "other", Shards: 2, Joined: 5}), ""},
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
