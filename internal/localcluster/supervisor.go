package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A background cluster lives in a state directory: a supervisor process
// (kubetask cluster supervise) owns the components and holds
// supervisor.lock for its whole life; state.json says how far it got.

// StateKind marks a state.json written by kubetask.
const StateKind = "kubetask-local-cluster"

// Status values of a background cluster.
const (
	StatusStarting = "starting"
	StatusReady    = "ready"
	StatusFailed   = "failed"
	StatusStopping = "stopping"
	StatusStopped  = "stopped"
)

// EnvStateDir overrides the default state directory of the background cluster.
const EnvStateDir = "KUBETASK_STATE_DIR"

// State is the content of state.json.
type State struct {
	Kind          string    `json:"kind"`
	Status        string    `json:"status"`
	SupervisorPID int       `json:"supervisorPID"`
	StartedAt     time.Time `json:"startedAt"`
	ReadyAt       time.Time `json:"readyAt,omitzero"`
	Kubeconfig    string    `json:"kubeconfig,omitempty"`
	APIServerPort int       `json:"apiServerPort,omitempty"`
	Processes     []Process `json:"processes,omitempty"`
	// Ports the components listen on (kwok's only once it runs).
	Ports map[string]int `json:"ports,omitempty"`
	Error string         `json:"error,omitempty"`
}

// ErrStarting means another process is starting the background cluster.
var ErrStarting = errors.New("a local cluster is already starting")

// DefaultStateDir is $KUBETASK_STATE_DIR, else $XDG_STATE_HOME/kubetask/cluster,
// else ~/.local/state/kubetask/cluster.
func DefaultStateDir() (string, error) {
	if d := os.Getenv(EnvStateDir); d != "" {
		return filepath.Abs(d)
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "kubetask", "cluster"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("locating the home directory (set %s): %w", EnvStateDir, err)
	}
	return filepath.Join(home, ".local", "state", "kubetask", "cluster"), nil
}

// StateDir is the directory of a background cluster.
type StateDir string

func (d StateDir) file(name string) string { return filepath.Join(string(d), name) }

