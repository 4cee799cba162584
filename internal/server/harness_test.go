package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// harness is a server over the real executor (not started: Submit, Get and
// Cancel work without it) with a fake clientset and a memory store, served by
// httptest.
type harness struct {
	t      *testing.T
	store  store.Store
	exec   *countingExecutor
	client *fake.Clientset
	logs   *fakeLogs
	srv    *server.Server
	ts     *httptest.Server
}

// countingExecutor is the real executor, counting the Submits that reach it
// (bad input must reach none) and the reads of a record.
type countingExecutor struct {
	*executor.Executor
	submits atomic.Int32
	gets    atomic.Int32
}

func (c *countingExecutor) Get(ctx context.Context, id string) (store.Record, error) {
	c.gets.Add(1)
	return c.Executor.Get(ctx, id)
}

func (c *countingExecutor) SubmitCreated(ctx context.Context, id string, t *task.Task, opts ...executor.SubmitOption) (store.Record, bool, error) {
	c.submits.Add(1)
	return c.Executor.SubmitCreated(ctx, id, t, opts...)
}

type nopExec struct{}

func (nopExec) Exec(context.Context, string, string, string, []string, io.Writer, io.Writer) error {
	return nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newHarness(t *testing.T, mod func(*server.Config)) *harness {
	t.Helper()
	return newHarnessOn(t, store.NewMemory(), mod)
}

// newHarnessOn is newHarness over st (closed when t ends) instead of a
// memory store.
func newHarnessOn(t *testing.T, st store.Store, mod func(*server.Config)) *harness {
	t.Helper()
	return newHarnessWith(t, st, nil, mod)
}

// newHarnessWith is newHarnessOn whose executor's configuration exMod
// changes first.
func newHarnessWith(t *testing.T, st store.Store, exMod func(*executor.Config), mod func(*server.Config)) *harness {
	t.Helper()
	t.Cleanup(func() { _ = st.Close() })
	h := &harness{t: t, store: st, client: fake.NewClientset(), logs: newFakeLogs()}
	var srv atomic.Pointer[server.Server]
	exCfg := executor.Config{
		Client: h.client, Execer: nopExec{}, InstanceID: "srv", Store: h.store, Logger: quiet(),
		OnEvent: func(ev executor.Event) {
			if s := srv.Load(); s != nil {
				s.Publish(ev)
			}
		},
	}
	if exMod != nil {
		exMod(&exCfg)
	}
	ex, err := executor.New(exCfg)
	if err != nil {
		t.Fatal(err)
	}
	h.exec = &countingExecutor{Executor: ex}
	cfg := server.Config{
		Executor: h.exec, Pager: pagerOf(h.store), Logs: h.logs, Client: h.client, Logger: quiet(),
		LogPollInterval: 10 * time.Millisecond, LogWait: 50 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.Store(s)
	h.srv = s
	h.ts = httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.CloseStreams()
		h.ts.Close()
	})
	return h
}

// do sends a request and returns the response with its body read.
func (h *harness) do(method, path string, body []byte, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.ts.URL+path, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if body == nil {
		req.Body = http.NoBody
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	hc := *h.ts.Client()
	// The API never redirects: a redirect is answered, not followed.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, b
}

// submit submits doc (YAML) to namespace ns and returns the task.
func (h *harness) submit(ns, doc string, hdr ...string) (*http.Response, api.Task) {
	h.t.Helper()
	resp, b := h.do(http.MethodPost, api.Prefix+"/namespaces/"+ns+"/tasks", []byte(doc), append([]string{"Content-Type", "application/yaml"}, hdr...)...)
	var out api.Task
	if resp.StatusCode < 300 {
		if err := json.Unmarshal(b, &out); err != nil {
			h.t.Fatalf("decoding %s: %v", b, err)
		}
	}
	return resp, out
}

func (h *harness) mustSubmit(ns, doc string, hdr ...string) api.Task {
	h.t.Helper()
	resp, out := h.submit(ns, doc, hdr...)
	if resp.StatusCode != http.StatusCreated {
		h.t.Fatalf("submit: %s", resp.Status)
	}
	return out
}

func problemOf(t *testing.T, b []byte) api.Problem {
	t.Helper()
	var p api.Problem
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("not problem+json: %v: %s", err, b)
	}
	return p
}

