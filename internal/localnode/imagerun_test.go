package localnode

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubetask/kubetask/internal/container"
)

func TestResolveImageRun(t *testing.T) {
	files := imageFiles{
		passwd: []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"),
		group:  []byte("root:x:0:\napp:x:1001:\nstaff:x:50:app\nother:x:60:root\n"),
	}
	image := v1.Config{Entrypoint: []string{"/entry"}, Cmd: []string{"default", "cmd"}, Env: []string{"PATH=/image/bin", "A=image", "B=image"}, WorkingDir: "/srv", User: "app"}
	root := container.User{UID: 0, GID: 0, Groups: []uint32{0, 60}}
	app := container.User{UID: 1000, GID: 1001, Groups: []uint32{1001, 50}}
	type tc struct {
		image         v1.Config
		command, args []string
		env           []string
		c             corev1.Container
		podSC         *corev1.PodSecurityContext
		files         *imageFiles
		want          imageRun
		wantErr       string
		configErr     bool
	}
	appEnv := []string{"PATH=/image/bin", "A=image", "B=image", "HOME=/home/app"}
	for name, tc := range map[string]tc{
		"the image's entrypoint and cmd": {
			image: image,
			want:  imageRun{argv: []string{"/entry", "default", "cmd"}, env: appEnv, dir: "/srv", user: app},
		},
		"args replace cmd": {
			image: image, args: []string{"a1", "a2"},
			want: imageRun{argv: []string{"/entry", "a1", "a2"}, env: appEnv, dir: "/srv", user: app},
		},
		"command replaces entrypoint and drops cmd": {
			image: image, command: []string{"/bin/other"},
			want: imageRun{argv: []string{"/bin/other"}, env: appEnv, dir: "/srv", user: app},
		},
		"command and args": {
			image: image, command: []string{"/bin/other"}, args: []string{"x"},
			want: imageRun{argv: []string{"/bin/other", "x"}, env: appEnv, dir: "/srv", user: app},
		},
		"no entrypoint: cmd alone": {
			image: v1.Config{Cmd: []string{"sh"}},
			want:  imageRun{argv: []string{"sh"}, env: []string{"HOME=/root"}, dir: "/", user: root},
		},
		"nothing to run": {
			image:   v1.Config{Env: []string{"A=1"}},
			wantErr: "no command specified",
		},
		"the container's env wins, new variables follow the image's": {
			image: image, env: []string{"HOSTNAME=pod", "B=pod", "HOME=/h"},
			want: imageRun{argv: []string{"/entry", "default", "cmd"}, env: []string{"PATH=/image/bin", "A=image", "B=pod", "HOSTNAME=pod", "HOME=/h"}, dir: "/srv", user: app},
		},
		"the container's working directory wins": {
			image: image, c: corev1.Container{WorkingDir: "/work"},
			want: imageRun{argv: []string{"/entry", "default", "cmd"}, env: appEnv, dir: "/work", user: app},
		},
		"numeric user and group": {
			image: v1.Config{Cmd: []string{"x"}, User: "123:456"},
			want:  imageRun{argv: []string{"x"}, env: []string{"HOME=/"}, dir: "/", user: container.User{UID: 123, GID: 456, Groups: []uint32{456}}},
		},
		"numeric user of passwd gets its group and home": {
			image: v1.Config{Cmd: []string{"x"}, User: "1000"},
			want:  imageRun{argv: []string{"x"}, env: []string{"HOME=/home/app"}, dir: "/", user: app},
		},
		"user:group names": {
			image: v1.Config{Cmd: []string{"x"}, User: "app:staff"},
			want:  imageRun{argv: []string{"x"}, env: []string{"HOME=/home/app"}, dir: "/", user: container.User{UID: 1000, GID: 50, Groups: []uint32{50}}},
		},
		"runAsUser and runAsGroup of the pod override the image": {
			image: image, podSC: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](2000), RunAsGroup: ptr.To[int64](3000), SupplementalGroups: []int64{4000}, FSGroup: ptr.To[int64](5000)},
			want: imageRun{argv: []string{"/entry", "default", "cmd"}, env: []string{"PATH=/image/bin", "A=image", "B=image", "HOME=/"}, dir: "/srv", user: container.User{UID: 2000, GID: 3000, Groups: []uint32{3000, 4000, 5000}}},
		},
		"the container's securityContext overrides the pod's": {
			image: image, podSC: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](2000)},
			c:    corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}},
			want: imageRun{argv: []string{"/entry", "default", "cmd"}, env: []string{"PATH=/image/bin", "A=image", "B=image", "HOME=/root"}, dir: "/srv", user: root},
		},
		// An explicit group drops the user's groups of /etc/group, as runc resolves "user:group".
		"runAsGroup alone keeps the image's user": {
			image: image, c: corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: ptr.To[int64](7)}},
			want: imageRun{argv: []string{"/entry", "default", "cmd"}, env: appEnv, dir: "/srv", user: container.User{UID: 1000, GID: 7, Groups: []uint32{7}}},
		},
		"runAsNonRoot refuses root": {
			image: v1.Config{Cmd: []string{"x"}}, podSC: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
			wantErr: "container has runAsNonRoot and image will run as root", configErr: true,
		},
		"runAsNonRoot cannot verify a user name": {
			image: image, podSC: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
			wantErr: "image has non-numeric user (app), cannot verify user is non-root", configErr: true,
		},
		"runAsNonRoot with a runAsUser": {
			image: image, podSC: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}, c: corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000)}},
			want: imageRun{argv: []string{"/entry", "default", "cmd"}, env: appEnv, dir: "/srv", user: app},
		},
		"a user name the image does not have": {
			image: v1.Config{Cmd: []string{"x"}, User: "nobody"}, files: &imageFiles{},
			wantErr: `image user "nobody"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := files
			if tc.files != nil {
				f = *tc.files
			}
			c := tc.c
			c.Name = "main"
			pod := testPod("p", c)
			pod.Spec.SecurityContext = tc.podSC
			got, err := resolveImageRun(tc.image, &c, pod, tc.command, tc.args, tc.env, f)
			if tc.wantErr != "" {
				var ce *configError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.As(err, &ce) != tc.configErr {
					t.Fatalf("err = %v (config error: %v); want %q (config error: %v)", err, errors.As(err, &ce), tc.wantErr, tc.configErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(imageRun{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodHostname(t *testing.T) {
	long := strings.Repeat("a", 62) + "-.b"
	for _, tt := range []struct{ name, hostname, want string }{
		{name: "web-0", want: "web-0"},
		{name: "web-0", hostname: "db", want: "db"},
		{name: long, want: strings.Repeat("a", 62)},
		{name: strings.Repeat("x", 70), want: strings.Repeat("x", 63)},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tt.name}, Spec: corev1.PodSpec{Hostname: tt.hostname}}
		if got := podHostname(p); got != tt.want {
			t.Errorf("podHostname(%q, %q) = %q, want %q", tt.name, tt.hostname, got, tt.want)
		}
	}
}
