package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/kubetask/kubetask/internal/version"
	"github.com/kubetask/kubetask/pkg/client"
)

// Environment variables of the client commands (submit, get, list, logs,
// cancel, rerun). A flag wins over its variable, a variable over the client
// config file.
const (
	EnvServer       = "KUBETASK_SERVER"
	EnvToken        = "KUBETASK_TOKEN" //nolint:gosec // the name of a variable, not a credential
	EnvCAFile       = "KUBETASK_CA_FILE"
	EnvClientConfig = "KUBETASK_CLIENT_CONFIG"
)

// ClientConfig is the client config file, $XDG_CONFIG_HOME/kubetask/client.yaml
// (~/.config/kubetask/client.yaml) or --client-config:
//
//	server: https://kubetask.example:8443
//	token-file: token          # or token: <the token>
//	ca-file: ca.pem            # relative paths are relative to the file
type ClientConfig struct {
	Server    string `json:"server,omitempty"`
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"token-file,omitempty"`
	CAFile    string `json:"ca-file,omitempty"`
	// InsecureSkipTLSVerify accepts any server certificate (tests only).
	InsecureSkipTLSVerify bool `json:"insecure-skip-tls-verify,omitempty"`
}

// clientFlags are the connection flags of the client commands.
type clientFlags struct {
	server, token, caFile, config string
	insecure                      bool
}

func (f *clientFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.server, "server", "", "address of kubetask serve (default $"+EnvServer+", the client config's server, else "+client.DefaultServer+")")
	fs.StringVar(&f.token, "token", "", "bearer token (default $"+EnvToken+", else the client config's token or token-file)")
	fs.StringVar(&f.caFile, "ca-file", "", "PEM CA certificate(s) of an https server (default $"+EnvCAFile+", else the client config's ca-file)")
	fs.BoolVar(&f.insecure, "insecure-skip-tls-verify", false, "accept any server certificate (exposes the token: tests only)")
	fs.StringVar(&f.config, "client-config", "", "client config file (default $"+EnvClientConfig+", else $XDG_CONFIG_HOME/kubetask/client.yaml)")
}

// serverFromDefault is connection.ServerFrom when no server was configured.
const serverFromDefault = "the default"

// connection is where and how the client commands reach the server, with
// where each setting came from (for error messages).
type connection struct {
	Server, ServerFrom string
	Token, TokenFrom   string
	CAFile             string
	Insecure           bool
	// ConfigFile is the client config file read ("" when none was).
	ConfigFile string
}

// resolveConnection resolves the connection settings: a flag given on the
// command line (changed reports which), else its environment variable (read
// with getenv), else the client config file, else the default. The config
// file is --client-config, else $KUBETASK_CLIENT_CONFIG (both must exist),
// else $XDG_CONFIG_HOME/kubetask/client.yaml or ~/.config/kubetask/client.yaml
// when it exists.
func resolveConnection(f *clientFlags, changed func(string) bool, getenv func(string) string) (connection, error) {
	var conn connection
	file, path, err := loadClientConfig(f.config, changed("client-config"), getenv)
	if err != nil {
		return conn, err
	}
	conn.ConfigFile = path
	fromFile := "the client config " + path
	pick := func(flagName, flagVal, env, fileVal string) (string, string) {
		switch {
		case changed(flagName):
			return flagVal, "--" + flagName
		case getenv(env) != "":
			return getenv(env), "$" + env
		case fileVal != "":
			return fileVal, fromFile
		}
		return "", ""
	}
	conn.Server, conn.ServerFrom = pick("server", f.server, EnvServer, file.Server)
	if conn.Server == "" {
		conn.Server, conn.ServerFrom = client.DefaultServer, serverFromDefault
	}
	if file.Token != "" && file.TokenFile != "" {
		return conn, fmt.Errorf("client config %s: give token or token-file, not both", path)
	}
	fileToken := file.Token
	if file.TokenFile != "" {
		b, err := os.ReadFile(file.TokenFile)
		if err != nil {
			return conn, fmt.Errorf("client config %s: token-file: %w", path, err)
		}
		if fileToken = strings.TrimSpace(string(b)); fileToken == "" {
			return conn, fmt.Errorf("client config %s: token-file %s is empty", path, file.TokenFile)
		}
	}
	conn.Token, conn.TokenFrom = pick("token", f.token, EnvToken, fileToken)
	conn.Token = strings.TrimSpace(conn.Token)
	conn.CAFile, _ = pick("ca-file", f.caFile, EnvCAFile, file.CAFile)
	conn.Insecure = f.insecure || (!changed("insecure-skip-tls-verify") && file.InsecureSkipTLSVerify)
	return conn, nil
}

// loadClientConfig reads the client config file, if there is one; relative
// paths in it become relative to its directory.
func loadClientConfig(flagPath string, flagSet bool, getenv func(string) string) (ClientConfig, string, error) {
	var cfg ClientConfig
	path, required := flagPath, flagSet
	if !flagSet {
		path, required = getenv(EnvClientConfig), getenv(EnvClientConfig) != ""
	}
	if !required {
		dir := getenv("XDG_CONFIG_HOME")
		if dir == "" {
			home := getenv("HOME")
			if home == "" {
				return cfg, "", nil
			}
			dir = filepath.Join(home, ".config")
		}
		path = filepath.Join(dir, "kubetask", "client.yaml")
	}
	if path == "" {
		return cfg, "", errors.New("--client-config: give a file name")
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !required {
		return cfg, "", nil
	}
	if err != nil {
		return cfg, "", fmt.Errorf("reading the client config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, "", fmt.Errorf("client config %s: %w (it takes server, token, token-file, ca-file, insecure-skip-tls-verify)", path, err)
	}
	dir := filepath.Dir(path)
	for _, p := range []*string{&cfg.TokenFile, &cfg.CAFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	return cfg, path, nil
}

// client builds the API client of the connection. It warns on stderr, once,
// when the server's version differs from the CLI's in minor version.
func (conn *connection) client(stderr io.Writer) (*client.Client, error) {
	own := version.Get().Version
	opts := []client.Option{
		client.WithUserAgent("kubetask-cli/" + own),
		client.WithServerVersion(func(server string) {
			if w := version.Skew(own, server); w != "" {
				fmt.Fprintf(stderr, "warning: %s (server %s)\n", w, conn.Server)
			}
		}),
	}
	if conn.Token != "" {
		opts = append(opts, client.WithToken(conn.Token))
	}
	if conn.CAFile != "" {
		opts = append(opts, client.WithCAFile(conn.CAFile))
	}
	if conn.Insecure {
		opts = append(opts, client.WithInsecureSkipVerify())
	}
	c, err := client.New(conn.Server, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w (from %s)", err, conn.ServerFrom)
	}
	return c, nil
}

// connect resolves the connection of cmd and builds its client; errors are
// usage errors.
func connect(cmd *cobra.Command, f *clientFlags) (*client.Client, *connection, error) {
	conn, err := resolveConnection(f, cmd.Flags().Changed, os.Getenv)
	if err != nil {
		return nil, nil, &ExitError{Code: ExitUsage, Err: err}
	}
	c, err := conn.client(cmd.ErrOrStderr())
	if err != nil {
		return nil, nil, &ExitError{Code: ExitUsage, Err: err}
	}
	return c, &conn, nil
}

// hintError is an error with a message that says what to do about it.
type hintError struct {
	msg string
	err error
}

func (e *hintError) Error() string { return e.msg }
func (e *hintError) Unwrap() error { return e.err }

// explain rewrites an error of the API client into one that says what to fix:
// a missing or wrong token, an unreachable server, an unknown certificate
// authority. Other errors (the server's problem details) are returned as
// they are: they say it already.
func (conn *connection) explain(err error) error {
	if err == nil {
		return nil
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		if ce.StatusCode != 401 {
			return err
		}
		where := "with --token or $" + EnvToken
		if conn.ConfigFile != "" {
			where += " (or token/token-file in " + conn.ConfigFile + ")"
		}
		what := "the server wants a bearer token"
		if conn.Token != "" {
			what = "the server does not know the token from " + conn.TokenFrom
		}
		return &hintError{fmt.Sprintf("401 Unauthorized: %s: give the token printed by `kubetask serve` %s; "+
			"kubetask serve keeps it in tokens.yaml in its state directory (~/.local/state/kubetask/serve by default). Server: %s",
			what, where, ce.Problem.Detail), err}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	at := fmt.Sprintf("the kubetask server at %s (from %s)", conn.Server, conn.ServerFrom)
	var (
		unknownAuthority x509.UnknownAuthorityError
		verification     *tls.CertificateVerificationError
		hostname         x509.HostnameError
		opErr            *net.OpError
		dnsErr           *net.DNSError
	)
	switch {
	case errors.As(err, &unknownAuthority) || (errors.As(err, &verification) && !errors.As(err, &hostname)):
		return &hintError{fmt.Sprintf("cannot verify the certificate of %s: give its CA certificate with --ca-file, $%s or ca-file in the client config: %v",
			at, EnvCAFile, err), err}
	case errors.As(err, &hostname):
		return &hintError{fmt.Sprintf("the certificate of %s is not valid for that host name: use the name it was issued for: %v", at, err), err}
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return &hintError{fmt.Sprintf("%s speaks http, not https: use http:// in the address", at), err}
	case errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dnsErr) || errors.As(err, &opErr):
		return &hintError{fmt.Sprintf("cannot reach %s: start it with `kubetask serve`, or give its address with --server or $%s: %v",
			at, EnvServer, err), err}
	}
	return err
}
