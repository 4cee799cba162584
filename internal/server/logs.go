package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

type logsInput struct {
	ID        string `path:"id" doc:"The task ID."`
	Attempt   string `query:"attempt" doc:"The attempt (0 for the first); default the latest."`
	Container string `query:"container" doc:"The container; default the task's main container."`
	Follow    string `query:"follow" doc:"true: go on as the log grows, until it is complete."`
	Offset    string `query:"offset" doc:"Start at this byte of the log (default 0): resume with the bytes already read."`
	Limit     string `query:"limit" doc:"Send at most this many bytes (default: to the end of the log; with follow, the follow ends once it sent them): read a large log piece by piece."`
}

var logsParams = []string{"attempt", "container", "follow", "offset", "limit"}

// logChunk is how much of a log one archive read returns.
const logChunk = 64 << 10

// NotifyLog wakes the log follows of key at once, instead of at their next
// poll (LogPollInterval): call it after appending to the archive. Follows
// work without it.
func (s *Server) NotifyLog(key store.LogKey) { s.logWake.wake(key) }

func (s *Server) logs(ctx context.Context, in *logsInput) (*huma.StreamResponse, error) {
	if err := knownQuery(ctx, logsParams...); err != nil {
		return nil, err
	}
	var details []error
	bad := func(param, value, msg string) {
		details = append(details, &huma.ErrorDetail{Location: "query." + param, Value: value, Message: msg})
	}
	attempt, offset, limit, follow := int64(-1), int64(0), int64(0), false
	if in.Attempt != "" {
		n, ok := parseInt(in.Attempt)
		if !ok {
			bad("attempt", in.Attempt, "must be an attempt number: 0 for the first")
		}
		attempt = n
	}
	if in.Offset != "" {
		n, ok := parseInt(in.Offset)
		if !ok {
			bad("offset", in.Offset, "must be a byte offset: a whole number, 0 or more")
		}
		offset = n
	}
	if in.Limit != "" {
		n, ok := parseInt(in.Limit)
		if !ok || n < 1 {
			bad("limit", in.Limit, "must be a number of bytes: a whole number, 1 or more")
		}
		limit = n
	}
	switch in.Follow {
	case "", "false":
	case "true":
		follow = true
	default:
		bad("follow", in.Follow, "must be true or false")
	}
	if len(details) > 0 {
		return nil, badRequest(details)
	}
	rec, err := s.record(ctx, in.ID, ActionLogs)
	if err != nil {
		return nil, err
	}
	if s.cfg.Logs == nil {
		return nil, huma.Error501NotImplemented("this server keeps no log archive")
	}
	if attempt < 0 {
		attempt = int64(rec.Attempt)
	}
	if attempt > int64(rec.Attempt) {
		return nil, huma.Error404NotFound(fmt.Sprintf("task %q has no attempt %d: its attempts are 0 to %d", rec.ID, attempt, rec.Attempt),
			&huma.ErrorDetail{Location: "query.attempt", Value: in.Attempt, Message: fmt.Sprintf("must be 0 to %d", rec.Attempt)})
	}
	var t task.Task
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		return nil, s.internal("decoding the document of task "+rec.ID, err)
	}
	t.Default()
	containers := slices.Clone(t.Spec.Logs.Containers)
	keys, err := s.cfg.Logs.LogKeys(ctx, rec.ID)
	if err != nil {
		return nil, s.internal("listing the logs of task "+rec.ID, err)
	}
	for _, k := range keys {
		if k.Attempt == int(attempt) && !slices.Contains(containers, k.Container) {
			containers = append(containers, k.Container)
		}
	}
	container := in.Container
	if container == "" {
		container = t.Spec.MainContainer
	}
	if !slices.Contains(containers, container) {
		return nil, huma.Error404NotFound(fmt.Sprintf("task %q keeps no log of container %q: it keeps %s (spec.logs.containers)", rec.ID, container, strings.Join(containers, ", ")),
			&huma.ErrorDetail{Location: "query.container", Value: container, Message: "must be one of " + strings.Join(containers, ", ")})
	}
	key := store.LogKey{TaskID: rec.ID, Attempt: int(attempt), Container: container}
	_, info, err := s.cfg.Logs.ReadLog(ctx, key, 0, 0)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, s.internal("reading the log of task "+rec.ID, err)
	}
	if offset > info.Size && (!follow || info.Complete) {
		return nil, huma.Error400BadRequest(fmt.Sprintf("offset %d is beyond the log's %d bytes", offset, info.Size),
			&huma.ErrorDetail{Location: "query.offset", Value: in.Offset, Message: fmt.Sprintf("must be at most %d", info.Size)})
	}
	release := func() {}
	if follow {
		if release, err = s.openStream(requestFrom(ctx), CallerFrom(ctx), "logs", rec.Namespace); err != nil {
			return nil, err
		}
	}
	access := s.access(ctx, ActionLogs, rec.Namespace)
	return &huma.StreamResponse{Body: func(hctx huma.Context) {
		defer release()
		s.streamLog(hctx, access, key, info, offset, limit, follow)
	}}, nil
}

// logEnd is why a log response ended.
type logEnd int

const (
	logDone   logEnd = iota // the end of what there is to send
	logResume               // the server stopped early: the client should resume
)

