package simulation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"

	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Options shape one run. The zero value of each field takes a value drawn
// from the seed; the shrinker sets them smaller. The seed's draws do not
// depend on the options (a value an option overrides is drawn all the
// same), so that a run with options differs from the seed's own run only
// where the options say.
type Options struct {
	Seed int64
	// Tasks is how many tasks the users submit (0: 3-8 from the seed).
	Tasks int
	// FaultLevel scales the faults' weights: 0 none ... 3 many (-1: from
	// the seed, 1-3).
	FaultLevel int
	// NoAdoption leaves out the scenario of an instance adopting another's
	// tasks.
	NoAdoption bool
	// NoReplicas leaves out the scenario of replicas of a group that
	// share the tasks by shards, join, leave and change their shard count.
	NoReplicas bool
	// NoRetention leaves out retention, which deletes finished records
	// (oldest first), and the users who then use a task's ID again.
	NoRetention bool
	// NoClusters leaves out the scenario of two clusters' instances, one
	// of which an operator declares lost (clusters.go).
	NoClusters bool
	// QuietMoves makes a run of the clusters scenario whose east is
	// partitioned move tasks without a declaration (the seed draws that in
	// a third of them): to replay a seed's interleaving in that variant.
	QuietMoves bool
	// Debug adds the executors' debug logs and every step the world
	// released, held or failed to Result.Logs; it changes nothing else.
	Debug bool
}

// Result is a run's history and the checker's verdict on it.
type Result struct {
	// Options are the run's options as given: with its seed they replay
	// it.
	Options Options
	// Level is the fault level the run had (Options.FaultLevel, or the
	// seed's when that was -1).
	Level      int
	History    *History
	Violations []Violation
	Steps      int
	Logs       string
	Unknown    []string
}

const (
	ns            = "ns"
	faultsFor     = 20 * time.Second
	livenessBound = 4 * time.Minute
	maxSteps      = 60000
)

// plan is what a user wants of one task and what its container does.
type plan struct {
	id        string
	label     string        // the history's name of the task: id, or id#2 for a record of an ID used again
	prev      *plan         // the task whose ID this one uses again, once retention deleted its record
	retired   bool          // retention deleted its record
	gap       time.Duration // an ID used again: from the retention to the submission
	instance  string
	submitAt  time.Duration
	cancelAt  time.Duration // 0: never
	exit      int32
	run       time.Duration
	sigterm0  bool // the main container exits 0 on SIGTERM
	sidecar   bool
	nodeName  bool
	retries   int32
	retryExit bool
	keep      bool
	submitted bool // the user sent the submission (once at least)
	cancelled bool // the user sent the cancellation (once at least)
	submit    request
	cancel    request
}

// idle: the user sends nothing for p (any more): its ID is still taken by
// the record p uses it again after, or retention deleted p's record.
func (p *plan) idle() bool { return p.prev != nil && !p.prev.retired || p.retired }

// request is a user's request (a submission, a cancellation), sent to a
// process of the task's instance; the user sends it again after a failure,
// to a process that lives then. Its fields are the world's and the user's
// goroutine's: under world.umu.
type request struct {
	busy  bool      // sent, no answer yet
	done  bool      // answered: accepted
	retry time.Time // a failure's answer came: the user tries again then
}

// taskAPI is what a user's request calls: a process's executor, or a
// replica that routes it to its shard's.
type taskAPI interface {
	Submit(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, error)
	Cancel(ctx context.Context, id string, opts ...executor.CancelOption) error
}

type process struct {
	name     string
	instance string // the executor's instance, or the replica's group
	api      taskAPI
	shards   int  // a replica's shard count (0: not a replica)
	leaving  bool // a replica asked to leave its group (its context ended)
	cancel   context.CancelFunc
	done     chan error
	paused   time.Time // steps wait until then
	dead     bool
	logs     *bytes.Buffer
}

type world struct {
	opt      Options
	rng      *rand.Rand
	start    time.Time
	steps    *steps
	hist     *History
	srv      *apiServer
	mem      store.Store
	seen     *seenRecords
	plans    []*plan
	procs    []*process
	nproc    int
	restarts []restart
	lost     map[string]bool // pod UIDs whose node is gone
	refuseTo time.Time
	adopt    bool
	oldGone  time.Duration // when instance "old" is given up (adoption)
	repl     *replicaPlan  // the replicas scenario, if drawn
	cl       *clusterPlan  // the clusters scenario, if drawn
	feed     *feed
	members  *members
	level    int
	userWG   sync.WaitGroup
	umu      sync.Mutex // the plans' requests
	ctx      context.Context
	stepsN   int
	faults   int                 // faults injected (other than step errors)
	held     map[*step]time.Time // steps held until then
	stepLog  strings.Builder     // Debug: what the world did with each step
	// retention: finished records are deleted, oldest first, once they
	// are retainFor old and no pod of theirs holds kubetask's finalizer.
	retention bool
	retainFor time.Duration
	retired   map[string]*LogFacts // by pod UID: a retired record's logs as archived when it was deleted
	fin       finished             // oldestFinished's cache
}