// Read returns the directory's state. It returns (nil, nil) when the
// directory does not exist or is empty, and an error naming the directory and
// the way out when it holds something that is not a kubetask cluster.
func (d StateDir) Read() (*State, error) {
	entries, err := os.ReadDir(string(d))
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading state directory %s: %w", d, err)
	}
	data, err := os.ReadFile(d.file("state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s is not empty and has no state.json, so it is not a kubetask cluster directory; kubetask will not touch it: remove it yourself or set %s to another directory", d, EnvStateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.file("state.json"), err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil || st.Kind != StateKind {
		return nil, fmt.Errorf("%s is corrupt or was not written by kubetask (%v); if no cluster runs from it, remove %s and try again", d.file("state.json"), errOr(err, "kind "+strconv.Quote(st.Kind)), d)
	}
	return &st, nil
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

func (d StateDir) write(st *State) error {
	st.Kind = StateKind
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.file("state.json.tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return os.Rename(tmp, d.file("state.json"))
}

// lock takes an exclusive, non-blocking flock on name inside the directory.
// ok is false when another process holds it.
func (d StateDir) lock(name string) (release func(), ok bool, err error) {
	f, err := os.OpenFile(d.file(name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", d.file(name), err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, true, nil
}

// SupervisorRunning reports whether a supervisor holds the directory.
func (d StateDir) SupervisorRunning() bool {
	if _, err := os.Stat(d.file("supervisor.lock")); err != nil {
		return false
	}
	release, ok, err := d.lock("supervisor.lock")
	if err != nil {
		return false
	}
	if ok {
		release()
		return false
	}
	return true
}

// Supervise runs a cluster from the state directory until ctx ends, then
// stops it. It records progress in state.json. Only one supervisor can hold
// a directory.
func (d StateDir) Supervise(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	release, ok, err := d.lock("supervisor.lock")
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w from %s", ErrStarting, d)
	}
	defer release()
	st := &State{Status: StatusStarting, SupervisorPID: os.Getpid(), StartedAt: time.Now()}
	if err := d.write(st); err != nil {
		return err
	}
	cfg.Dir = string(d)
	cfg.Logger = log
	c, err := Start(ctx, cfg)
	if err != nil {
		st.Status, st.Error = StatusFailed, err.Error()
		_ = d.write(st)
		return err
	}
	st.Status, st.ReadyAt = StatusReady, time.Now()
	st.Kubeconfig, st.APIServerPort, st.Processes, st.Ports = c.Kubeconfig(), c.APIServerPort(), c.Processes(), c.Ports()
	if err := d.write(st); err != nil {
		_ = c.Stop(context.Background())
		return err
	}
	log.Info("cluster ready", "kubeconfig", c.Kubeconfig(), "startup", st.ReadyAt.Sub(st.StartedAt).Round(time.Millisecond))
	<-ctx.Done()
	st.Status = StatusStopping
	_ = d.write(st)
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Stop(stopCtx)
	st.Status, st.Processes = StatusStopped, nil
	_ = d.write(st)
	return err
}

// UpOptions configure Up.
type UpOptions struct {
	// Supervisor is the command line that runs Supervise for this directory
	// (kubetask cluster supervise ...).
	Supervisor []string
	// Timeout bounds the wait for readiness (default 5 minutes).
	Timeout time.Duration
}

// Up starts a supervisor in the background and waits until the cluster is
// ready. When the cluster is up already it returns its state and
// alreadyUp=true. When another Up is in progress it returns ErrStarting.
func (d StateDir) Up(ctx context.Context, opts UpOptions) (st *State, alreadyUp bool, err error) {
	if st, err := d.Read(); err != nil {
		return nil, false, err
	} else if st != nil && d.SupervisorRunning() {
		if st.Status == StatusReady {
			return st, true, nil
		}
		return nil, false, fmt.Errorf("%w (supervisor pid %d, status %s): wait for it, or run `kubetask cluster down` first", ErrStarting, st.SupervisorPID, st.Status)
	}
	if err := os.MkdirAll(filepath.Join(string(d), "logs"), 0o700); err != nil {
		return nil, false, fmt.Errorf("creating state directory: %w", err)
	}
	releaseUp, ok, err := d.lock("up.lock")
	if err != nil {
		return nil, false, err
	}
	if !ok {
		return nil, false, fmt.Errorf("%w: another `kubetask cluster up` is running for %s", ErrStarting, d)
	}
	defer releaseUp()
	// A directory with no supervisor: clear what a previous run left.
	_ = os.Remove(d.file("state.json"))
	logPath := d.file("logs/supervisor.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening supervisor log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(opts.Supervisor[0], opts.Supervisor[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlive this command
	if err := cmd.Start(); err != nil {
		return nil, false, fmt.Errorf("starting the cluster supervisor: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	fail := func(err error) (*State, bool, error) {
		// Never leave a half-started cluster behind.
		_ = d.Down(context.WithoutCancel(ctx), true)
		return nil, false, err
	}
	for {
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("interrupted while the cluster was starting: %w", ctx.Err()))
		case <-deadline.C:
			return fail(fmt.Errorf("the cluster was not ready after %s; see %s", timeout, logPath))
		case <-exited:
			if st, _ := d.Read(); st != nil && st.Status == StatusFailed {
				return fail(errors.New(st.Error))
			}
			return fail(fmt.Errorf("the cluster supervisor exited during start-up; last lines of %s:\n%s", logPath, tailFile(logPath, 15)))
		case <-tick.C:
			st, err := d.Read()
			if err != nil {
				continue // being written
			}
			if st != nil && st.Status == StatusReady {
				return st, false, nil
			}
		}
	}
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return lastLines(string(data), n)
}

// Down stops the background cluster, if any, and removes the state directory
// unless keep is set. It refuses to remove a directory that is not a kubetask
// cluster's. Component processes recorded in state.json that are still
// alive are killed too.
func (d StateDir) Down(ctx context.Context, keep bool) error {
	st, err := d.Read()
	if err != nil {
		return err
	}
	if st == nil {
		if !keep {
			_ = os.RemoveAll(string(d))
		}
		return nil
	}
	if d.SupervisorRunning() && st.SupervisorPID > 0 {
		_ = syscall.Kill(st.SupervisorPID, syscall.SIGTERM)
		if !d.waitSupervisorGone(ctx, 90*time.Second) {
			// Its components die with it (parent-death signal).
			_ = syscall.Kill(st.SupervisorPID, syscall.SIGKILL)
			d.waitSupervisorGone(ctx, 10*time.Second)
		}
	}
	// Belt and braces: kill any recorded component group still alive, but only
	// a process whose command line names this directory (pids get reused).
	if st2, err := d.Read(); err == nil && st2 != nil {
		st = st2
	}
	for _, p := range st.Processes {
		if p.PID > 0 && cmdlineMentions(p.PID, string(d)) {
			_ = syscall.Kill(-p.PID, syscall.SIGKILL)
		}
	}
	if keep {
		return nil
	}
	if err := os.RemoveAll(string(d)); err != nil {
		return fmt.Errorf("removing %s: %w", d, err)
	}
	return nil
}

func (d StateDir) waitSupervisorGone(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !d.SupervisorRunning() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}

func cmdlineMentions(pid int, s string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(data), s)
}
