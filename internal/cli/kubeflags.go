package cli

import (
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeFlags are kubectl's connection flags, with the names, shorthands and
// meaning of k8s.io/cli-runtime's ConfigFlags (--kubeconfig, --context,
// -n/--namespace, -s/--server, --token, --as, ...), bound to client-go's
// clientcmd loading rules and overrides, on which ConfigFlags itself is
// built.
//
// ConfigFlags is not used because its package (genericclioptions) imports
// cli-runtime's resource builder, and with it kustomize and Go's plugin
// package: a binary that links plugin keeps every exported method of every
// type and, built with cgo, exports every symbol to the dynamic linker.
// That doubled the kubetask binary and the memory its start touches
// (docs/benchmarks.md, "kubetask run against kubectl run").
// TestKubeFlagsAreKubectls keeps the two flag sets equal.
type kubeFlags struct {
	rules     *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
	userExtra []string
	cacheDir  string // accepted as kubectl accepts it; kubetask has no discovery cache
	loader    clientcmd.ClientConfig
}

func newKubeFlags() *kubeFlags {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	// As ConfigFlags: without a kubeconfig, the client's defaults apply.
	rules.DefaultClientConfig = &clientcmd.DefaultClientConfig
	return &kubeFlags{rules: rules, overrides: clientcmd.ConfigOverrides{ClusterDefaults: clientcmd.ClusterDefaults}}
}

// addFlags registers the flags on fs.
func (k *kubeFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&k.rules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use for CLI requests.")
	fs.StringVar(&k.cacheDir, "cache-dir", "", "Default cache directory (accepted for kubectl's sake; unused)")
	_ = fs.MarkHidden("cache-dir")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	names.ClusterOverrideFlags.APIServer.ShortName = "s"
	// kubectl dropped these: basic auth comes from the kubeconfig only.
	names.AuthOverrideFlags.Username.LongName, names.AuthOverrideFlags.Password.LongName = "", ""
	clientcmd.BindOverrideFlags(&k.overrides, fs, names)
	fs.StringArrayVar(&k.userExtra, "as-user-extra", nil, "User extras to impersonate for the operation, this flag can be repeated to specify multiple values for the same key.")
}

// clientConfig is the kubeconfig as the flags change it; built once, on
// first use, after the flags were parsed.
func (k *kubeFlags) clientConfig() clientcmd.ClientConfig {
	if k.loader == nil {
		if extra := parseUserExtra(k.userExtra); len(extra) > 0 {
			k.overrides.AuthInfo.ImpersonateUserExtra = extra
		}
		k.loader = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(k.rules, &k.overrides)
	}
	return k.loader
}

// restConfig is the client configuration the flags select.
func (k *kubeFlags) restConfig() (*rest.Config, error) { return k.clientConfig().ClientConfig() }

// namespace is -n as given ("" when not given).
func (k *kubeFlags) namespace() string { return k.overrides.Context.Namespace }

// parseUserExtra reads --as-user-extra KEY=VALUE values as ConfigFlags
// does: values of one key add up; a value without "=" is ignored.
func parseUserExtra(values []string) map[string][]string {
	var m map[string][]string
	for _, v := range values {
		key, val, ok := strings.Cut(v, "=")
		if !ok {
			continue
		}
		if m == nil {
			m = map[string][]string{}
		}
		m[key] = append(m[key], val)
	}
	return m
}
