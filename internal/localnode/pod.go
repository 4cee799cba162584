package localnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubetask/kubetask/internal/container"
	"github.com/kubetask/kubetask/internal/podnet"
)

// Kubelet timings.
const (
	initialBackoff = 10 * time.Second // first restart is immediate, then 10s, 20s, ... 5m
	maxBackoff     = 5 * time.Minute
	backoffReset   = 10 * time.Minute // a container that ran this long restarts at once
	configRetry    = 2 * time.Second  // recheck a missing ConfigMap/Secret/volume
	never          = 100 * 365 * 24 * time.Hour
)

type kind int

const (
	regularKind kind = iota
	initKind
	sidecarKind // an init container with restartPolicy Always
)

// ctr is the node's record of one container of a pod across its restarts.
type ctr struct {
	kind kind
	spec corev1.Container

	proc      *container.Process // the current instance (running or exited), nil before the first
	prev      *container.Process // the instance before it, for logs --previous
	instances int
	curID     string
	termFile  string

	restartCount int32
	// term is the current instance's outcome once it has exited.
	term *corev1.ContainerStateTerminated
	// last is the outcome of the instance before the current one.
	last *corev1.ContainerStateTerminated
	// waiting, when set, is the reported state: an error starting the container or a
	// restart back-off (then with term as the last state).
	waiting   *corev1.ContainerStateWaiting
	retryAt   time.Time
	restartAt time.Time
	backoff   time.Duration

	// imageID is the loaded image the current instance runs from ("" on the host).
	imageID string
	// probeReady is the current instance's readiness probe's verdict (false
	// until it first succeeds).
	probeReady bool

	pullBackoff     time.Duration
	pullBackoffShow time.Time
	everRan         bool
}

func (c *ctr) running() bool { return c.proc != nil && c.term == nil }

// isReady is the container's readiness: running, and its readiness probe (if
// it has one) passed.
func (c *ctr) isReady() bool { return c.running() && (c.spec.ReadinessProbe == nil || c.probeReady) }

type termReason int

const (
	notTerminating termReason = iota
	termCompleted             // all regular containers are done: stop the sidecars
	termInitFailed            // an init container failed under restartPolicy Never
	termDeadline              // activeDeadlineSeconds passed
	termDeleted               // the pod is being deleted
)

// podWorker runs one pod: a goroutine (run) reacts to process exits, spec updates,
// deletion and timers by recomputing what to start or stop, like the kubelet's
// pod worker, and publishes the resulting status.
type podWorker struct {
	p   *provider
	uid types.UID
	dir string
	log *slog.Logger

	mu        sync.Mutex
	pod       *corev1.Pod // latest spec (status as first seen)
	inits     []*ctr
	regulars  []*ctr
	startTime metav1.Time
	conds     map[corev1.PodConditionType]corev1.PodCondition
	lost      bool

	volumes   map[string]string
	volumeErr string

	// netDecided is set once the pod's network is chosen: sandbox, a network
	// namespace of its own, or the node's (nil). w.pod.Status.PodIP(s) hold
	// the pod's address from then on.
	netDecided      bool
	sandbox         *podnet.Sandbox
	sandboxReleased bool

	initDone, initFailed bool
	terminating          termReason
	stopCtx              context.Context
	stopCancel           context.CancelFunc
	stopDeadline         time.Time
	stopping, stopDone   bool
	finished             bool
	deleteRequested      bool
	deleteIssued         bool
	lastPublished        *corev1.PodStatus

	wake        chan struct{}
	destroyed   chan struct{}
	destroyOnce sync.Once
	exited      chan struct{}
}

func newPodWorker(p *provider, pod *corev1.Pod) *podWorker {
	w := &podWorker{
		p:         p,
		uid:       pod.UID,
		dir:       filepath.Join(p.cfg.dir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		log:       p.cfg.log.With("pod", pod.Namespace+"/"+pod.Name),
		pod:       pod.DeepCopy(),
		conds:     map[corev1.PodConditionType]corev1.PodCondition{},
		wake:      make(chan struct{}, 1),
		destroyed: make(chan struct{}),
		exited:    make(chan struct{}),
		startTime: metav1.NewTime(p.cfg.clock.Now()),
	}
	for _, c := range pod.Spec.InitContainers {
		k := initKind
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			k = sidecarKind
		}
		w.inits = append(w.inits, &ctr{kind: k, spec: c})
	}
	for _, c := range pod.Spec.Containers {
		w.regulars = append(w.regulars, &ctr{kind: regularKind, spec: c})
	}
	// A pod that an earlier instance of this node started has lost its processes:
	// they died with that instance.
	if pod.Status.StartTime != nil {
		w.lost = true
		w.startTime = *pod.Status.StartTime
	}
	return w
}

