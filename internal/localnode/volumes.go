package localnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubetask/kubetask/internal/container"
)

// prepareVolumes materialises the pod's volumes as host directories (once per pod):
// emptyDir as an empty directory shared by the pod's containers, configMap, secret,
// downwardAPI and projected volumes as files written at pod start (not refreshed),
// hostPath as the host path itself. Other volume types are refused.
func (w *podWorker) prepareVolumes(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	paths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(w.dir, "volumes", v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			// World-writable whatever the umask, as the kubelet makes it: a
			// container from an image may run as any user.
			if err = os.MkdirAll(dir, 0o777); err == nil {
				err = os.Chmod(dir, 0o777)
			}
		case v.HostPath != nil:
			dir = v.HostPath.Path
			if t := v.HostPath.Type; t != nil {
				switch *t {
				case corev1.HostPathDirectoryOrCreate:
					err = os.MkdirAll(dir, 0o755)
				case corev1.HostPathFileOrCreate:
					if err = os.MkdirAll(filepath.Dir(dir), 0o755); err == nil {
						var f *os.File
						if f, err = os.OpenFile(dir, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
							err = f.Close()
						}
					}
				}
			}
			if err == nil {
				_, err = os.Stat(dir)
			}
		case v.ConfigMap != nil:
			err = w.writeConfigMap(ctx, pod, dir, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
		case v.Secret != nil:
			err = w.writeSecret(ctx, pod, dir, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
		case v.DownwardAPI != nil:
			err = writeDownward(pod, dir, v.DownwardAPI.Items)
		case v.Projected != nil:
			err = os.MkdirAll(dir, 0o755)
			for _, src := range v.Projected.Sources {
				if err != nil {
					break
				}
				switch {
				case src.ConfigMap != nil:
					err = w.writeConfigMap(ctx, pod, dir, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional)
				case src.Secret != nil:
					err = w.writeSecret(ctx, pod, dir, src.Secret.Name, src.Secret.Items, src.Secret.Optional)
				case src.DownwardAPI != nil:
					err = writeDownward(pod, dir, src.DownwardAPI.Items)
				case src.ServiceAccountToken != nil:
					w.writeToken(ctx, pod, dir, src.ServiceAccountToken)
				}
			}
		default:
			err = fmt.Errorf("this volume type is not supported by the kubetask local node")
		}
		if err != nil {
			return nil, fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err)
		}
		paths[v.Name] = dir
	}
	return paths, nil
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.Clean("/"+name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func selectKeys(data map[string][]byte, items []corev1.KeyToPath, optional bool, what string) (map[string][]byte, error) {
	if len(items) == 0 {
		return data, nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		d, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("configuration key %q not found in %s", it.Key, what)
		}
		out[it.Path] = d
	}
	return out, nil
}

func (w *podWorker) writeConfigMap(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, optional *bool) error {
	opt := optional != nil && *optional
	cm, err := w.p.cfg.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && opt {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	files, err := selectKeys(data, items, opt, "configmap "+name)
	if err != nil {
		return err
	}
	return writeFiles(dir, files)
}

func (w *podWorker) writeSecret(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, optional *bool) error {
	opt := optional != nil && *optional
	s, err := w.p.cfg.client.CoreV1().Secrets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && opt {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	files, err := selectKeys(s.Data, items, opt, "secret "+name)
	if err != nil {
		return err
	}
	return writeFiles(dir, files)
}

func writeDownward(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile) error {
	files := map[string][]byte{}
	for _, it := range items {
		if it.FieldRef == nil {
			continue
		}
		v, err := podFieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		files[it.Path] = []byte(v)
	}
	return writeFiles(dir, files)
}

// writeToken requests a bound service-account token. A failure is logged, not
// fatal: most commands run by tests never read it.
func (w *podWorker) writeToken(ctx context.Context, pod *corev1.Pod, dir string, src *corev1.ServiceAccountTokenProjection) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	tok, err := w.p.cfg.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		w.log.Warn("could not request service account token", "serviceAccount", sa, "err", err)
		return
	}
	_ = writeFiles(dir, map[string][]byte{src.Path: []byte(tok.Status.Token)})
}

// mountsFor maps a container's volumeMounts to bind mounts.
func mountsFor(c *corev1.Container, volumes map[string]string) ([]container.Mount, error) {
	var mounts []container.Mount
	for _, vm := range c.VolumeMounts {
		host, ok := volumes[vm.Name]
		if !ok {
			return nil, &configError{fmt.Sprintf("volume %q not found", vm.Name)}
		}
		// The subPath is resolved (and created) inside the volume by the
		// container's init, by handle: a link in the volume cannot lead out.
		mounts = append(mounts, container.Mount{HostPath: host, SubPath: vm.SubPath, ContainerPath: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	return mounts, nil
}
