package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubetask/kubetask/internal/components"
	"github.com/kubetask/kubetask/internal/imagestore"
	"github.com/kubetask/kubetask/internal/localcluster"
	"github.com/kubetask/kubetask/internal/localnode"
)

type clusterFlags struct {
	stateDir string
}

func (f *clusterFlags) dir() (localcluster.StateDir, error) {
	if f.stateDir != "" {
		return localcluster.StateDir(f.stateDir), nil
	}
	d, err := localcluster.DefaultStateDir()
	return localcluster.StateDir(d), err
}

// state resolves the state directory and reads its state (nil when there is none).
func (f *clusterFlags) state() (localcluster.StateDir, *localcluster.State, error) {
	dir, err := f.dir()
	if err != nil {
		return "", nil, err
	}
	st, err := dir.Read()
	return dir, st, err
}

func newClusterCommand() *cobra.Command {
	f := &clusterFlags{}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run a local Kubernetes cluster (real etcd, kube-apiserver, scheduler, controller-manager) for development and tests",
	}
	cmd.PersistentFlags().StringVar(&f.stateDir, "state-dir", "", "directory of the cluster's state (default $"+localcluster.EnvStateDir+" or ~/.local/state/kubetask/cluster)")
	cmd.AddCommand(newClusterUpCommand(f), newClusterDownCommand(f), newClusterStatusCommand(f),
		newClusterKubeconfigCommand(f), newClusterBuildCommand(), newClusterSuperviseCommand(f), newClusterLoadImageCommand(f))
	return cmd
}

type upFlags struct {
	nodes, simNodes, apiserverPort int
	timeout                        time.Duration
	runtime                        string   // the local nodes' --runtime; empty: theirs
	given                          []string // the flags given that shape the cluster (applied when it starts)
}

func newClusterUpCommand(f *clusterFlags) *cobra.Command {
	u := &upFlags{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start the local cluster in the background (building its components on first use) and print its kubeconfig",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.Flags().Visit(func(fl *pflag.Flag) {
				if fl.Name != "timeout" {
					u.given = append(u.given, "--"+fl.Name)
				}
			})
			return clusterUp(cmd.Context(), f, u, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().IntVar(&u.nodes, "nodes", 1, "number of local process nodes (pods run as host processes)")
	cmd.Flags().IntVar(&u.simNodes, "sim-nodes", 0, "number of kwok-simulated nodes")
	cmd.Flags().IntVar(&u.apiserverPort, "apiserver-port", 0, "kube-apiserver port on 127.0.0.1 (0 picks a free port)")
	cmd.Flags().DurationVar(&u.timeout, "timeout", 5*time.Minute, "how long to wait for the cluster to be ready (builds excluded)")
	cmd.Flags().StringVar(&u.runtime, "runtime", "", "local nodes: "+runtimeFlagHelp+"; applies when the cluster starts")
	return cmd
}

func (u *upFlags) validate() error {
	switch {
	case u.nodes < 0:
		return fmt.Errorf("--nodes must be 0 or more, got %d", u.nodes)
	case u.simNodes < 0:
		return fmt.Errorf("--sim-nodes must be 0 or more, got %d", u.simNodes)
	case u.apiserverPort < 0 || u.apiserverPort > 65535:
		return fmt.Errorf("--apiserver-port must be between 1 and 65535 (or 0 for a free port), got %d", u.apiserverPort)
	}
	return localnode.ValidateRuntimeFlag(u.runtime)
}

func clusterUp(ctx context.Context, f *clusterFlags, u *upFlags, stdout, stderr io.Writer) error {
	if err := u.validate(); err != nil {
		return err
	}
	dir, err := f.dir()
	if err != nil {
		return err
	}
	start := time.Now()
	if st, err := dir.Read(); err != nil {
		return err
	} else if st != nil && st.Status == localcluster.StatusReady && dir.SupervisorRunning() {
		printUp(stdout, st, "the local cluster is already up")
		u.noteIgnored(stderr)
		return nil
	}
	// Build in the foreground so that progress and toolchain errors reach the user.
	want := []components.Component{components.Etcd, components.KubeAPIServer, components.KubeScheduler, components.KubeControllerManager}
	if u.simNodes > 0 {
		want = append(want, components.Kwok)
	}
	b, err := components.NewBuilder(stderr)
	if err != nil {
		return err
	}
	if _, err := b.EnsureAll(ctx, want...); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locating the kubetask executable: %w", err)
	}
	args := superviseArgs(exe, dir, u)
	fmt.Fprintln(stderr, "starting the local cluster...")
	st, already, err := dir.Up(ctx, localcluster.UpOptions{Supervisor: args, Timeout: u.timeout})
	if err != nil {
		return err
	}
	if already {
		printUp(stdout, st, "the local cluster is already up")
		u.noteIgnored(stderr)
		return nil
	}
	printUp(stdout, st, fmt.Sprintf("the local cluster is up (ready in %s)", time.Since(start).Round(100*time.Millisecond)))
	return nil
}

