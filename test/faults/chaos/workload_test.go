package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/utils/ptr"

	"github.com/kubetask/kubetask/internal/localcluster/kwokstages"
	"github.com/kubetask/kubetask/pkg/client"
	"github.com/kubetask/kubetask/pkg/task"
	"github.com/kubetask/kubetask/test/exectest"
)

// kind is one shape of task the workload submits.
type kind struct {
	name   string
	weight int
	make   func(rng *rand.Rand, name string) *task.Task
}

// retries: infrastructure failures (the faults' evictions, deletions, lost
// nodes) are retried after 1 s, up to 3 times.
func retries(t *task.Task, on ...string) *task.Task {
	t.Spec.Retries = task.Retries{Limit: ptr.To[int32](3), Backoff: "1s", RetryOn: append([]string{task.RetryOnInfrastructure}, on...)}
	return t
}

func ms(rng *rand.Rand, lo, hi int) string {
	return fmt.Sprintf("%dms", lo+rng.IntN(hi-lo+1))
}

// kinds: most tasks run on kwok nodes (a main container and an envoy-like
// sidecar that never exits by itself), some on the local process node (real
// processes, a file result read through the result holder, a sidecar).
var kinds = []kind{
	{"kwok: main exits 0, sidecar keeps running", 40, func(rng *rand.Rand, name string) *task.Task {
		return retries(exectest.SimTask(name, map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: ms(rng, 300, 3000)}))
	}},
	{"kwok: every container ends 0", 15, func(rng *rand.Rand, name string) *task.Task {
		return retries(exectest.SimTask(name, map[string]string{kwokstages.CompleteAfter: ms(rng, 300, 3000), kwokstages.CompleteCode: "0"}))
	}},
	{"kwok: main exits 0, sidecar stops later", 5, func(rng *rand.Rand, name string) *task.Task {
		return retries(exectest.SimTask(name, map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: ms(rng, 300, 2000),
			kwokstages.SidecarsStopAfter: "500ms"}))
	}},
	{"kwok: main exits 3, retried once on ExitCode", 15, func(rng *rand.Rand, name string) *task.Task {
		t := retries(exectest.SimTask(name, map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: ms(rng, 300, 1500),
			kwokstages.ExitCode: "3"}), "ExitCode")
		t.Spec.Retries.Limit = ptr.To[int32](1)
		return t
	}},
	{"local: file result, sidecar", 15, func(rng *rand.Rand, name string) *task.Task {
		t := exectest.LocalTask(name, fmt.Sprintf(`echo "attempt $ATTEMPT"; sleep %d.%d; echo '{"n":%d}' > /out/result.json`, rng.IntN(2), rng.IntN(10), rng.IntN(1000)),
			`trap 'exit 0' TERM; while :; do sleep 1; done`)
		t.Spec.Result = &task.Result{From: task.ResultFromFile, Path: "/out/result.json"}
		return retries(t)
	}},
	{"local: exits 2, retried once on ExitCode", 10, func(rng *rand.Rand, name string) *task.Task {
		t := retries(exectest.LocalTask(name, fmt.Sprintf(`echo "attempt $ATTEMPT"; sleep 0.%d; exit 2`, rng.IntN(10)), ""), "ExitCode")
		t.Spec.Retries.Limit = ptr.To[int32](1)
		return t
	}},
}

// quick is the kind of the SIGSTOP fault's bursts: short kwok tasks, so that
// the other replicas finish them while the victim is paused.
var quick = kind{"kwok: quick, main exits 0, sidecar keeps running", 0, func(rng *rand.Rand, name string) *task.Task {
	return retries(exectest.SimTask(name, map[string]string{kwokstages.ExitContainer: "main", kwokstages.ExitAfter: ms(rng, 100, 600)}))
}}

// pick is a kind drawn by weight.
func pick(rng *rand.Rand) kind {
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	n := rng.IntN(total)
	for _, k := range kinds {
		if n -= k.weight; n < 0 {
			return k
		}
	}
	return kinds[0]
}

// workload submits tasks to the group's live replicas and remembers them.
type workload struct {
	g  *group
	ns string

	mu     sync.Mutex
	rng    *rand.Rand
	ids    []string
	byKind map[string]int
	next   atomic.Int64
	// retried counts submissions sent again to another replica.
	retried atomic.Int64
}

// job is one task to submit.
type job struct {
	id  string
	doc []byte
}

// prepare draws n tasks of kind k (by weight when k is nil) and remembers
// them as submitted.
func (w *workload) prepare(n int, k *kind) ([]job, error) {
	return w.prepareWhere(n, k, nil)
}

// prepareWhere is prepare with IDs for which in holds (all when in is nil):
// the sequence's other numbers are skipped, never submitted.
func (w *workload) prepareWhere(n int, k *kind, in func(id string) bool) ([]job, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	jobs := make([]job, n)
	for i := range jobs {
		kk := pick(w.rng)
		if k != nil {
			kk = *k
		}
		id := fmt.Sprintf("c%05d", w.next.Add(1))
		for tries := 0; in != nil && !in(id); tries++ {
			if tries > 100000 {
				return nil, fmt.Errorf("no task ID of the sequence up to %s is one wanted", id)
			}
			id = fmt.Sprintf("c%05d", w.next.Add(1))
		}
		doc, err := json.Marshal(kk.make(w.rng, "chaos"))
		if err != nil {
			return nil, err
		}
		jobs[i] = job{id, doc}
		w.ids = append(w.ids, id)
		w.byKind[kk.name]++
	}
	return jobs, nil
}

// submit submits n tasks of kind k (drawn by weight when k is nil) to the
// live replicas and returns their IDs.
func (w *workload) submit(ctx context.Context, n int, k *kind) ([]string, error) {
	jobs, err := w.prepare(n, k)
	if err != nil {
		return nil, err
	}
	return ids(jobs), w.send(ctx, jobs, w.g.live)
}

// send submits jobs from 8 clients at once, each to one of the replicas
// targets returns, another one after an error (same ID: idempotent).
func (w *workload) send(ctx context.Context, jobs []job, targets func() []*replicaProc) error {
	w.mu.Lock()
	seed := w.rng.Uint64()
	w.mu.Unlock()
	rng := rand.New(rand.NewPCG(seed, seed))
	var rmu sync.Mutex
	var eg errgroup.Group
	eg.SetLimit(8)
	for _, j := range jobs {
		eg.Go(func() error {
			deadline := time.Now().Add(5 * time.Minute)
			for {
				if live := targets(); len(live) > 0 {
					rmu.Lock()
					r := live[rng.IntN(len(live))]
					rmu.Unlock()
					sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, _, err := r.client.Submit(sctx, w.ns, j.doc, client.SubmitOptions{ID: j.id})
					cancel()
					if err == nil {
						return nil
					}
					if client.IsInvalid(err) || client.IsConflict(err) || time.Now().After(deadline) || ctx.Err() != nil {
						return fmt.Errorf("submitting %s: %w", j.id, err)
					}
					if n := w.retried.Add(1); n <= 5 || n%100 == 0 {
						w.g.tb.Logf("submission %d sent again: %s: %v", n, j.id, err)
					}
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(200 * time.Millisecond):
				}
			}
		})
	}
	return eg.Wait()
}

func ids(jobs []job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.id
	}
	return out
}

// all returns every ID submitted so far.
func (w *workload) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ids...)
}
