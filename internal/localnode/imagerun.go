package localnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/sys/user"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/internal/container"
	"github.com/kubetask/kubetask/internal/podnet"
)

// imageRun is how a container runs from a loaded image: what the kubelet asks
// the runtime for and the runtime derives from the image's config.
type imageRun struct {
	argv []string
	env  []string
	dir  string
	user container.User
}

// imageFiles are the image's /etc/passwd and /etc/group (nil when it has none).
type imageFiles struct {
	passwd, group []byte
}

// readImageFiles reads /etc/passwd and /etc/group of an unpacked image, resolving
// links inside it.
func readImageFiles(rootfs string) imageFiles {
	read := func(p string) []byte {
		f, err := securejoin.SecureJoin(rootfs, p)
		if err != nil {
			return nil
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil
		}
		return b
	}
	return imageFiles{passwd: read("/etc/passwd"), group: read("/etc/group")}
}

// resolveImageRun combines the image's config with the container as the
// kubelet and containerd do:
//   - argv: the container's command (already $(VAR)-expanded) replaces the
//     image's Entrypoint and drops its Cmd; args replace Cmd; with neither, the
//     image's Entrypoint and Cmd;
//   - env: the image's Env, each variable the container sets (env holds the
//     container's resolved environment) replacing the image's value; HOME from
//     the user's passwd entry (else /) when neither sets it;
//   - working directory: the container's, else the image's, else /;
//   - user: runAsUser and runAsGroup of the container's securityContext, else of
//     the pod's, override the image's User (name or ID, looked up in the image's
//     /etc/passwd and /etc/group; a user without a group gets its passwd group,
//     else 0); groups are that group, the user's groups in /etc/group, the pod's
//     supplementalGroups and fsGroup. runAsNonRoot refuses a user that is root or
//     that cannot be verified (a name), as the kubelet does.
//
// Errors are *configError (CreateContainerConfigError) for the securityContext
// checks and plain errors (CreateContainerError) for the rest.
func resolveImageRun(cfg v1.Config, c *corev1.Container, pod *corev1.Pod, command, args []string, env []string, files imageFiles) (imageRun, error) {
	var r imageRun
	switch {
	case len(command) > 0:
		r.argv = append(slices.Clone(command), args...)
	case len(args) > 0:
		r.argv = append(slices.Clone(cfg.Entrypoint), args...)
	default:
		r.argv = append(slices.Clone(cfg.Entrypoint), cfg.Cmd...)
	}
	if len(r.argv) == 0 {
		return r, errors.New("failed to generate container spec: no command specified: the image has neither Entrypoint nor Cmd and the container neither command nor args")
	}

	r.dir = c.WorkingDir
	if r.dir == "" {
		r.dir = cfg.WorkingDir
	}
	if r.dir == "" {
		r.dir = "/"
	}

	u, err := resolveUser(cfg.User, c, pod, files)
	if err != nil {
		return r, err
	}
	r.user = container.User{UID: uint32(u.Uid), GID: uint32(u.Gid)} //nolint:gosec // IDs parsed as 32-bit by user.GetExecUser
	r.user.Groups = []uint32{r.user.GID}
	for _, g := range u.Sgids {
		r.user.Groups = appendNew(r.user.Groups, uint32(g)) //nolint:gosec // as above
	}
	if psc := pod.Spec.SecurityContext; psc != nil {
		for _, g := range psc.SupplementalGroups {
			r.user.Groups = appendNew(r.user.Groups, uint32(g)) //nolint:gosec // group IDs are 32-bit, checked by the API server
		}
		if psc.FSGroup != nil {
			r.user.Groups = appendNew(r.user.Groups, uint32(*psc.FSGroup)) //nolint:gosec // as above
		}
	}

	merged := &envList{}
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		merged.set(k, v)
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		merged.set(k, v)
	}
	if _, ok := merged.vals["HOME"]; !ok {
		merged.set("HOME", u.Home)
	}
	r.env = merged.list()
	return r, nil
}