// noteIgnored tells the user that the flags given, which shape the cluster,
// did nothing to a cluster already up.
func (u *upFlags) noteIgnored(w io.Writer) {
	if len(u.given) > 0 {
		fmt.Fprintf(w, "note: %s shape the cluster when it starts and changed nothing: it is already up; to change them, run kubetask cluster down, then kubetask cluster up with them\n",
			strings.Join(u.given, ", "))
	}
}

// superviseArgs is the command line of the supervisor `cluster up` starts:
// exe with the cluster's flags.
func superviseArgs(exe string, dir localcluster.StateDir, u *upFlags) []string {
	args := []string{exe, "cluster", "supervise", "--state-dir", string(dir),
		"--nodes", strconv.Itoa(u.nodes), "--sim-nodes", strconv.Itoa(u.simNodes),
		"--apiserver-port", strconv.Itoa(u.apiserverPort)}
	if u.runtime != "" {
		args = append(args, "--runtime", u.runtime)
	}
	return args
}

func printUp(w io.Writer, st *localcluster.State, headline string) {
	fmt.Fprintf(w, "%s\nkubeconfig: %s\nexport KUBECONFIG=%s\n", headline, st.Kubeconfig, st.Kubeconfig)
}

func newClusterSuperviseCommand(f *clusterFlags) *cobra.Command {
	u := &upFlags{}
	cmd := &cobra.Command{
		Use:    "supervise",
		Short:  "Run the local cluster in the foreground (what `cluster up` starts in the background)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := u.validate(); err != nil {
				return err
			}
			dir, err := f.dir()
			if err != nil {
				return err
			}
			b, err := components.NewBuilder(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			paths, err := b.EnsureAll(cmd.Context(), components.Etcd, components.KubeAPIServer, components.KubeScheduler, components.KubeControllerManager)
			if err != nil {
				return err
			}
			cfg := localcluster.Config{
				Binaries: localcluster.Binaries{
					Etcd: paths[components.Etcd.Name], APIServer: paths[components.KubeAPIServer.Name],
					Scheduler: paths[components.KubeScheduler.Name], ControllerManager: paths[components.KubeControllerManager.Name],
				},
				APIServerPort: u.apiserverPort,
				LocalNodes:    u.nodes,
				NodeRuntime:   u.runtime,
				SimNodes:      u.simNodes,
			}
			if u.simNodes > 0 {
				if cfg.Binaries.Kwok, err = b.Ensure(cmd.Context(), components.Kwok); err != nil {
					return err
				}
			}
			if u.nodes > 0 {
				if cfg.KubetaskBinary, err = os.Executable(); err != nil {
					return err
				}
			}
			return dir.Supervise(cmd.Context(), cfg, slog.Default())
		},
	}
	cmd.Flags().IntVar(&u.nodes, "nodes", 1, "number of local process nodes")
	cmd.Flags().IntVar(&u.simNodes, "sim-nodes", 0, "number of kwok-simulated nodes")
	cmd.Flags().IntVar(&u.apiserverPort, "apiserver-port", 0, "kube-apiserver port (0 picks a free port)")
	cmd.Flags().StringVar(&u.runtime, "runtime", "", "local nodes: "+runtimeFlagHelp)
	return cmd
}

func newClusterDownCommand(f *clusterFlags) *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the local cluster and remove its state (unless --keep)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, st, err := f.state()
			if err != nil {
				return err
			}
			if err := dir.Down(cmd.Context(), keep); err != nil {
				return err
			}
			switch {
			case st == nil:
				fmt.Fprintln(cmd.OutOrStdout(), "no local cluster is running")
			case keep:
				fmt.Fprintf(cmd.OutOrStdout(), "the local cluster is down; its state is kept in %s\n", dir)
			default:
				fmt.Fprintln(cmd.OutOrStdout(), "the local cluster is down and its state removed")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the state directory (etcd data, logs, keys)")
	return cmd
}