func (w *podWorker) all() []*ctr {
	return append(append([]*ctr(nil), w.inits...), w.regulars...)
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// update takes a new spec: labels, annotations, activeDeadlineSeconds.
func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	status := w.pod.Status
	w.pod = pod.DeepCopy()
	w.pod.Status = status
	w.mu.Unlock()
	w.poke()
}

// requestDeletion starts a graceful deletion with the pod's deletion grace period.
func (w *podWorker) requestDeletion(pod *corev1.Pod) {
	w.mu.Lock()
	status := w.pod.Status
	w.pod = pod.DeepCopy()
	w.pod.Status = status
	w.deleteRequested = true
	if !w.finished {
		grace := gracePeriod(pod)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		w.beginTermination(termDeleted, grace)
	}
	w.mu.Unlock()
	w.poke()
}

func gracePeriod(pod *corev1.Pod) time.Duration {
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 30 * time.Second
}

// beginTermination records why the pod stops and when its processes must be gone;
// a later request can only bring that time forward.
func (w *podWorker) beginTermination(reason termReason, grace time.Duration) {
	if w.terminating == notTerminating {
		w.terminating = reason
	}
	deadline := w.clock().Now().Add(grace)
	if w.stopCtx == nil {
		w.stopCtx, w.stopCancel = context.WithCancel(context.Background())
		w.stopDeadline = deadline
		w.clock().AfterFunc(grace, w.stopCancel)
	} else if deadline.Before(w.stopDeadline) {
		w.stopDeadline = deadline
		w.clock().AfterFunc(grace, w.stopCancel)
	}
}

// destroy kills whatever still runs, ends the worker and removes the pod's files.
func (w *podWorker) destroy() {
	w.destroyOnce.Do(func() {
		close(w.destroyed)
		w.mu.Lock()
		procs := w.liveProcs()
		w.mu.Unlock()
		for _, p := range procs {
			p.Kill()
		}
		<-w.exited
		w.mu.Lock()
		sb := w.sandbox
		w.mu.Unlock()
		if sb != nil {
			sb.Close()
		}
		if err := os.RemoveAll(w.dir); err != nil {
			w.log.Warn("could not remove pod directory", "dir", w.dir, "err", err)
		}
		if w.stopCancel != nil {
			w.stopCancel()
		}
	})
}

func (w *podWorker) liveProcs() []*container.Process {
	var ps []*container.Process
	for _, c := range w.all() {
		if c.proc != nil && !c.proc.Exited() {
			ps = append(ps, c.proc)
		}
	}
	return ps
}

// stopAll stops every process (SIGTERM, SIGKILL after grace) for a node shutdown.
func (w *podWorker) stopAll(grace time.Duration) {
	w.mu.Lock()
	procs := w.liveProcs()
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(context.Background(), grace)
		}()
	}
	wg.Wait()
}

func (w *podWorker) run(ctx context.Context) {
	defer close(w.exited)
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		w.log.Error("could not create pod directory", "err", err)
	}
	for {
		now := w.clock().Now()
		w.mu.Lock()
		next := w.sync(ctx, now)
		if w.finished && w.sandbox != nil && !w.sandboxReleased {
			// The pod's processes are gone: so goes its network (the kubelet
			// stops the sandbox), its address free for another pod. Its
			// status keeps the address. Removing a veth takes tens of
			// milliseconds: the final status does not wait for it.
			w.sandboxReleased = true
			go w.sandbox.Close()
		}
		pod := w.snapshotLocked(now)
		changed := w.lastPublished == nil || !apiequality.Semantic.DeepEqual(*w.lastPublished, pod.Status)
		if changed {
			w.lastPublished = pod.Status.DeepCopy()
		}
		finishDelete := w.finished && w.deleteRequested && !w.deleteIssued
		if finishDelete {
			w.deleteIssued = true
		}
		w.mu.Unlock()
		if changed {
			w.p.publish(pod)
		}
		if finishDelete {
			go w.finishDeletion(ctx, pod)
		}

		var tc <-chan time.Time
		stopTimer := func() bool { return false }
		if !next.IsZero() {
			if d := next.Sub(w.clock().Now()); d > 0 {
				timer := w.clock().NewTimer(d)
				tc, stopTimer = timer.C(), timer.Stop
			} else {
				w.poke() // due now: a fake clock would not fire a timer of zero
			}
		}
		select {
		case <-ctx.Done():
		case <-w.destroyed:
		case <-w.wake:
		case <-tc:
		}
		stopTimer()
		if ctx.Err() != nil || isClosed(w.destroyed) {
			return
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// finishDeletion reports the final container states, then deletes the pod object
// with grace 0: the processes are gone, so the object should be too, without
// waiting out the rest of the grace period.
func (w *podWorker) finishDeletion(ctx context.Context, final *corev1.Pod) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := w.p.cfg.client.CoreV1().Pods(final.Namespace)
	cur, err := pods.Get(ctx, final.Name, metav1.GetOptions{})
	if err != nil || cur.UID != w.uid {
		return
	}
	cur.Status = final.Status
	if _, err := pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		w.log.Debug("could not report final status before deletion", "err", err)
	}
	zero := int64(0)
	uid := w.uid
	err = pods.Delete(ctx, final.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.log.Warn("could not finish pod deletion", "err", err)
	}
}

