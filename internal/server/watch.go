package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/executor"
	"github.com/kubetask/kubetask/pkg/store"
)

type watchInput struct {
	Namespace   string `query:"namespace" doc:"Only events of tasks in this namespace."`
	Phase       string `query:"phase" doc:"Only events whose phase is this: Pending, Running, Succeeded or Failed."`
	Reason      string `query:"reason" doc:"Only events with this reason."`
	NamePrefix  string `query:"namePrefix" doc:"Only events of tasks whose name starts with this."`
	Labels      string `query:"labels" doc:"Only events of tasks with these labels (key=value,...; equality only)."`
	Cluster     string `query:"cluster" doc:"Only events of attempts on this cluster (a service with several clusters)." example:"east"`
	Cursor      string `query:"cursor" doc:"Resume after this event (its id); Last-Event-ID wins when both are given."`
	LastEventID string `header:"Last-Event-ID" doc:"Resume after this event (its id), as EventSource sends it when it reconnects."`
}

var watchParams = []string{"namespace", "phase", "reason", "namePrefix", "labels", "cluster", "cursor"}

type taskWatchInput struct {
	ID          string `path:"id" doc:"The task ID."`
	Cursor      string `query:"cursor" doc:"Resume after this event (its id); Last-Event-ID wins when both are given."`
	LastEventID string `header:"Last-Event-ID" doc:"Resume after this event (its id)."`
}

const sseDescription = "Server-Sent Events (text/event-stream). Each event has an id (its cursor), an event name (its type) " +
	"and a JSON data line (an Event). The stream starts with a Bookmark event carrying the cursor it starts from; " +
	"resume with Last-Event-ID or ?cursor=. An Expired event means events were missed (the cursor is older than the " +
	"events the server keeps, or from an earlier server process): list again; the stream goes on after it. " +
	"A comment line every 15 s keeps the connection alive."

func (s *Server) registerStreams() {
	sse := func() map[string]*huma.Response {
		return map[string]*huma.Response{"200": {
			Description: "A stream of events.",
			Content:     map[string]*huma.MediaType{"text/event-stream": {Schema: s.api.OpenAPI().Components.Schemas.Schema(reflect.TypeFor[api.Event](), true, "Event")}},
		}}
	}
	huma.Register(s.api, huma.Operation{
		OperationID: "watchTasks", Method: http.MethodGet, Path: api.Prefix + "/watch", Tags: []string{"watch"},
		Summary:     "Watch tasks",
		Description: "The state changes of every task (that the filters and the caller's permissions let through). " + sseDescription,
		Responses:   sse(),
		Errors:      []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden},
	}, s.watch)
	huma.Register(s.api, huma.Operation{
		OperationID: "watchTask", Method: http.MethodGet, Path: api.Prefix + "/tasks/{id}/watch", Tags: []string{"watch"},
		Summary:     "Watch a task",
		Description: "The state changes of one task. " + sseDescription,
		Responses:   sse(),
		Errors:      []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound},
	}, s.watchTask)
	huma.Register(s.api, huma.Operation{
		OperationID: "getTaskLogs", Method: http.MethodGet, Path: api.Prefix + "/tasks/{id}/logs", Tags: []string{"logs"},
		Summary: "Read a task's log",
		Description: "One container's log of one attempt, as archived: plain text, the raw bytes, from a byte offset. " +
			"With follow=true the response goes on as the archive grows until the log is complete. " +
			"X-Kubetask-Log-Size, -Complete and -Truncated describe the archive when the response starts, and again as trailers " +
			"when it ends; the trailer X-Kubetask-Log-Resume: true says the server ended a follow early (shutdown, stream " +
			"timeout): request again from the offset reached.",
		Responses: map[string]*huma.Response{"200": {
			Description: "The log's bytes from offset.",
			Headers: map[string]*huma.Param{
				api.HeaderLogSize:      {Description: "Bytes archived.", Schema: &huma.Schema{Type: "integer"}},
				api.HeaderLogComplete:  {Description: "The whole log is archived.", Schema: &huma.Schema{Type: "boolean"}},
				api.HeaderLogTruncated: {Description: "The log reached the archive's size cap; a marker line says so.", Schema: &huma.Schema{Type: "boolean"}},
			},
			Content: map[string]*huma.MediaType{"text/plain; charset=utf-8": {Schema: &huma.Schema{Type: "string"}}},
		}},
		Errors: []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusNotImplemented},
	}, s.logs)
}