type restart struct {
	at       time.Time
	instance string
	shards   int // a replica's shard count
}

// Run runs one simulation in its own synctest bubble and judges its
// history. It must be called from a test (synctest needs one).
//
// client-go draws its jitters from math/rand's global source: Run seeds it
// with the run's seed, which needs GODEBUG randseednop=0 (the package's
// tests set it), so that a seed replays alone as it ran among others.
func Run(t *testing.T, opt Options) *Result {
	quietGlobals()
	mathrand.Seed(opt.Seed) //nolint:staticcheck // the global source is client-go's
	// One P: goroutines woken at one instant (timers of several
	// leaderelections, a replica's shards) run one after the other in the
	// runtime's order, not in parallel, so that their draws from client-go's
	// global source (jitters) come in an order that replays.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	// A run's heap is small and short-lived: no collection until the heap
	// reaches 1 GiB makes a seed about a third cheaper than GOGC 400 (23.5
	// against 17.8 seeds/s, alternating, on a loaded machine), which made
	// it a fifth cheaper than the default (62 against 52 seeds/s).
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(1 << 30))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))

	var res *Result
	synctest.Test(t, func(*testing.T) {
		res = run(opt)
	})
	return res
}

// quietGlobals turns off what client-go keeps across runs: its error
// handlers' rate limit (a sleep measured from the last error, of another
// run's clock) and klog's output.
func quietGlobals() {
	utilruntime.ErrorHandlers = nil
	klog.SetLogger(logr.Discard())
}

func run(opt Options) *Result {
	w := &world{opt: opt, rng: rand.New(rand.NewPCG(uint64(opt.Seed), 0x5eed)), start: time.Now(), steps: &steps{}, //nolint:gosec // a seeded source that replays is the point
		lost: map[string]bool{}, seen: newSeen(), held: map[*step]time.Time{}, retired: map[string]*LogFacts{}, fin: finished{writes: -1}}
	w.hist = &History{start: w.start, now: time.Now}
	w.srv = newAPIServer(w.steps, w.hist, time.Now)
	w.mem = store.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	w.ctx = ctx
	w.level = 1 + w.rng.IntN(3)
	if opt.FaultLevel >= 0 {
		w.level = opt.FaultLevel
	}
	w.adopt = w.rng.IntN(3) == 0 && !opt.NoAdoption
	w.oldGone = time.Duration(4+w.rng.IntN(10)) * time.Second
	w.feed = &feed{}
	w.members = newMembers(w.mem)
	w.drawReplicas()
	w.retention = w.rng.IntN(3) == 0
	w.retainFor = []time.Duration{0, 200 * time.Millisecond, 2 * time.Second}[w.rng.IntN(3)]
	if opt.NoRetention {
		w.retention = false
	}
	w.priorTerms()
	w.plan()
	w.drawClusters()
	switch {
	case w.cl != nil:
		w.startProcess(instEast, nil)
		w.startProcess(instWest, nil)
	case w.adopt:
		w.startProcess("old", nil)
	case w.repl != nil:
		for range w.repl.initial {
			w.startReplica(w.repl.shards)
		}
	default:
		w.startProcess("sim", nil)
		if w.level > 0 && w.rng.IntN(2) == 0 {
			w.startProcess("sim", nil) // a second process of the instance waits for the Lease
		}
	}
	why := w.loop()
	w.hist.add(Event{Kind: KEnd, Note: why})
	w.endState()
	// Stop everything: every pending step returns, every process ends.
	w.steps.close()
	cancel()
	for _, p := range w.procs {
		p.cancel()
		<-p.done //nolint:errcheck // how it ended is in the history
	}
	w.userWG.Wait()
	res := &Result{Options: opt, Level: w.level, History: w.hist, Steps: w.stepsN}
	var logs strings.Builder
	for _, p := range w.procs {
		fmt.Fprintf(&logs, "=== %s (%s)\n%s", p.name, p.instance, p.logs.String())
	}
	if opt.Debug {
		fmt.Fprintf(&logs, "=== steps\n%s", w.stepLog.String())
	}
	res.Logs = logs.String()
	res.Unknown = w.srv.unknown
	res.Violations = Check(w.hist.Events, w.validTasks())
	return res
}

func (w *world) validTasks() map[string]bool {
	m := map[string]bool{}
	for _, p := range w.plans {
		m[p.label] = true
	}
	return m
}

func (w *world) now() time.Duration { return time.Since(w.start) }

// priorTerms gives each instance the terms it had before the run began:
// an instance that has run for a while had restarts and lost Leases, and
// the instance an adopter takes over may have had more terms than the
// adopter (its pods carry epochs of their own sequence).
func (w *world) priorTerms() {
	for _, inst := range []string{"old", "sim"} {
		k := w.rng.IntN(4)
		if inst == "old" && !w.adopt || k == 0 {
			continue
		}
		for range k {
			if _, err := w.mem.BeginTerm(context.Background(), inst); err != nil {
				panic(err)
			}
		}
		w.hist.add(Event{Kind: KProcess, Note: fmt.Sprintf("instance %s had %d terms before the run", inst, k)})
	}
}