func appendNew(s []uint32, v uint32) []uint32 {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

func resolveUser(imageUser string, c *corev1.Container, pod *corev1.Pod, files imageFiles) (*user.ExecUser, error) {
	var runAsUser, runAsGroup *int64
	var runAsNonRoot *bool
	if psc := pod.Spec.SecurityContext; psc != nil {
		runAsUser, runAsGroup, runAsNonRoot = psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			runAsUser = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			runAsGroup = sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			runAsNonRoot = sc.RunAsNonRoot
		}
	}
	spec := imageUser
	if runAsUser != nil {
		spec = strconv.FormatInt(*runAsUser, 10)
	}
	name, group, _ := strings.Cut(spec, ":")
	if runAsGroup != nil {
		group = strconv.FormatInt(*runAsGroup, 10)
	}
	if group != "" {
		spec = name + ":" + group
	} else {
		spec = name
	}
	if runAsNonRoot != nil && *runAsNonRoot && runAsUser == nil && name != "" {
		if _, err := strconv.Atoi(name); err != nil {
			return nil, &configError{fmt.Sprintf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (pod: %q, container: %s)", name, pod.Namespace+"/"+pod.Name, c.Name)}
		}
	}
	var passwd, grp io.Reader
	if files.passwd != nil {
		passwd = bytes.NewReader(files.passwd)
	}
	if files.group != nil {
		grp = bytes.NewReader(files.group)
	}
	u, err := user.GetExecUser(spec, &user.ExecUser{Home: "/"}, passwd, grp)
	if err != nil {
		return nil, fmt.Errorf("image user %q: %w", spec, err)
	}
	if runAsNonRoot != nil && *runAsNonRoot && u.Uid == 0 {
		return nil, &configError{fmt.Sprintf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", pod.Namespace+"/"+pod.Name, c.Name)}
	}
	return u, nil
}

// podEtcFiles writes the pod's /etc/hosts, /etc/resolv.conf (the host's) and
// /etc/hostname (the pod's name) into dir, once, and returns their mounts.
// /etc/hosts is the kubelet's for a pod with a network of its own (sb: its
// address names the pod), else a copy of the host's.
func podEtcFiles(dir, podName string, sb *podnet.Sandbox) ([]container.Mount, error) {
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return nil, err
	}
	hostsFrom, hosts := "/etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if sb != nil {
		hostsFrom, hosts = "", managedHosts(sb.IP.String(), podName)
	}
	var mounts []container.Mount
	for _, f := range []struct{ name, from, content string }{
		{name: "hosts", from: hostsFrom, content: hosts},
		{name: "resolv.conf", from: "/etc/resolv.conf"},
		{name: "hostname", content: podName + "\n"},
	} {
		p := filepath.Join(etc, f.name)
		if _, err := os.Stat(p); err != nil {
			data := []byte(f.content)
			if f.from != "" {
				if b, err := os.ReadFile(f.from); err == nil {
					data = b
				}
			}
			if err := os.WriteFile(p, data, 0o644); err != nil { //nolint:gosec // p is the pod's directory and a fixed name
				return nil, err
			}
		}
		mounts = append(mounts, container.Mount{HostPath: p, ContainerPath: "/etc/" + f.name})
	}
	return mounts, nil
}

// managedHosts is the kubelet's /etc/hosts of a pod whose address is ip.
func managedHosts(ip, podName string) string {
	return "# Kubernetes-managed hosts file.\n" +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\n" +
		"fe00::0\tip6-mcastprefix\n" +
		"fe00::1\tip6-allnodes\n" +
		"fe00::2\tip6-allrouters\n" +
		ip + "\t" + podName + "\n"
}

// podHostname is the host name the kubelet gives a pod's containers: its
// spec.hostname, else its name cut to 63 bytes without a trailing '-' or '.'.
func podHostname(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	h := pod.Name
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// containerSecurity is how a container of a loaded image is confined, as
// containerd turns its securityContext into an OCI spec: the default
// capabilities with the container's drops (ALL drops every one) and adds
// (names without the CAP_ prefix, as in Kubernetes), no_new_privs from
// allowPrivilegeEscalation: false, readOnlyRootFilesystem, privileged, and
// no seccomp filter for seccompProfile: Unconfined (the container's, else
// the pod's); any other profile is containerd's default (a Localhost
// profile is not loaded).
func containerSecurity(pod *corev1.Pod, c *corev1.Container) container.Security {
	var sec container.Security
	seccompProfile := (*corev1.SeccompProfile)(nil)
	if psc := pod.Spec.SecurityContext; psc != nil {
		seccompProfile = psc.SeccompProfile
	}
	if sc := c.SecurityContext; sc != nil && sc.SeccompProfile != nil {
		seccompProfile = sc.SeccompProfile
	}
	sec.SeccompUnconfined = seccompProfile != nil && seccompProfile.Type == corev1.SeccompProfileTypeUnconfined
	sc := c.SecurityContext
	if sc == nil {
		return sec
	}
	sec.Privileged = sc.Privileged != nil && *sc.Privileged
	sec.NoNewPrivileges = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	sec.ReadOnlyRootFilesystem = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	if sc.Capabilities == nil {
		return sec
	}
	caps := slices.Clone(container.DefaultCapabilities)
	capName := func(c corev1.Capability) string {
		n := strings.ToUpper(string(c))
		if !strings.HasPrefix(n, "CAP_") {
			n = "CAP_" + n
		}
		return n
	}
	for _, d := range sc.Capabilities.Drop {
		if strings.EqualFold(string(d), "ALL") {
			caps = []string{}
			break
		}
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == capName(d) })
	}
	for _, a := range sc.Capabilities.Add {
		if strings.EqualFold(string(a), "ALL") {
			caps = container.CapabilityNames()
			break
		}
		if n := capName(a); !slices.Contains(caps, n) {
			caps = append(caps, n)
		}
	}
	sec.Capabilities = caps
	return sec
}

// containerLimits are the container's resources.limits the node holds with a
// cgroup (memory and CPU).
func containerLimits(c *corev1.Container) container.Limits {
	var l container.Limits
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		l.MemoryBytes = q.Value()
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		l.MilliCPU = q.MilliValue()
	}
	return l
}