// Publish delivers an executor event to the watches. Call it from the
// executor's OnEvent (it does not block on slow watchers: each reads the
// ring at its own pace, and one that falls behind the ring gets Expired). It
// reads the task's namespace, name and labels from the executor the first
// time it sees a task (a small cache keeps them).
//
// A task ID can name another record later (retention deleted the task, and
// a new one took its ID, in any namespace), so a cached entry is used only
// while nothing says it may be another record's: a Submitted event (the
// first of every record) replaces it with the metadata the event carries
// (Event.Task, the new record's own; without it the record is read), an
// event whose pod is in another namespace than the entry's reads the record
// again, and PublishMissed, which says that some events (a Submitted among
// them) never arrived, empties the cache. A submission therefore never
// waits for a read of its own record on its way to the watches.
// Events are therefore published under their own record's namespace, name
// and labels, and reach only the watchers that may see that namespace.
func (s *Server) Publish(ev executor.Event) {
	var (
		m  taskMeta
		ok bool
	)
	if ev.Type == executor.EventSubmitted && ev.Task != nil {
		m, ok = taskMeta{namespace: ev.Task.Namespace, name: ev.Task.Name, labels: ev.Task.Labels}, true
		s.meta.put(ev.ID, m)
	} else if m, ok = s.meta.get(ev.ID); ok && !m.fits(ev) {
		ok = false
	}
	if !ok {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rec, err := s.cfg.Executor.Get(ctx, ev.ID)
		cancel()
		switch err {
		case nil:
			m = taskMeta{namespace: rec.Namespace, name: rec.Name, labels: rec.Labels}
			s.meta.put(ev.ID, m)
		default:
			s.log.Warn("event of a task that cannot be read; watches filtering by namespace, name or labels miss it", "task", ev.ID, "err", err)
			if ns, _, ok := strings.Cut(ev.Pod, "/"); ok {
				m.namespace = ns
			}
		}
	}
	s.ring.append(api.Event{
		Type: string(ev.Type), TaskID: ev.ID, Namespace: m.namespace, Name: m.name, Attempt: ev.Attempt, Pod: ev.Pod, Cluster: ev.Cluster,
		Phase: ev.Phase, Reason: ev.Reason, Message: ev.Message, ExitCode: ev.ExitCode, Terminal: ev.Terminal, Time: ev.Time,
	}, m.labels)
	s.metrics.events.Inc()
}

// PublishMissed tells every watch that some events may never reach it: the
// stream reports Expired (as for a cursor too old), so that a client lists
// again. Call it when events published elsewhere (another replica's) may
// have been lost on their way here.
func (s *Server) PublishMissed(reason string) {
	// A missed Submitted would leave a cached entry of an earlier record
	// with the same ID in place: read every task again.
	s.meta.clear()
	s.ring.append(api.Event{
		Type: api.EventExpired, Time: s.cfg.Clock.Now(),
		Message: "events may have been missed (" + reason + "); list the tasks again and go on with this stream",
	}, nil)
}