// streamLog writes the log from offset and, with follow, goes on until it is
// complete; with a limit (0: none) it stops after that many bytes. The
// archive is polled every LogPollInterval; NotifyLog wakes the follow
// earlier. A follow ends (to be resumed) once access is no longer allowed
// (checked every AuthRecheck).
func (s *Server) streamLog(hctx huma.Context, access *streamAccess, key store.LogKey, info store.LogInfo, offset, limit int64, follow bool) {
	ctx := hctx.Context()
	_, w := humago.Unwrap(hctx)
	rc := http.NewResponseController(w)
	h := []string{api.HeaderLogSize, api.HeaderLogComplete, api.HeaderLogTruncated}
	hctx.SetHeader("Content-Type", "text/plain; charset=utf-8")
	hctx.SetHeader("X-Content-Type-Options", "nosniff")
	hctx.SetHeader("Cache-Control", "no-cache")
	hctx.SetHeader("Trailer", strings.Join(append(h, api.HeaderLogResume), ", "))
	setLogHeaders(hctx.SetHeader, info)
	hctx.SetStatus(http.StatusOK)
	end, last := s.copyLog(ctx, w, rc, access, key, offset, limit, follow)
	// Trailers: the archive as the response ends.
	setLogHeaders(hctx.SetHeader, last)
	hctx.SetHeader(api.HeaderLogResume, strconv.FormatBool(end == logResume))
}

func setLogHeaders(set func(string, string), info store.LogInfo) {
	set(api.HeaderLogSize, strconv.FormatInt(info.Size, 10))
	set(api.HeaderLogComplete, strconv.FormatBool(info.Complete))
	set(api.HeaderLogTruncated, strconv.FormatBool(info.Truncated))
}

func (s *Server) copyLog(ctx context.Context, w io.Writer, rc *http.ResponseController, access *streamAccess, key store.LogKey, pos, limit int64, follow bool) (logEnd, store.LogInfo) {
	var info store.LogInfo
	var wake <-chan struct{}
	var pollC, endC, recheck <-chan time.Time
	if follow {
		var stopRecheck func()
		recheck, stopRecheck = access.recheck()
		defer stopRecheck()
		poll := s.cfg.Clock.NewTicker(s.cfg.LogPollInterval)
		defer poll.Stop()
		end := s.cfg.Clock.NewTimer(s.cfg.StreamTimeout)
		defer end.Stop()
		pollC, endC = poll.C(), end.C()
		s.logWake.add(key)
		defer s.logWake.remove(key)
	}
	var overSince time.Time // when the attempt was first seen over while its log was not complete
	left := limit           // bytes still to send when limit > 0
	for {
		if follow {
			wake = s.logWake.wait(key) // before the read: a wake during it is not lost
		}
		n := logChunk
		if limit > 0 {
			n = int(min(int64(n), left))
		}
		data, cur, err := s.cfg.Logs.ReadLog(ctx, key, pos, n)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case errors.Is(err, store.ErrLogOffset):
			// A follow from beyond the archived end: nothing yet; the
			// bytes come when the log reaches pos (or it ends short).
			info = cur
		case err != nil:
			if ctx.Err() == nil {
				s.log.Error("reading a log", "task", key.TaskID, "attempt", key.Attempt, "container", key.Container, "err", err)
			}
			return logResume, info
		default:
			info = cur
		}
		if len(data) > 0 {
			s.pushWriteDeadline(rc) // a client that reads nothing for WriteTimeout is dropped
			if _, err := w.Write(data); err != nil {
				return logResume, info
			}
			pos += int64(len(data))
			left -= int64(len(data))
			overSince = time.Time{}
			if len(data) == n && (limit == 0 || left > 0) {
				continue // more is archived already
			}
		}
		s.pushWriteDeadline(rc)
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return logResume, info
		}
		if (info.Complete && pos >= info.Size) || !follow || (limit > 0 && left <= 0) {
			return logDone, info
		}
		if len(data) == 0 && s.attemptOver(ctx, key) {
			// The attempt ended and its log is not complete: whatever
			// captures it gets LogWait to finish, then the follow ends.
			now := s.cfg.Clock.Now()
			if overSince.IsZero() {
				overSince = now
			} else if now.Sub(overSince) >= s.cfg.LogWait {
				return logDone, info
			}
		}
		select {
		case <-wake:
		case <-pollC:
		case <-endC:
			return logResume, info
		case <-recheck:
			if !access.stillAllowed(ctx) {
				return logResume, info // the client's next request is refused
			}
		case <-s.stopping:
			return logResume, info
		case <-ctx.Done():
			return logResume, info
		}
	}
}

// attemptOver reports whether the attempt of key has an outcome (or the task
// went on to another attempt, or ended).
func (s *Server) attemptOver(ctx context.Context, key store.LogKey) bool {
	rec, err := s.cfg.Executor.Get(ctx, key.TaskID)
	if err != nil {
		return errors.Is(err, store.ErrNotFound)
	}
	if rec.Terminal || rec.Attempt > key.Attempt {
		return true
	}
	return slices.ContainsFunc(rec.Attempts, func(o store.AttemptOutcome) bool { return o.Attempt == key.Attempt })
}

// wakers wakes the follows of a log when NotifyLog says it grew. A key is
// kept while a follow of it runs.
type wakers struct {
	mu sync.Mutex
	m  map[store.LogKey]*waker
}

type waker struct {
	ch      chan struct{}
	readers int
}

func newWakers() *wakers { return &wakers{m: map[store.LogKey]*waker{}} }

func (w *wakers) add(key store.LogKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wk, ok := w.m[key]
	if !ok {
		wk = &waker{ch: make(chan struct{})}
		w.m[key] = wk
	}
	wk.readers++
}

func (w *wakers) remove(key store.LogKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wk, ok := w.m[key]; ok {
		if wk.readers--; wk.readers <= 0 {
			delete(w.m, key)
		}
	}
}

// wait returns a channel closed by the next wake of key (added before).
func (w *wakers) wait(key store.LogKey) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wk, ok := w.m[key]; ok {
		return wk.ch
	}
	return nil
}

func (w *wakers) wake(key store.LogKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wk, ok := w.m[key]; ok {
		close(wk.ch)
		wk.ch = make(chan struct{})
	}
}