func (w *world) plan() {
	n := 3 + w.rng.IntN(6)
	if w.opt.Tasks > 0 {
		n = w.opt.Tasks
	}
	var again []*plan
	for i := range n {
		p := w.drawPlan(fmt.Sprintf("t%d", i))
		p.submitAt = time.Duration(w.rng.IntN(12000)) * time.Millisecond
		if p.cancelAt > 0 {
			p.cancelAt += p.submitAt
		}
		if w.adopt && p.submitAt < w.oldGone {
			p.instance = "old"
		}
		w.plans = append(w.plans, p)
		// Its ID used again once retention deleted its record: drawn
		// whether or not the run has retention.
		reuse := w.rng.IntN(4) == 0
		q := w.drawPlan(p.id)
		q.label, q.prev = p.id+"#2", p
		q.gap = time.Duration(w.rng.IntN(3000)) * time.Millisecond
		if reuse && w.retention {
			again = append(again, q)
		}
	}
	w.plans = append(w.plans, again...)
}

// drawPlan draws what a user submits as task id, and when (relative to
// the submission) the user cancels it.
func (w *world) drawPlan(id string) *plan {
	p := &plan{id: id, label: id, instance: "sim",
		exit:     []int32{0, 0, 0, 1, 3}[w.rng.IntN(5)],
		run:      time.Duration(50+w.rng.IntN(4000)) * time.Millisecond,
		sigterm0: w.rng.IntN(2) == 0,
		sidecar:  w.rng.IntN(4) != 0,
		nodeName: w.rng.IntN(8) == 0,
		retries:  int32(w.rng.IntN(3)), //nolint:gosec // 0 to 2
		keep:     w.rng.IntN(5) == 0,
	}
	p.retryExit = p.retries > 0 && w.rng.IntN(2) == 0
	if w.rng.IntN(5) == 0 {
		// Users cancel within moments of the submission (a mistake
		// seen at once) as often as later on.
		within := []int{300, 2000, 6000}[w.rng.IntN(3)]
		p.cancelAt = time.Duration(1+w.rng.IntN(within)) * time.Millisecond
	}
	if w.repl != nil {
		p.instance = group
	}
	return p
}

// taskOfPlan is the task document a user submits for p.
func taskOfPlan(p *plan) *task.Task {
	t := &task.Task{TypeMeta: metav1.TypeMeta{APIVersion: task.APIVersion, Kind: task.Kind}}
	t.Name = "job"
	t.Namespace = ns
	t.Spec.MainContainer = "main"
	t.Spec.Retries.Limit = &p.retries
	t.Spec.Retries.Backoff = "1s"
	t.Spec.Retries.RetryOn = []string{task.RetryOnInfrastructure}
	if p.retryExit {
		t.Spec.Retries.RetryOn = append(t.Spec.Retries.RetryOn, "ExitCode")
	}
	if p.keep {
		t.Spec.Cleanup = task.CleanupKeep
	}
	t.Spec.Template.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}}
	if p.sidecar {
		t.Spec.Template.Spec.Containers = append(t.Spec.Template.Spec.Containers, corev1.Container{Name: "envoy", Image: "envoy"})
	}
	if p.nodeName {
		t.Spec.Template.Spec.NodeName = "node-1"
	}
	t.Default()
	return t
}

type noExec struct{}

func (noExec) Exec(context.Context, string, string, string, []string, io.Writer, io.Writer) error {
	return errors.New("simulation: no exec")
}

func (w *world) startProcess(instance string, adoptFrom []string) *process {
	w.nproc++
	name := fmt.Sprintf("p%d", w.nproc)
	p := &process{name: name, instance: instance, done: make(chan error, 1), logs: &bytes.Buffer{}}
	st := &simStore{inner: w.mem, steps: w.steps, hist: w.hist, actor: name, seen: w.seen, feed: w.feed}
	if c := clusterOf(instance); c != "" {
		w.srv.scope(name, c)
	}
	cl := w.srv.client(name)
	log := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: w.logLevel()}))
	ex, err := executor.New(executor.Config{
		Client: cl, Execer: noExec{}, InstanceID: instance, Cluster: clusterOf(instance), Namespaces: []string{ns},
		AdoptFrom: adoptFrom, Store: st, Workers: 1, CreateConcurrency: 1, PlainList: true,
		CaptureLogs:   capture(cl, st, log),
		Logger:        log,
		LeaseHolder:   name,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
		ResyncPeriod: 30 * time.Second,
	})
	if err != nil {
		panic(err)
	}
	if w.cl != nil && instance == instEast && w.cl.paused {
		p.paused = w.start.Add(w.cl.partitionEnd()) // the partition holds a new process too
	}
	w.launch(p, ex, ex.Start, fmt.Sprintf("%s started for instance %s%s", name, instance, map[bool]string{true: " adopting " + strings.Join(adoptFrom, ","), false: ""}[len(adoptFrom) > 0]))
	return p
}

