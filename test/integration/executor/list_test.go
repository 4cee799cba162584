package executor

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/test/exectest"
)

// TestPodCachesListModes: an executor's pod cache lists its pods with a
// streaming list (a WATCH with sendInitialEvents) by default and with a
// plain LIST, then a WATCH, with Config.PlainList (kubetask run's); either
// way it sees a task to its outcome.
func TestPodCachesListModes(t *testing.T) {
	for name, plain := range map[string]bool{"streaming": false, "plain": true} {
		t.Run(name, func(t *testing.T) {
			env := clustertest.New(t)
			var mu sync.Mutex
			var queries []string // of the GETs of pods, in order
			rc := rest.CopyConfig(env.Config)
			rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/pods") {
						mu.Lock()
						queries = append(queries, r.URL.Query().Encode())
						mu.Unlock()
					}
					return rt.RoundTrip(r)
				})
			})
			events := exectest.NewEvents()
			ex, _ := exectest.StartExecutor(t, env, executor.Config{RESTConfig: rc, PlainList: plain, OnEvent: events.Add})
			exectest.Submit(t, ex, "one", exectest.LocalTask("one", "echo one", ""))
			events.WaitTerminal(t, 2*time.Minute, "one")
			mu.Lock()
			defer mu.Unlock()
			if len(queries) == 0 {
				t.Fatal("no request for pods")
			}
			first := queries[0]
			streaming := strings.Contains(first, "sendInitialEvents=true")
			isWatch := strings.Contains(first, "watch=")
			switch {
			case plain && (streaming || isWatch):
				t.Errorf("PlainList: the cache's first request is %q, want a LIST", first)
			case !plain && !streaming:
				t.Errorf("default: the cache's first request is %q, want a streaming list", first)
			}
			for _, q := range queries {
				if plain && strings.Contains(q, "sendInitialEvents=true") {
					t.Errorf("PlainList: a streaming list was requested: %q", q)
				}
			}
		})
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