// sync is one pass of the pod's state machine; it returns when to look again
// (zero: only on an event). Called with w.mu held.
func (w *podWorker) sync(ctx context.Context, now time.Time) time.Time {
	var next time.Time
	at := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, c := range w.all() {
		if c.proc != nil && c.term == nil && c.proc.Exited() {
			c.term = w.terminated(c)
			c.waiting = nil
		}
	}
	if w.finished {
		return next
	}
	if w.lost {
		w.finished = true
		return next
	}
	if w.terminating == notTerminating {
		if ads := w.pod.Spec.ActiveDeadlineSeconds; ads != nil {
			deadline := w.startTime.Add(time.Duration(*ads) * time.Second)
			if !now.Before(deadline) {
				w.beginTermination(termDeadline, gracePeriod(w.pod))
			} else {
				at(deadline)
			}
		}
	}
	if w.terminating == notTerminating {
		at(w.progress(ctx, now))
		switch {
		case w.initFailed:
			w.beginTermination(termInitFailed, gracePeriod(w.pod))
		case w.initDone && w.regularsDone():
			w.beginTermination(termCompleted, gracePeriod(w.pod))
		}
	}
	if w.terminating != notTerminating {
		if !w.stopping {
			w.stopping = true
			w.startStopping()
		}
		if w.stopDone && len(w.liveProcs()) == 0 {
			// Exits observed by stopSequence may not have been recorded yet.
			for _, c := range w.all() {
				if c.proc != nil && c.term == nil {
					c.term = w.terminated(c)
					c.waiting = nil
				}
			}
			w.finished = true
		}
	}
	return next
}

// startStopping stops the pod's processes in the kubelet's order: regular and init
// containers together, then native sidecars one by one in reverse start order, all
// within the termination deadline, after which everything left gets SIGKILL.
func (w *podWorker) startStopping() {
	var first, sidecars []*container.Process
	for _, c := range w.all() {
		if !c.running() {
			continue
		}
		if c.kind == sidecarKind {
			sidecars = append(sidecars, c.proc)
		} else {
			first = append(first, c.proc)
		}
	}
	ctx, deadline := w.stopCtx, w.stopDeadline
	go func() {
		var wg sync.WaitGroup
		for _, p := range first {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.Stop(ctx, deadline.Sub(w.clock().Now()))
			}()
		}
		wg.Wait()
		for i := len(sidecars) - 1; i >= 0; i-- {
			sidecars[i].Stop(ctx, deadline.Sub(w.clock().Now()))
		}
		w.mu.Lock()
		w.stopDone = true
		w.mu.Unlock()
		w.poke()
	}()
}