// launch runs process p (its API api, its run until its context ends) with
// its steps marked as its own, and notes its start.
func (w *world) launch(p *process, api taskAPI, run func(context.Context) error, note string) {
	p.api = api
	ctx, cancel := context.WithCancel(withActor(w.ctx, p.name))
	p.cancel = cancel
	go func() { p.done <- run(ctx) }()
	w.procs = append(w.procs, p)
	w.hist.add(Event{Kind: KProcess, Note: note})
}

func (w *world) logLevel() slog.Level {
	if w.opt.Debug {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// note writes what the world did with a step into the step log (Debug).
func (w *world) note(st *step, what string) {
	if w.opt.Debug {
		fmt.Fprintf(&w.stepLog, "%s %s: %s\n", since(w.start, time.Now()), what, st.key)
	}
}

func (w *world) proc(name string) *process {
	for _, p := range w.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// live is a process of instance that runs (not crashed), the first started.
func (w *world) live(instance string) *process {
	for _, p := range w.procs {
		if p.instance == instance && !p.dead {
			return p
		}
	}
	return nil
}

type choice struct {
	weight int
	do     func()
}

func (w *world) pick(cs []choice) {
	total := 0
	for _, c := range cs {
		total += c.weight
	}
	if total == 0 {
		return
	}
	r := w.rng.IntN(total)
	for _, c := range cs {
		if r < c.weight {
			c.do()
			return
		}
		r -= c.weight
	}
}

func (w *world) faulty() bool { return w.level > 0 && w.now() < faultsFor }

func (w *world) loop() string {
	for {
		synctest.Wait()
		w.stepsN++
		if w.stepsN > maxSteps {
			return "step limit"
		}
		now := time.Now()
		if w.now() > faultsFor+livenessBound {
			return "liveness bound"
		}
		if w.now() > faultsFor && w.done() {
			return "quiet"
		}
		w.housekeeping(now)
		// What housekeeping started or stopped runs until it blocks
		// before the pending steps are looked at: a process started, or
		// a replica told to leave, registers its next steps in an order of
		// its own, not the world's.
		synctest.Wait()
		var cs []choice
		pending := w.steps.snapshot()
		if st := w.brokenRequest(pending); st != nil {
			// A user's request to a process that crashed: the user's
			// connection breaks (a write not sent is lost; one sent was
			// applied, its answer lost).
			w.hist.add(Event{Kind: KFault, Note: "the process is gone: " + st.key})
			w.steps.take(st, errInjected)
			continue
		}
		for _, st := range pending {
			p := w.proc(owner(st.actor))
			if p != nil && (p.dead || now.Before(p.paused)) || now.Before(w.held[st]) {
				continue
			}
			st := st
			cs = append(cs, choice{100, func() { delete(w.held, st); w.note(st, "released"); w.steps.take(st, nil) }})
			if w.faulty() {
				// The seed may hold any step for a while: a goroutine
				// descheduled between two of its steps, a slow answer.
				cs = append(cs, choice{2 * w.level, func() {
					d := []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, time.Second, 3 * time.Second}[w.rng.IntN(4)]
					w.held[st] = now.Add(d)
					w.note(st, "held for "+d.String())
				}})
				if !strings.Contains(st.key, "watch<") {
					cs = append(cs, choice{w.level, func() {
						delete(w.held, st)
						w.hist.add(Event{Kind: KFault, Note: "error injected: " + st.key})
						w.note(st, "failed")
						w.steps.take(st, errInjected)
					}})
				}
			}
		}
		cs = append(cs, w.clusterChoices(now)...)
		cs = append(cs, w.operatorChoices()...)
		cs = append(cs, w.userChoices(now)...)
		if w.faulty() && w.faults < 4*w.level {
			for _, c := range w.faultChoices(now, pending) {
				do := c.do
				cs = append(cs, choice{c.weight, func() { w.faults++; do() }})
			}
		}
		// Time passes while steps wait only while the faults last (a slow
		// step); afterwards every step goes as soon as it can.
		adv := 2
		if len(cs) == 0 {
			adv = 1
		} else if !w.faulty() {
			adv = 0
		}
		cs = append(cs, choice{adv, func() {
			d := []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}[w.rng.IntN(5)]
			// Never past what is due before: a held step's end and a
			// user's cancellation keep their order.
			if due := w.nextDue(now, pending); !due.IsZero() && due.Sub(now) < d {
				d = due.Sub(now)
			}
			time.Sleep(d)
		}})
		w.pick(cs)
	}
}

// nextDue is the earliest moment after now at which something the world
// does becomes due (zero: none): a held step's end, a pause's end, a
// restart, a user's submission or cancellation, the end of refused
// creations, of the faults, of the old instance, a container's exit or
// deadline.
func (w *world) nextDue(now time.Time, pending []*step) time.Time {
	var due time.Time
	at := func(t time.Time) {
		if t.After(now) && (due.IsZero() || t.Before(due)) {
			due = t
		}
	}
	for _, st := range pending {
		at(w.held[st])
	}
	for _, p := range w.procs {
		if !p.dead {
			at(p.paused)
		}
	}
	for _, r := range w.restarts {
		at(r.at)
	}
	w.umu.Lock()
	if t, ok := w.nextRetention(); ok {
		at(t)
	}
	for _, p := range w.plans {
		if p.idle() {
			continue
		}
		if !p.submitted {
			at(w.start.Add(p.submitAt))
		}
		if p.cancelAt > 0 && !p.cancelled {
			at(w.start.Add(p.cancelAt))
		}
		for _, r := range []*request{&p.submit, &p.cancel} {
			if !r.busy && !r.done {
				at(r.retry)
			}
		}
	}
	w.umu.Unlock()
	if !w.refuseTo.IsZero() {
		at(w.refuseTo)
	}
	at(w.start.Add(faultsFor))
	if w.adopt {
		at(w.start.Add(w.oldGone))
	}
	if w.cl != nil {
		at(w.start.Add(w.cl.loseAt))
		if w.cl.pauseFor > 0 {
			at(w.start.Add(w.cl.pauseAt))
		}
	}
	if w.repl != nil {
		if !w.repl.updating && w.repl.updateAt > 0 {
			at(w.start.Add(w.repl.updateAt))
		}
		at(w.repl.nextRoll)
	}
	w.srv.mu.Lock()
	for _, pod := range w.srv.pods {
		if pod.Status.StartTime == nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		if pl := w.planOf(pod); pl != nil {
			at(pod.Status.StartTime.Add(pl.run))
		}
		if ads := pod.Spec.ActiveDeadlineSeconds; ads != nil {
			at(pod.Status.StartTime.Add(time.Duration(*ads) * time.Second))
		}
	}
	w.srv.mu.Unlock()
	return due
}

// brokenRequest is a pending step of a user's request to a crashed
// process, if any.
func (w *world) brokenRequest(pending []*step) *step {
	for _, st := range pending {
		if strings.HasPrefix(st.actor, "user@") {
			if p := w.proc(owner(st.actor)); p != nil && p.dead {
				return st
			}
		}
	}
	return nil
}

// housekeeping does what is due whatever the seed: restarts, the end of
// the old instance, the end of the faults.
func (w *world) housekeeping(now time.Time) {
	for i := 0; i < len(w.restarts); i++ {
		if r := w.restarts[i]; !now.Before(r.at) {
			w.restarts = slices.Delete(w.restarts, i, i+1)
			i--
			if r.instance == "old" && w.now() >= w.oldGone {
				continue
			}
			if r.shards > 0 {
				w.restartReplica(r.shards)
				continue
			}
			var adopt []string
			if w.adopt && r.instance == "sim" {
				adopt = []string{"old"}
			}
			w.startProcess(r.instance, adopt)
		}
	}
	if w.repl != nil {
		w.replicaHousekeeping(now)
	}
	if w.cl != nil {
		w.clusterHousekeeping(now)
	}
	if w.adopt && w.now() >= w.oldGone && w.live("sim") == nil {
		for _, p := range w.procs {
			if p.instance == "old" && !p.dead {
				w.crash(p, "the old instance is given up")
			}
		}
		w.startProcess("sim", []string{"old"})
	}
	if !w.faulty() {
		for _, inst := range w.instances() {
			pending := len(w.restarts) > 0
			if w.cl != nil { // two instances: each its own restart
				pending = slices.ContainsFunc(w.restarts, func(r restart) bool { return r.instance == inst })
			}
			if w.repl == nil && w.live(inst) == nil && !pending {
				w.restarts = append(w.restarts, restart{at: now, instance: inst})
			}
		}
		if !w.refuseTo.IsZero() {
			w.refuseTo = time.Time{}
			w.srv.mu.Lock()
			w.srv.refuseCreates = false
			w.srv.mu.Unlock()
		}
	}
	if !w.refuseTo.IsZero() && !now.Before(w.refuseTo) {
		w.refuseTo = time.Time{}
		w.srv.mu.Lock()
		w.srv.refuseCreates = false
		w.srv.mu.Unlock()
	}
}

func (w *world) crash(p *process, why string) {
	p.dead = true
	w.hist.add(Event{Kind: KProcess, Note: fmt.Sprintf("%s crashed (%s)", p.name, why)})
}

// done: every task is final and nothing of kubetask is left in the cluster.
func (w *world) done() bool {
	for _, p := range w.plans {
		if p.retired {
			continue
		}
		if !p.submitted {
			return false
		}
		r, err := w.mem.Get(context.Background(), p.id)
		if err != nil || !r.Terminal || w.hist.name(r.ID, r.Nonce) != p.label {
			return false
		}
	}
	w.srv.mu.Lock()
	defer w.srv.mu.Unlock()
	for _, pod := range w.srv.pods {
		if slices.Contains(pod.Finalizers, task.Finalizer) || pod.Spec.NodeName != "" && !stoppedPod(pod) && !w.lost[string(pod.UID)] {
			return false
		}
	}
	return true
}

// due: r is to be sent now (umu held).
func (r *request) due(now time.Time) bool {
	return !r.busy && !r.done && !now.Before(r.retry)
}

// userChoices are the users' requests due now. A request goes to a live
// process of the task's instance (the adopter once the old instance is
// given up); its steps are that process's (a request to a process that
// crashes fails), and a failed request is sent again 200 ms later.
func (w *world) userChoices(now time.Time) []choice {
	var cs []choice
	w.umu.Lock()
	defer w.umu.Unlock()
	if c, ok := w.retentionChoice(now); ok {
		cs = append(cs, c)
	}
	for _, p := range w.plans {
		p := p
		if p.idle() {
			continue // its ID is still taken, or its record is gone
		}
		inst := p.instance
		if w.adopt && w.now() >= w.oldGone {
			inst = "sim"
		}
		proc := w.live(inst)
		if w.repl != nil {
			proc = w.serving(p.id)
		}
		if proc == nil {
			continue
		}
		if w.now() >= p.submitAt && p.submit.due(now) {
			cs = append(cs, choice{10, func() {
				note := fmt.Sprintf("to %s: exit %d after %s, sidecar %v, nodeName %v, retries %d, retry on exit %v, keep %v, exits 0 on SIGTERM %v",
					proc.name, p.exit, p.run, p.sidecar, p.nodeName, p.retries, p.retryExit, p.keep, p.sigterm0)
				if p.submitted {
					note = "again, to " + proc.name
				}
				if p.prev != nil {
					note += ", its ID used again"
				}
				p.submitted = true
				w.hist.add(Event{Kind: KSubmit, Task: p.label, Note: note})
				w.send(proc, &p.submit, func(ctx context.Context) error {
					_, err := proc.api.Submit(ctx, p.id, taskOfPlan(p))
					return err
				})
			}})
		}
		if p.submitted && p.cancelAt > 0 && w.now() >= p.cancelAt && p.cancel.due(now) {
			cs = append(cs, choice{10, func() {
				note := "to " + proc.name
				if p.cancelled {
					note = "again, " + note
				}
				p.cancelled = true
				w.hist.add(Event{Kind: KCancel, Task: p.label, Note: note})
				w.send(proc, &p.cancel, func(ctx context.Context) error { return proc.api.Cancel(ctx, p.id) })
			}})
		}
	}
	return cs
}

// userActor is the actor of a user's request served by process p: its
// steps are p's (a pause holds them, a crash fails them).
func userActor(p *process) string { return "user@" + p.name }

// owner is the process an actor's steps belong to.
func owner(actor string) string { return strings.TrimPrefix(actor, "user@") }

// send sends the user's request r to process p (umu held).
func (w *world) send(p *process, r *request, call func(context.Context) error) {
	r.busy = true
	w.userWG.Add(1)
	go func() {
		defer w.userWG.Done()
		err := call(withActor(w.ctx, userActor(p)))
		w.umu.Lock()
		defer w.umu.Unlock()
		r.busy = false
		if err == nil {
			r.done = true
		} else {
			r.retry = time.Now().Add(200 * time.Millisecond)
		}
	}()
}

func (w *world) planOf(pod *corev1.Pod) *plan {
	t, _ := w.srv.taskOf(pod)
	for _, p := range w.plans {
		if p.label == t {
			return p
		}
	}
	return nil
}

// sortedPods are the server's pods by key (srv.mu held).
func (w *world) sortedPods() []*corev1.Pod {
	keys := make([]string, 0, len(w.srv.pods))
	for k := range w.srv.pods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*corev1.Pod, len(keys))
	for i, k := range keys {
		out[i] = w.srv.pods[k]
	}
	return out
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// clusterChoices are what the scheduler and the kubelet may do now.
func (w *world) clusterChoices(now time.Time) []choice {
	w.srv.mu.Lock()
	defer w.srv.mu.Unlock()
	var cs []choice
	for _, pod := range w.sortedPods() {
		key := w.srv.keyOf(pod)
		uid := string(pod.UID)
		if w.lost[uid] {
			continue
		}
		t, a := w.srv.taskOf(pod)
		pl := w.planOf(pod)
		if pl == nil {
			continue
		}
		do := func(f func(p *corev1.Pod)) func() {
			return func() {
				w.srv.mu.Lock()
				defer w.srv.mu.Unlock()
				if cur := w.srv.pods[key]; cur != nil && cur.UID == pod.UID {
					f(cur.DeepCopy())
				}
			}
		}
		switch {
		case pod.Spec.NodeName == "" && len(pod.Spec.SchedulingGates) == 0 && pod.DeletionTimestamp == nil:
			// kube-scheduler binds a schedulable pod within milliseconds:
			// as soon as most steps.
			cs = append(cs, choice{40, do(func(p *corev1.Pod) {
				p.Spec.NodeName = "node-1"
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
				w.srv.commit(key, p)
				w.hist.add(Event{Kind: KBind, Task: t, Attempt: a, UID: uid})
			})})
		case pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodPending && pod.DeletionTimestamp == nil:
			cs = append(cs, choice{10, do(func(p *corev1.Pod) {
				ts := metav1.NewTime(time.Now())
				p.Status.Phase = corev1.PodRunning
				p.Status.StartTime = &ts
				p.Status.ContainerStatuses = nil
				for _, c := range p.Spec.Containers {
					p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Ready: true, Started: ptrTrue(),
						State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ts}}})
				}
				w.srv.commit(key, p)
				w.srv.clogs[uid] = &containerLog{task: t, id: p.Annotations[task.AnnotationRun], attempt: a, start: ts.Time}
				w.srv.logChanged()
				w.hist.add(Event{Kind: KStart, Task: t, Attempt: a, UID: uid})
			})})
		case pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil:
			st := containerStatus(pod, "main")
			if st != nil && st.State.Running != nil && !now.Before(pod.Status.StartTime.Add(pl.run)) {
				cs = append(cs, choice{10, do(func(p *corev1.Pod) { w.terminate(p, key, pl, false, "") })})
			}
			if ads := pod.Spec.ActiveDeadlineSeconds; ads != nil && !now.Before(pod.Status.StartTime.Add(time.Duration(*ads)*time.Second)) {
				cs = append(cs, choice{10, do(func(p *corev1.Pod) { w.terminate(p, key, pl, true, "DeadlineExceeded") })})
			}
		case pod.DeletionTimestamp != nil && pod.Spec.NodeName != "":
			if !stoppedPod(pod) && pod.Status.Phase == corev1.PodRunning {
				// The kubelet reports the final states: also after a
				// grace-0 delete, as kwok and the kubelet can.
				cs = append(cs, choice{10, do(func(p *corev1.Pod) { w.terminate(p, key, pl, true, "") })})
			}
			if g := pod.DeletionGracePeriodSeconds; g != nil && *g > 0 {
				cs = append(cs, choice{5, do(func(p *corev1.Pod) {
					_ = w.srv.deletePod(w.srv.keyOf(p), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, "kubelet")
				})})
			}
		}
	}
	return cs
}