func (s *Server) watch(ctx context.Context, in *watchInput) (*huma.StreamResponse, error) {
	if err := knownQuery(ctx, watchParams...); err != nil {
		return nil, err
	}
	var details []error
	var opts store.PageOptions
	filterFields{Namespace: in.Namespace, Phase: in.Phase, Reason: in.Reason, NamePrefix: in.NamePrefix, Labels: in.Labels}.parse(&opts,
		func(param, value, msg string) {
			details = append(details, &huma.ErrorDetail{Location: "query." + param, Value: value, Message: msg})
		})
	if in.Cluster != "" {
		if err := store.ValidateClusterName(in.Cluster); err != nil {
			details = append(details, &huma.ErrorDetail{Location: "query.cluster", Value: in.Cluster,
				Message: "must be a cluster name: 1 to 40 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"})
		}
	}
	if len(details) > 0 {
		return nil, badRequest(details)
	}
	sc, err := s.scope(ctx, ActionWatch, opts.Namespace)
	if err != nil {
		return nil, err
	}
	opts.Namespace = sc.namespace
	pos, expired, err := s.resume(in.Cursor, in.LastEventID)
	if err != nil {
		return nil, err
	}
	match := func(e *ringEntry) bool {
		return sc.allows(e.ev.Namespace) && (in.Cluster == "" || e.ev.Cluster == in.Cluster) &&
			matches(&opts, e.ev.Namespace, e.ev.Name, e.ev.Phase, e.ev.Reason, e.labels)
	}
	release, err := s.openStream(requestFrom(ctx), CallerFrom(ctx), "watch", sc.namespace)
	if err != nil {
		return nil, err
	}
	access := s.access(ctx, ActionWatch, sc.namespaces()...)
	return &huma.StreamResponse{Body: func(hctx huma.Context) { defer release(); s.stream(hctx, access, match, pos, expired) }}, nil
}

func (s *Server) watchTask(ctx context.Context, in *taskWatchInput) (*huma.StreamResponse, error) {
	if err := knownQuery(ctx, "cursor"); err != nil {
		return nil, err
	}
	pos, expired, err := s.resume(in.Cursor, in.LastEventID)
	if err != nil {
		return nil, err
	}
	rec, err := s.record(ctx, in.ID, ActionWatch)
	if err != nil {
		return nil, err
	}
	pos, match := s.recordEvents(rec, pos)
	release, err := s.openStream(requestFrom(ctx), CallerFrom(ctx), "watch", rec.Namespace)
	if err != nil {
		return nil, err
	}
	access := s.access(ctx, ActionWatch, rec.Namespace)
	return &huma.StreamResponse{Body: func(hctx huma.Context) { defer release(); s.stream(hctx, access, match, pos, expired) }}, nil
}

// recordEvents returns where a watch of rec's task resumes from and which
// events it sends: those of rec itself, never those of an earlier record
// with the same ID (retention deleted it, and a caller of any namespace may
// take a free ID). An event is rec's when it has rec's ID and namespace, is
// not older than the ID's newest Submitted event that the ring keeps (a
// cursor from before it resumes there: nothing earlier is rec's), and, when
// it names a pod, names one of rec's: a pod's name holds a hash of its
// record's nonce, drawn at random for every record.
func (s *Server) recordEvents(rec store.Record, pos uint64) (uint64, func(*ringEntry) bool) {
	start := s.ring.recordStart(rec.ID)
	if start > 0 && pos+1 < start {
		pos = start - 1
	}
	return pos, func(e *ringEntry) bool {
		if e.ev.TaskID != rec.ID || e.num < start || e.ev.Namespace != rec.Namespace {
			return false
		}
		return e.ev.Pod == "" || e.ev.Pod == rec.Namespace+"/"+podName(rec, e.ev.Attempt)
	}
}

// resume parses the cursor a watch resumes from: Last-Event-ID (what
// EventSource sends when it reconnects) over ?cursor=.
func (s *Server) resume(query, header string) (uint64, bool, error) {
	c, loc := header, "header.Last-Event-ID"
	if c == "" {
		c, loc = query, "query.cursor"
	}
	pos, expired, err := s.ring.resume(c)
	if err != nil {
		return 0, false, huma.Error400BadRequest(err.Error(), &huma.ErrorDetail{Location: loc, Value: c, Message: "malformed cursor"})
	}
	return pos, expired, nil
}