// progress starts and restarts containers. Called with w.mu held.
func (w *podWorker) progress(ctx context.Context, now time.Time) time.Time {
	var next time.Time
	at := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if !w.netDecided {
		if err := w.setupNetwork(); err != nil {
			w.volumeErr = err.Error()
			return now.Add(configRetry)
		}
	}
	if w.volumes == nil {
		vols, err := w.prepareVolumes(ctx, w.pod)
		if err != nil {
			w.volumeErr = err.Error()
			return now.Add(configRetry)
		}
		w.volumes, w.volumeErr = vols, ""
	}
	if !w.initDone {
		done := true
	inits:
		for _, c := range w.inits {
			if c.kind == sidecarKind {
				if c.everRan {
					continue // started once: restarts are handled below
				}
				at(w.tryStart(ctx, c, now))
				if c.running() {
					continue
				}
				done = false
				break inits
			}
			switch {
			case c.term != nil && c.term.ExitCode == 0:
				continue
			case c.running():
			case c.term != nil:
				if w.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
					w.initFailed = true
				} else {
					at(w.restart(ctx, c, now))
				}
			default:
				at(w.tryStart(ctx, c, now))
			}
			done = false
			break inits
		}
		w.initDone = done
	}
	for _, c := range w.inits {
		if c.kind == sidecarKind && c.term != nil {
			at(w.restart(ctx, c, now))
		}
	}
	if !w.initDone {
		return next
	}
	for _, c := range w.regulars {
		switch {
		case c.proc == nil && c.term == nil:
			at(w.tryStart(ctx, c, now))
		case c.term != nil && w.shouldRestart(c):
			at(w.restart(ctx, c, now))
		}
	}
	return next
}

func (w *podWorker) shouldRestart(c *ctr) bool {
	switch w.pod.Spec.RestartPolicy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return c.term.ExitCode != 0
	default:
		return true
	}
}

func (w *podWorker) regularsDone() bool {
	for _, c := range w.regulars {
		if c.term == nil || c.waiting != nil || w.shouldRestart(c) {
			return false
		}
	}
	return true
}

// setupNetwork chooses the pod's network: a network namespace of its own (a
// sandbox of the node's pod network) for a pod that runs a loaded image and
// does not ask for the host's network, the node's network otherwise. It is
// chosen once, when the pod starts. Called with w.mu held.
func (w *podWorker) setupNetwork() error {
	ip := "127.0.0.1"
	own := false
	if w.p.cfg.net != nil && !w.pod.Spec.HostNetwork {
		for _, c := range w.all() {
			img, err := w.p.lookupImage(c.spec.Image)
			if err != nil {
				return err
			}
			own = own || img != nil
		}
	}
	if own {
		sb, err := w.p.cfg.net.NewSandbox(string(w.uid))
		if err != nil {
			return fmt.Errorf("failed to set up the pod's network: %w", err)
		}
		w.sandbox, ip = sb, sb.IP.String()
	}
	w.netDecided = true
	w.pod.Status.PodIP, w.pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	return nil
}

// restart starts an exited container again, at once the first time and then after
// a back-off doubling from 10s to 5m (CrashLoopBackOff meanwhile).
func (w *podWorker) restart(ctx context.Context, c *ctr, now time.Time) time.Time {
	if c.restartAt.IsZero() {
		if c.term.FinishedAt.Sub(c.term.StartedAt.Time) > backoffReset {
			c.backoff = 0
		}
		if c.backoff == 0 {
			c.restartAt = now
			c.backoff = initialBackoff
		} else {
			c.restartAt = c.term.FinishedAt.Add(c.backoff)
			if c.restartAt.Before(now) {
				c.restartAt = now
			}
			c.waiting = &corev1.ContainerStateWaiting{
				Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
					c.backoff, c.spec.Name, w.pod.Name, w.pod.Namespace, w.pod.UID),
			}
			c.backoff = min(2*c.backoff, maxBackoff)
		}
	}
	if now.Before(c.restartAt) {
		return c.restartAt
	}
	c.restartAt = time.Time{}
	c.last, c.term, c.waiting = c.term, nil, nil
	if c.proc != nil {
		c.prev = c.proc
	}
	c.proc = nil
	c.restartCount++
	return w.tryStart(ctx, c, now)
}