func ptrTrue() *bool { b := true; return &b }

// terminate ends the pod's main container (and, when all is set, every
// container) and reports it.
func (w *world) terminate(p *corev1.Pod, key string, pl *plan, all bool, reason string) {
	t, a := w.srv.taskOf(p)
	uid := string(p.UID)
	ts := metav1.NewTime(time.Now())
	exited := false
	allZero := true
	for i := range p.Status.ContainerStatuses {
		cs := &p.Status.ContainerStatuses[i]
		if cs.State.Running != nil && (all || cs.Name == "main") {
			code, why := int32(137), "Error"
			if cs.Name == "main" {
				switch {
				case !all:
					code = pl.exit
				case pl.sigterm0:
					code = 0
				default:
					code = 143
				}
				exited = true
			}
			if code == 0 {
				why = "Completed"
			}
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: why, StartedAt: cs.State.Running.StartedAt, FinishedAt: ts}}
			if cs.Name == "main" {
				w.srv.stopLog(uid, code)
			}
			cs.Ready = false
		}
		if term := cs.State.Terminated; term == nil {
			allZero = false
		} else if term.ExitCode != 0 {
			allZero = false
		}
	}
	running := slices.ContainsFunc(p.Status.ContainerStatuses, func(cs corev1.ContainerStatus) bool { return cs.State.Terminated == nil })
	if !running {
		if allZero {
			p.Status.Phase = corev1.PodSucceeded
		} else {
			p.Status.Phase = corev1.PodFailed
			p.Status.Reason = reason
		}
	}
	w.srv.commit(key, p)
	if exited {
		code := containerStatus(p, "main").State.Terminated.ExitCode
		w.hist.add(Event{Kind: KExit, Task: t, Attempt: a, UID: uid, Code: &code})
	}
	if !running {
		w.hist.add(Event{Kind: KStopped, Task: t, Attempt: a, UID: uid, Note: string(p.Status.Phase)})
	}
}

