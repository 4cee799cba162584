package replica

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/internal/replica"
	"github.com/kubetask/kubetask/pkg/client"
)

// TestGroupSettingsMustAgree: a replica refuses to start, saying why and
// how to fix it, when another live member of its group holds its Leases
// in another namespace (neither would see the other's Leases and both
// would act), and when the store has unfinished tasks of shards beyond
// its --shards (nobody would run them).
func TestGroupSettingsMustAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	_, url, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env := clustertest.New(t)
	g := newGroup(t, env, url, 4, 6*time.Second)
	r0 := g.start("r0")
	g.waitBalanced(time.Minute, "r0")

	refused := func(r *replicaProc, want string) {
		t.Helper()
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			t.Fatalf("replica %s still runs after a minute:\n%s", r.id, r.out)
		}
		if r.cmd.ProcessState.Success() {
			t.Fatalf("replica %s exited 0:\n%s", r.id, r.out)
		}
		if !strings.Contains(r.out.String(), want) {
			t.Fatalf("replica %s output does not say %q:\n%s", r.id, want, r.out)
		}
	}
	other := g.launch("r1", "--lease-namespace", "kube-public")
	refused(other, `holds its Leases in namespace "`+env.Namespace+`"`)
	refused(other, "--lease-namespace "+env.Namespace)

	// Tasks on shards 2 and 3 of 4 that do not end before the group
	// restarts with 2 shards.
	var ids []string
	for i := 0; len(ids) < 2; i++ {
		id := fmt.Sprintf("long-%d", i)
		if replica.ShardOf(id, 4) != 2+len(ids) {
			continue
		}
		doc := simTaskDoc(t, "long", 10*time.Minute)
		if _, _, err := r0.client.Submit(ctx, env.Namespace, doc, client.SubmitOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	g.stop("r0", syscall.SIGTERM) // leaves the group
	g.shards = 2
	refused(g.launch("r2"), "2 unfinished tasks of group "+g.name+" belong to shards up to 3, beyond the 2 of --shards: nobody would run them; start with --shards 4 (or more)")

	// With 4 shards again the group starts and the tasks can be cancelled.
	g.shards = 4
	r3 := g.start("r3")
	for _, id := range ids {
		if _, err := r3.client.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	clustertest.Eventually(t, 2*time.Minute, "the cancelled tasks to end", func(ctx context.Context) error {
		for _, id := range ids {
			tk, err := r3.client.Get(ctx, id)
			if err != nil {
				return err
			}
			if !tk.Terminal {
				return fmt.Errorf("task %s: %s", id, tk.Phase)
			}
		}
		return nil
	})
}
