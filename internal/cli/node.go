package cli

import (
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubetask/kubetask/internal/localnode"
	"github.com/kubetask/kubetask/internal/podnet"
)

// runtimeFlagHelp describes --runtime of `node run`, `cluster up` and `cluster supervise`.
const runtimeFlagHelp = "what runs the containers of loaded images: runc or init (default $" + localnode.RuntimeEnvVar + ", else runc when it is on PATH, else init with a warning); host processes run as they are either way"

// newNodeCommand is the hidden `kubetask node run` that local clusters start for each
// local process node (see docs/local-node.md).
func newNodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "node",
		Short:  "Run a local Kubernetes node whose pods run as host processes (used by local clusters)",
		Hidden: true,
	}
	var cfg localnode.Config
	run := &cobra.Command{
		Use:   "run",
		Short: "Register a node and run the pods bound to it as local processes until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := localnode.ValidateRuntimeFlag(cfg.Runtime); err != nil {
				return err
			}
			cfg.Logger = slog.Default()
			return localnode.Run(cmd.Context(), cfg)
		},
	}
	f := run.Flags()
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to join (required)")
	f.StringVar(&cfg.NodeName, "name", "", "node name (required)")
	f.StringVar(&cfg.Dir, "dir", "", "directory for the pods' logs, volumes and termination messages (required)")
	f.StringVar(&cfg.ListenAddr, "listen", "127.0.0.1:0", "address of the kubelet API (logs, exec)")
	f.StringVar(&cfg.ImageDir, "images", "", "image store (kubetask cluster load-image): containers whose image is in it run from the image")
	f.IntVar(&cfg.MaxPods, "max-pods", 500, "pod capacity")
	f.DurationVar(&cfg.StopGrace, "stop-grace", 2*time.Second, "time containers get after SIGTERM when the node stops")
	f.StringVar(&cfg.PodSubnet, "pod-subnet", "", "IPv4 subnet of the pods of loaded images, each in a network namespace of its own (default: a free /24 of "+podnet.DefaultPool.String()+")")
	f.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA of the client certificates the kubelet API accepts (the apiserver's --kubelet-client-certificate), each request then authorised by the apiserver (default: the kubeconfig's CA)")
	f.StringVar(&cfg.Runtime, "runtime", "", runtimeFlagHelp)
	f.BoolVar(&cfg.NoPodNetwork, "no-pod-network", false, "keep every pod in the node's network (pod IP 127.0.0.1)")
	for _, name := range []string{"kubeconfig", "name", "dir"} {
		_ = run.MarkFlagRequired(name)
	}
	cmd.AddCommand(run)
	return cmd
}