// writeStep: st is a write that changes the store or the cluster, or a
// write's answer: a process that dies there leaves the write undone, or
// done without knowing it.
func writeStep(st *step) bool {
	for _, k := range []string{" store> ", " store< "} {
		if i := strings.Index(st.key, k); i >= 0 {
			op := st.key[i+len(k):]
			return strings.HasPrefix(op, "create ") || strings.HasPrefix(op, "update ") || strings.HasPrefix(op, "beginterm ")
		}
	}
	if i := strings.Index(st.key, " api< "); i >= 0 {
		op := st.key[i+len(" api< "):]
		return !strings.HasPrefix(op, "get ") && !strings.HasPrefix(op, "list ")
	}
	return false
}

// faultChoices are the faults the world may inject now; pending are the
// steps that wait.
func (w *world) faultChoices(now time.Time, pending []*step) []choice {
	l := w.level
	var cs []choice
	w.srv.mu.Lock()
	var running []*corev1.Pod
	for _, pod := range w.sortedPods() {
		if pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning && !w.lost[string(pod.UID)] {
			running = append(running, pod)
		}
	}
	nw := len(w.srv.watches)
	w.srv.mu.Unlock()
	for _, pod := range running {
		pod := pod
		t, a := w.srv.taskOf(pod)
		cs = append(cs, choice{l, func() {
			w.hist.add(Event{Kind: KFault, Task: t, Attempt: a, UID: string(pod.UID), Note: "evicted"})
			w.srv.mu.Lock()
			_ = w.srv.deletePod(w.srv.keyOf(pod), metav1.DeleteOptions{}, "eviction")
			w.srv.mu.Unlock()
		}}, choice{l, func() {
			w.hist.add(Event{Kind: KFault, Task: t, Attempt: a, UID: string(pod.UID), Note: "force-deleted"})
			w.srv.mu.Lock()
			_ = w.srv.deletePod(w.srv.keyOf(pod), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, "force")
			w.srv.mu.Unlock()
		}}, choice{(l + 1) / 2, func() {
			w.hist.add(Event{Kind: KFault, Task: t, Attempt: a, UID: string(pod.UID), Note: "node lost: the pod GC deletes it, no status comes"})
			w.srv.mu.Lock()
			w.lost[string(pod.UID)] = true
			if c := w.srv.clogs[string(pod.UID)]; c != nil {
				c.lostAt = now
				w.srv.logChanged()
			}
			_ = w.srv.deletePod(w.srv.keyOf(pod), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, "podgc")
			w.srv.mu.Unlock()
		}})
	}
	if nw > 0 {
		cs = append(cs, choice{l, func() {
			w.srv.mu.Lock()
			i := w.rng.IntN(len(w.srv.watches))
			wt := w.srv.watches[i]
			wt.drop()
			w.srv.mu.Unlock()
			w.hist.add(Event{Kind: KFault, Note: "a watch of " + wt.actor + " dropped"})
		}}, choice{l, func() {
			w.hist.add(Event{Kind: KFault, Note: "history compacted: watches end with 410 Expired"})
			w.srv.mu.Lock()
			w.srv.compact()
			w.srv.mu.Unlock()
		}})
	}
	if w.refuseTo.IsZero() {
		cs = append(cs, choice{l, func() {
			d := time.Duration(500+w.rng.IntN(3000)) * time.Millisecond
			w.refuseTo = now.Add(d)
			w.hist.add(Event{Kind: KFault, Note: fmt.Sprintf("pod creations refused (quota) for %s", d)})
			w.srv.mu.Lock()
			w.srv.refuseCreates = true
			w.srv.mu.Unlock()
		}})
	}
	if w.repl != nil {
		cs = append(cs, w.replicaChoices()...)
	}
	for _, p := range w.procs {
		p := p
		if p.dead || now.Before(p.paused) {
			continue
		}
		cs = append(cs, choice{l, func() {
			d := time.Duration(200+w.rng.IntN(8000)) * time.Millisecond
			p.paused = now.Add(d)
			w.hist.add(Event{Kind: KProcess, Note: fmt.Sprintf("%s paused for %s", p.name, d)})
		}}, choice{(l + 1) / 2, func() {
			w.crash(p, "killed")
			w.restarts = append(w.restarts, restart{at: now.Add(time.Duration(w.rng.IntN(5000)) * time.Millisecond), instance: p.instance, shards: p.shards})
		}})
		// A process killed while one of its writes waits: the write is
		// lost, or applied without its answer (between a pod's creation
		// and its record, say).
		for _, st := range pending {
			if st.actor == p.name && writeStep(st) {
				cs = append(cs, choice{l, func() {
					w.crash(p, "killed with a step pending: "+st.key)
					w.restarts = append(w.restarts, restart{at: now.Add(time.Duration(w.rng.IntN(5000)) * time.Millisecond), instance: p.instance, shards: p.shards})
				}})
				break
			}
		}
	}
	return cs
}

