// Package clienttest runs kubetask's HTTP API in memory for tests of code
// that uses pkg/client: the real server (internal/server) over the real
// executor, not started, with a fake Kubernetes clientset and a memory store.
//
// Submit, Get, List, Cancel, Rerun, watches and logs all work, but no task
// runs: a test decides what happens to a task with SetState, Finish and
// AppendLog, which change the store and publish the events the executor
// would. Server URLs are httptest's (loopback).
package clienttest

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

// Server is an API server for a test. Its fields are for reading.
type Server struct {
	// URL is the server's base URL (give it to client.New).
	URL string
	// API is the server; Store its tasks and log archive; Kube the fake
	// clientset of its executor (create pod events in it).
	API   *server.Server
	Store store.Store
	Kube  *fake.Clientset

	ts       *httptest.Server
	mu       sync.Mutex
	requests []string
}

// Options configure New.
type Options struct {
	// TLS serves HTTPS with httptest's certificate (see CAPEM).
	TLS bool
	// Configure, when set, changes the server's configuration before the
	// server is built (Auth, EventBuffer, StreamTimeout, ...).
	Configure func(*server.Config)
}

// New starts a server and stops it when the test ends. Log follows poll the
// archive every 10ms and wait 50ms for the log of a finished attempt.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &Server{Store: store.NewMemory(), Kube: fake.NewClientset()}
	var srv atomic.Pointer[server.Server]
	ex, err := executor.New(executor.Config{
		Client: s.Kube, Execer: nopExec{}, InstanceID: "clienttest", Store: s.Store, Logger: quiet,
		OnEvent: func(ev executor.Event) {
			if p := srv.Load(); p != nil {
				p.Publish(ev)
			}
		},
	})
	if err != nil {
		t.Fatalf("clienttest: executor: %v", err)
	}
	cfg := server.Config{
		Executor: ex, Pager: s.Store.(store.Pager), Logs: s.Store.(store.Logs), Client: s.Kube, Logger: quiet,
		LogPollInterval: 10 * time.Millisecond, LogWait: 50 * time.Millisecond,
	}
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	api, err := server.New(cfg)
	if err != nil {
		t.Fatalf("clienttest: server: %v", err)
	}
	srv.Store(api)
	s.API = api
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		api.Handler().ServeHTTP(w, r)
	})
	if opts.TLS {
		s.ts = httptest.NewTLSServer(h)
	} else {
		s.ts = httptest.NewServer(h)
	}
	s.URL = s.ts.URL
	t.Cleanup(s.Close)
	return s
}

// Close ends the streams and stops the server (New arranges it at the end of
// the test).
func (s *Server) Close() {
	s.API.CloseStreams()
	s.ts.Close()
}

// CAPEM returns the PEM certificate a client must trust to reach a TLS
// server.
func (s *Server) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.ts.Certificate().Raw})
}

// Requests returns "METHOD /path" of each request received so far, in order.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

// WaitForRequest waits until a request "METHOD /path" arrived (the test fails
// after 10s).
func (s *Server) WaitForRequest(t testing.TB, req string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		for _, r := range s.Requests() {
			if r == req {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("clienttest: no request %q within 10s; got %q", req, s.Requests())
		}
		time.Sleep(time.Millisecond)
	}
}

// Publish delivers an event to the watches, as the executor does.
func (s *Server) Publish(ev executor.Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	s.API.Publish(ev)
}

// SetState changes the state of task id's current attempt (podCreated: its
// pod exists now) and publishes a State event.
func (s *Server) SetState(t testing.TB, id, phase, reason, message string, podCreated bool) {
	t.Helper()
	rec := s.update(t, id, func(rec *store.Record) {
		rec.Phase, rec.Reason, rec.Message = phase, reason, message
		rec.PodCreated = rec.PodCreated || podCreated
	})
	s.Publish(executor.Event{ID: id, Attempt: rec.Attempt, Type: executor.EventState, Phase: phase, Reason: reason, Message: message})
}

// Finish records the outcome of task id's current attempt and, when retry is
// false, makes it the task's final outcome; with retry the task goes on to
// its next attempt (Pending). It publishes AttemptFinished (Terminal unless
// retry), as the executor does.
func (s *Server) Finish(t testing.TB, id, phase, reason, message string, exitCode int32, retry bool) {
	t.Helper()
	now := time.Now()
	var finished int
	rec := s.update(t, id, func(rec *store.Record) {
		finished = rec.Attempt
		rec.Attempts = append(rec.Attempts, store.AttemptOutcome{
			Attempt: rec.Attempt, Pod: fmt.Sprintf("%s-%d", rec.Name, rec.Attempt), Phase: phase, Reason: reason, Message: message,
			ExitCode: &exitCode, Retryable: retry, FinishedAt: now, ObservedAt: now,
		})
		if retry {
			rec.Attempt++
			rec.Phase, rec.Reason, rec.Message, rec.ExitCode, rec.PodCreated = "Pending", "Retrying", "", nil, false
			return
		}
		rec.Phase, rec.Reason, rec.Message, rec.ExitCode, rec.Terminal, rec.PodCreated = phase, reason, message, &exitCode, true, true
	})
	s.Publish(executor.Event{
		ID: id, Attempt: finished, Type: executor.EventAttemptFinished, Phase: phase, Reason: reason, Message: message,
		ExitCode: &exitCode, Terminal: rec.Terminal,
	})
}

func (s *Server) update(t testing.TB, id string, change func(*store.Record)) store.Record {
	t.Helper()
	ctx := context.Background()
	rec, err := s.Store.Get(ctx, id)
	if err != nil {
		t.Fatalf("clienttest: task %s: %v", id, err)
	}
	change(&rec)
	rec, err = s.Store.Update(ctx, rec)
	if err != nil {
		t.Fatalf("clienttest: updating task %s: %v", id, err)
	}
	return rec
}

// AppendLog appends data to the archived log of a container of an attempt
// of task id (complete: it is the log's end) and wakes the follows.
func (s *Server) AppendLog(t testing.TB, id string, attempt int, container, data string, complete bool) {
	t.Helper()
	ctx := context.Background()
	logs := s.Store.(store.Logs)
	key := store.LogKey{TaskID: id, Attempt: attempt, Container: container}
	var size int64
	if _, info, err := logs.ReadLog(ctx, key, 0, 0); err == nil {
		size = info.Size
	}
	if _, err := logs.AppendLog(ctx, key, store.LogAppend{Offset: size, Data: []byte(data), Complete: complete}); err != nil {
		t.Fatalf("clienttest: appending to the log of %s: %v", key, err)
	}
	s.API.NotifyLog(key)
}

type nopExec struct{}

func (nopExec) Exec(context.Context, string, string, string, []string, io.Writer, io.Writer) error {
	return nil
}