// tryStart starts a container instance unless something keeps it waiting; it returns
// when to try again. A command that fails to start counts as an instance that
// exited with code 128, reason StartError.
func (w *podWorker) tryStart(ctx context.Context, c *ctr, now time.Time) time.Time {
	if now.Before(c.retryAt) {
		if c.waiting != nil && c.waiting.Reason == "ErrImagePull" && !now.Before(c.pullBackoffShow) {
			c.waiting = &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: fmt.Sprintf("Back-off pulling image %q", c.spec.Image)}
		}
		if c.waiting != nil && c.waiting.Reason == "ErrImagePull" {
			return c.pullBackoffShow
		}
		return c.retryAt
	}
	switch problem, msg := checkImage(c.spec.Image); problem {
	case imagePullError:
		if c.pullBackoff == 0 {
			c.pullBackoff = initialBackoff
		} else {
			c.pullBackoff = min(2*c.pullBackoff, maxBackoff)
		}
		c.waiting = &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: msg}
		c.retryAt = now.Add(c.pullBackoff)
		c.pullBackoffShow = now.Add(time.Second)
		return c.pullBackoffShow
	case imageInvalidName:
		c.waiting = &corev1.ContainerStateWaiting{Reason: "InvalidImageName", Message: msg}
		c.retryAt = now.Add(never)
		return time.Time{}
	}
	// A loaded image runs from its own root file system; any other image name is
	// ignored and the container's command runs on the host.
	img, err := w.p.lookupImage(c.spec.Image)
	if err != nil {
		c.waiting = &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: err.Error()}
		c.retryAt = now.Add(configRetry)
		return c.retryAt
	}
	// Without a command the args run alone, as on an image without an ENTRYPOINT
	// (busybox, debian, ...): `kubectl run x --image=busybox -- sh -c ...` works.
	if img == nil && len(c.spec.Command) == 0 && len(c.spec.Args) == 0 {
		c.waiting = &corev1.ContainerStateWaiting{
			Reason:  "CreateContainerError",
			Message: fmt.Sprintf("kubetask local node: container %q has no command and no args, and its image %q is not loaded (kubetask cluster load-image): this node runs the command and args of a container whose image is not loaded on the host, so the image's entrypoint is unknown", c.spec.Name, c.spec.Image),
		}
		c.retryAt = now.Add(never)
		return time.Time{}
	}
	env, err := w.resolveEnv(ctx, w.pod, &c.spec)
	var mounts []container.Mount
	if err == nil {
		mounts, err = mountsFor(&c.spec, w.volumes)
	}
	var command, args []string
	if err == nil {
		command, args = expandAll(c.spec.Command, env.vals), expandAll(c.spec.Args, env.vals)
	}
	var run imageRun
	if err == nil && img != nil {
		run, err = resolveImageRun(img.Config, &c.spec, w.pod, command, args, env.list(), readImageFiles(img.Rootfs))
		if err == nil {
			var etc []container.Mount
			if etc, err = podEtcFiles(w.dir, w.pod.Name, w.sandbox); err == nil {
				mounts = append(etc, mounts...)
			}
		}
	}
	if err != nil {
		var ce *configError
		reason := "CreateContainerError"
		if errors.As(err, &ce) {
			reason = "CreateContainerConfigError"
		}
		c.waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: err.Error()}
		c.retryAt = now.Add(configRetry)
		return c.retryAt
	}

	instance := c.instances
	c.instances++
	instDir := filepath.Join(w.dir, "containers", c.spec.Name, strconv.Itoa(instance))
	termFile := filepath.Join(instDir, "termination-log")
	if err := os.MkdirAll(instDir, 0o755); err != nil {
		w.log.Warn("creating container directory", "dir", instDir, "err", err)
	} else if err := os.WriteFile(termFile, nil, 0o666); err != nil {
		w.log.Warn("creating termination-message file", "file", termFile, "err", err)
	} else if err := os.Chmod(termFile, 0o666); err != nil { // whatever the umask: any user may write it
		w.log.Warn("creating termination-message file", "file", termFile, "err", err)
	}
	tmPath := c.spec.TerminationMessagePath
	if tmPath == "" {
		tmPath = corev1.TerminationMessagePathDefault
	}
	mounts = append(mounts, container.Mount{HostPath: termFile, ContainerPath: tmPath})
	spec := container.Spec{
		Command:    append(command, args...),
		Env:        env.list(),
		WorkingDir: c.spec.WorkingDir,
		Mounts:     mounts,
		LogPath:    filepath.Join(w.dir, "logs", c.spec.Name, strconv.Itoa(instance)+".log"),
	}
	if w.sandbox != nil {
		spec.NetNS = w.sandbox.NetNS()
	}
	c.imageID = ""
	if img != nil {
		u := run.user
		spec.Command, spec.Env, spec.WorkingDir, spec.User = run.argv, run.env, run.dir, &u
		spec.Rootfs = &container.Rootfs{Image: img.Rootfs, State: filepath.Join(instDir, "rootfs")}
		spec.Hostname = podHostname(w.pod)
		spec.Security, spec.Limits = containerSecurity(w.pod, &c.spec), containerLimits(&c.spec)
		spec.Runtime = w.p.cfg.runtime
		c.imageID = img.ID
	}
	c.curID = fmt.Sprintf("kubetask://%s-%s-%d", w.uid, c.spec.Name, instance)
	c.termFile = termFile
	proc, err := container.Start(ctx, spec)
	var se *container.StartError
	switch {
	case errors.As(err, &se):
		c.everRan = true
		c.waiting = nil
		c.term = &corev1.ContainerStateTerminated{
			ExitCode:    128,
			Reason:      "StartError",
			Message:     fmt.Sprintf("failed to start container %q: %s", c.spec.Name, se.Msg),
			StartedAt:   metav1.Unix(0, 0),
			FinishedAt:  metav1.NewTime(now),
			ContainerID: c.curID,
		}
		w.log.Info("container failed to start", "container", c.spec.Name, "err", se.Msg)
		return now // look again at once: no process exit will wake the worker

	case err != nil:
		c.waiting = &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: err.Error()}
		c.retryAt = now.Add(configRetry)
		return c.retryAt
	}
	c.proc, c.waiting, c.everRan = proc, nil, true
	c.probeReady = false
	if pr := c.spec.ReadinessProbe; pr != nil {
		go w.probeReadiness(c, proc, pr)
	}
	// Startup probes are not run: a container that has one is not probed for
	// liveness either, so that a slow start is never taken for a hang.
	if pr := c.spec.LivenessProbe; pr != nil && c.spec.StartupProbe == nil {
		go w.probeLiveness(ctx, c, proc, pr)
	}
	go func() {
		select {
		case <-proc.Done():
			w.poke()
		case <-w.destroyed:
		}
	}()
	w.log.Debug("container started", "container", c.spec.Name, "pid", proc.PID(), "restartCount", c.restartCount)
	return time.Time{}
}