// stream writes the events after pos that match, as Server-Sent Events,
// until the client goes, the stream's time is up, the server stops or
// access is no longer allowed (checked every AuthRecheck).
func (s *Server) stream(hctx huma.Context, access *streamAccess, match func(*ringEntry) bool, pos uint64, expired bool) {
	ctx := hctx.Context()
	_, w := humago.Unwrap(hctx)
	rc := http.NewResponseController(w)
	hctx.SetHeader("Content-Type", "text/event-stream")
	hctx.SetHeader("Cache-Control", "no-cache")
	hctx.SetHeader("X-Accel-Buffering", "no") // proxies: do not buffer the stream
	hctx.SetStatus(http.StatusOK)
	s.pushWriteDeadline(rc)

	sw := &sseWriter{w: w}
	if expired {
		s.expired(sw, pos)
	} else {
		sw.event(api.Event{Cursor: s.ring.cursor(pos), Type: api.EventBookmark, Time: s.cfg.Clock.Now()})
	}
	if sw.flush(rc) != nil {
		return
	}
	hb := s.cfg.Clock.NewTicker(s.cfg.Heartbeat)
	defer hb.Stop()
	end := s.cfg.Clock.NewTimer(s.cfg.StreamTimeout)
	defer end.Stop()
	recheck, stopRecheck := access.recheck()
	defer stopRecheck()
	sent := pos // the position the client's cursor holds
	for {
		s.pushWriteDeadline(rc) // a client that reads nothing for WriteTimeout is dropped
		entries, ok, wait := s.ring.since(pos, 512)
		if !ok {
			// This stream fell behind the ring (a slow reader).
			pos = s.ring.head()
			s.expired(sw, pos)
			sent = pos
		}
		for i := range entries {
			e := &entries[i]
			pos++
			// An Expired in the ring concerns every watch, whatever it filters.
			if e.ev.Type == api.EventExpired || match(e) {
				sw.event(e.ev)
				sent = pos
			}
		}
		if len(entries) > 0 || !ok {
			if sw.flush(rc) != nil {
				return
			}
			continue
		}
		select {
		case <-wait:
		case <-hb.C():
			s.pushWriteDeadline(rc)
			if sent != pos {
				// Events the filters dropped moved the position: tell
				// the client, so that it resumes from here.
				sw.event(api.Event{Cursor: s.ring.cursor(pos), Type: api.EventBookmark, Time: s.cfg.Clock.Now()})
				sent = pos
			}
			sw.comment("heartbeat")
			if sw.flush(rc) != nil {
				return
			}
		case <-end.C():
			return
		case <-recheck:
			if !access.stillAllowed(ctx) {
				// Events already sent are not taken back; no later one
				// goes out. The client's next request is refused.
				sw.comment("access revoked: the caller may no longer watch these tasks")
				_ = sw.flush(rc)
				return
			}
		case <-s.stopping:
			return
		case <-ctx.Done():
			return
		}
	}
}

// pushWriteDeadline gives a stream's next writes WriteTimeout to complete:
// a client that stops reading is dropped then, its goroutine freed.
func (s *Server) pushWriteDeadline(rc *http.ResponseController) {
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
}

func (s *Server) expired(sw *sseWriter, head uint64) {
	s.metrics.expired.Inc()
	sw.event(api.Event{
		Cursor: s.ring.cursor(head), Type: api.EventExpired, Time: s.cfg.Clock.Now(),
		Message: fmt.Sprintf("events were missed: the cursor is older than the %d events this server keeps, or from an earlier server process; list the tasks again and go on with this stream", s.cfg.EventBuffer),
	})
}

// sseWriter writes Server-Sent Events; the first write error sticks.
type sseWriter struct {
	w   io.Writer
	err error
}

func (sw *sseWriter) event(ev api.Event) {
	if sw.err != nil {
		return
	}
	data, err := json.Marshal(ev)
	if err != nil {
		sw.err = err
		return
	}
	// The JSON has no newline, so it is one data line.
	_, sw.err = fmt.Fprintf(sw.w, "id: %s\nevent: %s\ndata: %s\n\n", ev.Cursor, ev.Type, data)
}

func (sw *sseWriter) comment(c string) {
	if sw.err == nil {
		_, sw.err = fmt.Fprintf(sw.w, ": %s\n\n", c)
	}
}

func (sw *sseWriter) flush(rc *http.ResponseController) error {
	if sw.err != nil {
		return sw.err
	}
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		sw.err = err
	}
	return sw.err
}