// endState writes what is left at the end into the history.
func (w *world) endState() {
	w.srv.mu.Lock()
	for _, pod := range w.sortedPods() {
		t, a := w.srv.taskOf(pod)
		var why []string
		if slices.Contains(pod.Finalizers, task.Finalizer) {
			why = append(why, "kubetask's finalizer")
		}
		if pod.Spec.NodeName != "" && !stoppedPod(pod) && !w.lost[string(pod.UID)] {
			why = append(why, "running")
		}
		if len(why) > 0 {
			w.hist.add(Event{Kind: KLeft, Task: t, Attempt: a, UID: string(pod.UID), Note: strings.Join(why, ", ")})
		}
	}
	w.srv.mu.Unlock()
	w.logFacts()
	for _, p := range w.plans {
		if p.retired {
			continue
		}
		r, err := w.mem.Get(context.Background(), p.id)
		switch {
		case !p.submitted:
			w.hist.add(Event{Kind: KOpen, Task: p.label, Note: "never submitted"})
		case err != nil:
			w.hist.add(Event{Kind: KOpen, Task: p.label, Note: "no record"})
		case w.hist.name(r.ID, r.Nonce) != p.label:
			w.hist.add(Event{Kind: KOpen, Task: p.label, Note: "the ID's record is " + w.hist.name(r.ID, r.Nonce) + "'s"})
		case !r.Terminal:
			w.hist.add(Event{Kind: KOpen, Task: p.label, Attempt: r.Attempt, Phase: r.Phase, Reason: r.Reason,
				Note: fmt.Sprintf("%s; record of %s, version %d, pod recorded %v", r.Message, r.Executor, r.Version, r.PodCreated)})
		}
	}
}