// terminated builds the kubelet's terminated state for c's exited current instance.
func (w *podWorker) terminated(c *ctr) *corev1.ContainerStateTerminated {
	res := c.proc.Result()
	t := &corev1.ContainerStateTerminated{
		ExitCode:    int32(res.ExitCode), //nolint:gosec // exit statuses are 0-255, or 128+signal
		StartedAt:   metav1.NewTime(res.StartedAt),
		FinishedAt:  metav1.NewTime(res.FinishedAt),
		ContainerID: c.curID,
		Reason:      "Completed",
	}
	switch {
	case res.OOMKilled:
		t.Reason = "OOMKilled"
	case res.ExitCode != 0:
		t.Reason = "Error"
	}
	msg, err := container.ReadTerminationMessage(c.termFile)
	if err != nil {
		w.log.Warn("could not read termination message", "container", c.spec.Name, "err", err)
	}
	if msg == "" && res.ExitCode != 0 && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		msg = c.proc.LogTail(80, 2048)
	}
	t.Message = msg
	return t
}

// logInstance picks the instance whose log `kubectl logs [--previous]` reads.
func (w *podWorker) logInstance(name string, previous bool) (*container.Process, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.all() {
		if c.spec.Name != name {
			continue
		}
		if previous {
			if c.prev == nil {
				return nil, errdefs.InvalidInputf("previous terminated container %q in pod %q not found", name, w.pod.Name)
			}
			return c.prev, nil
		}
		if c.proc == nil {
			reason := "ContainerCreating"
			if c.waiting != nil {
				reason = c.waiting.Reason
			}
			return nil, errdefs.InvalidInputf("container %q in pod %q is waiting to start: %s", name, w.pod.Name, reason)
		}
		return c.proc, nil
	}
	return nil, errdefs.NotFoundf("container %q is not valid for pod %q", name, w.pod.Name)
}

// runningInstance returns the process exec runs in.
func (w *podWorker) runningInstance(name string) (*container.Process, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.all() {
		if c.spec.Name == name {
			if !c.running() || c.proc.Exited() {
				return nil, errdefs.InvalidInputf("container %q in pod %q is not running", name, w.pod.Name)
			}
			return c.proc, nil
		}
	}
	return nil, errdefs.NotFoundf("container %q is not valid for pod %q", name, w.pod.Name)
}

// snapshot returns the pod with its current status.
func (w *podWorker) snapshot() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snapshotLocked(w.clock().Now())
}

func (w *podWorker) snapshotLocked(now time.Time) *corev1.Pod {
	pod := w.pod.DeepCopy()
	pod.Status = w.status(now)
	return pod
}