func newClusterStatusCommand(f *clusterFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show whether the local cluster runs, its components and nodes (exit 1 when it is not up)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, st, err := f.state()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if st == nil || !dir.SupervisorRunning() {
				fmt.Fprintln(out, "status: down")
				return &ExitError{Code: 1}
			}
			fmt.Fprintf(out, "status: %s\nstate: %s\n", st.Status, dir)
			if st.Status != localcluster.StatusReady {
				if st.Error != "" {
					fmt.Fprintf(out, "error: %s\n", st.Error)
				}
				return &ExitError{Code: 1}
			}
			fmt.Fprintf(out, "kubeconfig: %s\napiserver: https://127.0.0.1:%d\nup since: %s\n", st.Kubeconfig, st.APIServerPort, st.ReadyAt.Format(time.RFC3339))
			for _, p := range st.Processes {
				fmt.Fprintf(out, "  %-26s pid %-7d log %s\n", p.Name, p.PID, p.Log)
			}
			return printNodes(cmd.Context(), out, st.Kubeconfig)
		},
	}
}

func printNodes(ctx context.Context, out io.Writer, kubeconfig string) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	rc.Timeout = 5 * time.Second
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("the supervisor runs but the apiserver does not answer: %w", err)}
	}
	fmt.Fprintf(out, "nodes: %d\n", len(nodes.Items))
	for _, n := range nodes.Items {
		ready := "NotReady"
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready = "Ready"
			}
		}
		fmt.Fprintf(out, "  %-26s %s\n", n.Name, ready)
	}
	return nil
}

func newClusterKubeconfigCommand(f *clusterFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the path of the local cluster's kubeconfig",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, st, err := f.state()
			if err != nil {
				return err
			}
			if st == nil || st.Status != localcluster.StatusReady || !dir.SupervisorRunning() {
				return errors.New("the local cluster is not up: run `kubetask cluster up`")
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.Kubeconfig)
			return nil
		},
	}
}

func newClusterBuildCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "build",
		Short: "Build (or find in the cache) every pinned control-plane component",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := components.NewBuilder(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			for _, c := range components.All() {
				p, err := b.Ensure(cmd.Context(), c)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%-24s %-8s %s\n", c.Name, c.Version, p)
			}
			return nil
		},
	}
}

func newClusterLoadImageCommand(f *clusterFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "load-image ARCHIVE...",
		Short: "Put container images into the local cluster's image store, from which its local nodes run pods (as kind load image-archive)",
		Long: `Put the images of each ARCHIVE into the local cluster's image store: a
docker-compatible tar (docker save, podman save, make image's bin/image/kubetask-image.tar)
or an OCI image layout directory (make image's bin/image/oci). A pod whose image
names a loaded image (by repository:tag, or by digest) then runs on the local
nodes from the image's own root file system, with its entrypoint, cmd, env,
working directory and user; other pods keep running their command on the host.
Loading the same name again points it at the new image (pods started later use it).`,
		Example: `  make image && kubetask cluster load-image bin/image/kubetask-image.tar
  kubectl run hello --image=ghcr.io/kubetask/kubetask:latest --restart=Never -- version`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, archives []string) error {
			dir, err := f.dir()
			if err != nil {
				return err
			}
			if st, err := os.Stat(dir.ImageDir()); err != nil || !st.IsDir() {
				return fmt.Errorf("no local cluster in %s (it has no image store %s): start one with `kubetask cluster up` (or pass its --state-dir)", dir, dir.ImageDir())
			}
			store := imagestore.New(dir.ImageDir())
			for _, a := range archives {
				start := time.Now()
				loaded, err := store.Load(cmd.Context(), a)
				if err != nil {
					return err
				}
				took := time.Since(start).Round(10 * time.Millisecond)
				for _, l := range loaded {
					what := "already in the store"
					if l.Unpacked {
						what = "unpacked in " + took.String()
					}
					fmt.Fprintf(cmd.OutOrStdout(), "loaded image %s (%s)\n", l.ID, what)
					for _, k := range l.Keys[1:] {
						fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", k)
					}
				}
			}
			return nil
		},
	}
}