// finish makes a task terminal in the store, as the executor would.
func (h *harness) finish(id, phase, reason string) {
	h.t.Helper()
	ctx := context.Background()
	rec, err := h.store.Get(ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	code := int32(0)
	now := time.Now()
	rec.Phase, rec.Reason, rec.Terminal, rec.ExitCode, rec.PodCreated = phase, reason, true, &code, true
	rec.Attempts = append(rec.Attempts, store.AttemptOutcome{Attempt: rec.Attempt, Pod: "p", Phase: phase, Reason: reason, ExitCode: &code, FinishedAt: now, ObservedAt: now})
	if _, err := h.store.Update(ctx, rec); err != nil {
		h.t.Fatal(err)
	}
}

func taskDoc(name string, labels ...string) string {
	var l string
	if len(labels) > 0 {
		l = "\n  labels:"
		for i := 0; i+1 < len(labels); i += 2 {
			l += fmt.Sprintf("\n    %s: %s", labels[i], labels[i+1])
		}
	}
	return fmt.Sprintf(`apiVersion: kubetask.dev/v1alpha1
kind: Task
metadata:
  name: %s%s
spec:
  template:
    spec:
      containers:
      - name: main
        image: busybox:1.37
        command: [echo, hi]
`, name, l)
}

// pagerOf is the store's Pager, or, while the store has none yet, a fake
// over its List.
func pagerOf(st store.Store) store.Pager {
	if p, ok := st.(store.Pager); ok {
		return p
	}
	return &fakePager{st: st}
}

// fakePager pages a store's records newest first with keyset tokens (the
// contract of store.Pager) by listing them all: enough for tests.
type fakePager struct{ st store.Store }

func (p *fakePager) Page(ctx context.Context, o store.PageOptions) (store.Page, error) {
	recs, err := p.st.List(ctx, store.ListOptions{})
	if err != nil {
		return store.Page{}, err
	}
	sort.Slice(recs, func(i, j int) bool {
		if !recs[i].CreatedAt.Equal(recs[j].CreatedAt) {
			return recs[i].CreatedAt.After(recs[j].CreatedAt)
		}
		return recs[i].ID > recs[j].ID
	})
	filters := fmt.Sprint(o.Namespace, o.Namespaces, o.Phase, o.Reason, o.NamePrefix, o.Labels, o.CreatedAfter, o.CreatedBefore, o.Terminal)
	var afterT time.Time
	var afterID string
	if o.Continue != "" {
		raw, err := base64.RawURLEncoding.DecodeString(o.Continue)
		parts := strings.SplitN(string(raw), "\x00", 3)
		if err != nil || len(parts) != 3 || parts[2] != filters {
			return store.Page{}, store.ErrBadContinue
		}
		if afterT, err = time.Parse(time.RFC3339Nano, parts[0]); err != nil {
			return store.Page{}, store.ErrBadContinue
		}
		afterID = parts[1]
	}
	limit := o.Limit
	if limit == 0 {
		limit = store.DefaultPageSize
	}
	var out store.Page
	for _, r := range recs {
		if o.Continue != "" && (r.CreatedAt.After(afterT) || (r.CreatedAt.Equal(afterT) && r.ID >= afterID)) {
			continue
		}
		if (o.Namespace != "" && r.Namespace != o.Namespace) || (len(o.Namespaces) > 0 && !slices.Contains(o.Namespaces, r.Namespace)) || (o.Phase != "" && r.Phase != o.Phase) || (o.Reason != "" && r.Reason != o.Reason) ||
			!strings.HasPrefix(r.Name, o.NamePrefix) || (o.Terminal != nil && r.Terminal != *o.Terminal) ||
			(!o.CreatedAfter.IsZero() && r.CreatedAt.Before(o.CreatedAfter)) || (!o.CreatedBefore.IsZero() && !r.CreatedAt.Before(o.CreatedBefore)) {
			continue
		}
		ok := true
		for k, v := range o.Labels {
			ok = ok && r.Labels[k] == v
		}
		if !ok {
			continue
		}
		if len(out.Records) == limit {
			last := out.Records[limit-1]
			out.Continue = base64.RawURLEncoding.EncodeToString([]byte(last.CreatedAt.Format(time.RFC3339Nano) + "\x00" + last.ID + "\x00" + filters))
			break
		}
		out.Records = append(out.Records, r)
	}
	return out, nil
}

// fakeLogs is a store.Logs in memory.
type fakeLogs struct {
	mu   sync.Mutex
	logs map[store.LogKey]*fakeLog
}

type fakeLog struct {
	data                []byte
	complete, truncated bool
}

func newFakeLogs() *fakeLogs { return &fakeLogs{logs: map[store.LogKey]*fakeLog{}} }

func (f *fakeLogs) AppendLog(_ context.Context, key store.LogKey, a store.LogAppend) (store.LogInfo, error) {
	offset, data, complete := a.Offset, a.Data, a.Complete
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.logs[key]
	if !ok {
		l = &fakeLog{}
		f.logs[key] = l
	}
	if offset != int64(len(l.data)) {
		return store.LogInfo{}, store.ErrLogOffset
	}
	l.data = append(l.data, data...)
	l.complete = l.complete || complete
	return store.LogInfo{Size: int64(len(l.data)), Complete: l.complete, Truncated: l.truncated}, nil
}

func (f *fakeLogs) ReadLog(_ context.Context, key store.LogKey, offset int64, limit int) ([]byte, store.LogInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.logs[key]
	if !ok {
		return nil, store.LogInfo{}, store.ErrNotFound
	}
	info := store.LogInfo{Size: int64(len(l.data)), Complete: l.complete, Truncated: l.truncated}
	if offset > int64(len(l.data)) {
		return nil, info, store.ErrLogOffset // as the stores do
	}
	if offset == int64(len(l.data)) {
		return nil, info, nil
	}
	end := min(int64(len(l.data)), offset+int64(limit))
	return slices.Clone(l.data[offset:end]), info, nil
}

func (f *fakeLogs) LogKeys(_ context.Context, id string) ([]store.LogKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.LogKey
	for k := range f.logs {
		if k.TaskID == id {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Attempt != out[j].Attempt {
			return out[i].Attempt < out[j].Attempt
		}
		return out[i].Container < out[j].Container
	})
	return out, nil
}

func (f *fakeLogs) append(t *testing.T, key store.LogKey, data string, complete bool) {
	t.Helper()
	_, info, err := f.ReadLog(context.Background(), key, 0, 0)
	if err != nil && err != store.ErrNotFound { //nolint:errorlint // the fake returns it as is
		t.Fatal(err)
	}
	if _, err := f.AppendLog(context.Background(), key, store.LogAppend{Offset: info.Size, Data: []byte(data), Complete: complete}); err != nil {
		t.Fatal(err)
	}
}
