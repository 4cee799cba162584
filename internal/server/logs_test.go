package server_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/server"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

func TestLogsFromAnOffset(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello"))
	key := store.LogKey{TaskID: tk.ID, Attempt: 0, Container: "main"}
	raw := "line 1\n\xff\xfe binary\nline 3 no newline"
	h.logs.append(t, key, raw, true)

	for name, tc := range map[string]struct {
		query string
		want  string
	}{
		"whole log, defaults":       {"", raw},
		"from an offset":            {"?offset=7", raw[7:]},
		"at the end":                {"?offset=" + itoa(len(raw)), ""},
		"explicit attempt and main": {"?attempt=0&container=main&follow=false", raw},
	} {
		t.Run(name, func(t *testing.T) {
			resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs"+tc.query, nil)
			if resp.StatusCode != http.StatusOK || string(b) != tc.want {
				t.Fatalf("%s %q, want %q", resp.Status, b, tc.want)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if resp.Header.Get(api.HeaderLogSize) != itoa(len(raw)) || resp.Header.Get(api.HeaderLogComplete) != "true" || resp.Header.Get(api.HeaderLogTruncated) != "false" {
				t.Errorf("headers %v", resp.Header)
			}
			if resp.Trailer.Get(api.HeaderLogComplete) != "true" || resp.Trailer.Get(api.HeaderLogResume) != "false" {
				t.Errorf("trailers %v", resp.Trailer)
			}
		})
	}
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs?offset=999", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("offset beyond a complete log: %s %s", resp.Status, b)
	}
}

// TestLogsInPieces reads a log piece by piece with limit, as a viewer of a
// large log does: exactly the bytes asked for (fewer at the end), pieces
// larger than the server's read chunk, and a follow that ends after limit.
func TestLogsInPieces(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello"))
	key := store.LogKey{TaskID: tk.ID, Attempt: 0, Container: "main"}
	var b strings.Builder
	for i := 0; b.Len() < 200<<10; i++ {
		b.WriteString("line " + itoa(i) + "\n")
	}
	raw := b.String()
	h.logs.append(t, key, raw, true)
	path := api.Prefix + "/tasks/" + tk.ID + "/logs"

	for name, tc := range map[string]struct {
		query string
		want  string
	}{
		"the first bytes":                  {"?limit=10", raw[:10]},
		"from an offset":                   {"?offset=7&limit=5", raw[7:12]},
		"more than one read chunk":         {"?offset=10&limit=" + itoa(100<<10), raw[10 : 10+100<<10]},
		"past the end":                     {"?offset=" + itoa(len(raw)-3) + "&limit=100", raw[len(raw)-3:]},
		"at the end":                       {"?offset=" + itoa(len(raw)) + "&limit=100", ""},
		"follow of a complete log, capped": {"?follow=true&offset=3&limit=4", raw[3:7]},
	} {
		t.Run(name, func(t *testing.T) {
			resp, got := h.do(http.MethodGet, path+tc.query, nil)
			if resp.StatusCode != http.StatusOK || string(got) != tc.want {
				t.Fatalf("%s: %d bytes %.40q, want %d bytes %.40q", resp.Status, len(got), got, len(tc.want), tc.want)
			}
			if resp.Header.Get(api.HeaderLogSize) != itoa(len(raw)) || resp.Header.Get(api.HeaderLogComplete) != "true" {
				t.Errorf("headers %v", resp.Header)
			}
		})
	}

	t.Run("follow of a growing log ends after limit", func(t *testing.T) {
		key := store.LogKey{TaskID: h.mustSubmit("default", taskDoc("growing")).ID, Attempt: 0, Container: "main"}
		h.logs.append(t, key, "one\n", false)
		resp, got := h.do(http.MethodGet, api.Prefix+"/tasks/"+key.TaskID+"/logs?follow=true&limit=3", nil)
		if resp.StatusCode != http.StatusOK || string(got) != "one" || resp.Trailer.Get(api.HeaderLogResume) != "false" {
			t.Fatalf("%s %q %v", resp.Status, got, resp.Trailer)
		}
	})

	for _, bad := range []string{"0", "-1", "ten", "1.5"} {
		resp, body := h.do(http.MethodGet, path+"?limit="+bad, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "query.limit") {
			t.Errorf("limit=%s: %s %s", bad, resp.Status, body)
		}
	}
}

func TestLogsOfAnAttemptNotCapturedYetAreEmpty(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello"))
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs", nil)
	if resp.StatusCode != http.StatusOK || len(b) != 0 || resp.Header.Get(api.HeaderLogSize) != "0" || resp.Header.Get(api.HeaderLogComplete) != "false" {
		t.Fatalf("%s %q %v", resp.Status, b, resp.Header)
	}
}

func TestLogsFollowUntilComplete(t *testing.T) {
	for _, notify := range []bool{false, true} {
		name := "polling"
		if notify {
			name = "NotifyLog"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(c *server.Config) {
				if notify {
					c.LogPollInterval = time.Hour // only NotifyLog wakes the follow
				}
			})
			tk := h.mustSubmit("default", taskDoc("hello"))
			key := store.LogKey{TaskID: tk.ID, Attempt: 0, Container: "main"}
			h.logs.append(t, key, "one\n", false)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+api.Prefix+"/tasks/"+tk.ID+"/logs?follow=true&offset=1", nil)
			resp, err := h.ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			line := func() string {
				t.Helper()
				s, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("reading the followed log: %v", err)
				}
				return s
			}
			if got := line(); got != "ne\n" {
				t.Fatalf("first line %q", got)
			}
			for _, l := range []string{"two\n", "three\n"} {
				h.logs.append(t, key, l, false)
				if notify {
					h.srv.NotifyLog(key)
				}
				if got := line(); got != l {
					t.Fatalf("followed %q, want %q", got, l)
				}
			}
			h.logs.append(t, key, "last", true)
			if notify {
				h.srv.NotifyLog(key)
			}
			rest, err := io.ReadAll(r)
			if err != nil || string(rest) != "last" {
				t.Fatalf("end of the log: %q %v", rest, err)
			}
			if resp.Trailer.Get(api.HeaderLogComplete) != "true" || resp.Trailer.Get(api.HeaderLogSize) != itoa(len("one\ntwo\nthree\nlast")) {
				t.Errorf("trailers %v", resp.Trailer)
			}
		})
	}
}

func TestLogsFollowOfAFinishedAttemptWithoutArchiveEnds(t *testing.T) {
	h := newHarness(t, nil) // LogWait 50ms
	tk := h.mustSubmit("default", taskDoc("hello"))
	h.finish(tk.ID, "Failed", "Unschedulable")
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs?follow=true", nil)
	if resp.StatusCode != http.StatusOK || len(b) != 0 || resp.Trailer.Get(api.HeaderLogResume) != "false" || resp.Trailer.Get(api.HeaderLogComplete) != "false" {
		t.Fatalf("%s %q %v", resp.Status, b, resp.Trailer)
	}
}

func TestLogsFollowEndedByTheServerSaysResume(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.StreamTimeout = 50 * time.Millisecond })
	tk := h.mustSubmit("default", taskDoc("hello"))
	h.logs.append(t, store.LogKey{TaskID: tk.ID, Container: "main"}, "partial", false)
	resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs?follow=true", nil)
	if string(b) != "partial" || resp.Trailer.Get(api.HeaderLogResume) != "true" || resp.Trailer.Get(api.HeaderLogSize) != "7" {
		t.Fatalf("%s %q %v", resp.Status, b, resp.Trailer)
	}
}

func TestLogsOfOtherContainersAndAttempts(t *testing.T) {
	h := newHarness(t, nil)
	doc := strings.Replace(taskDoc("hello"), "spec:\n  template:", "spec:\n  mainContainer: main\n  logs: {containers: [main, envoy]}\n  template:", 1) +
		"      - name: envoy\n        image: envoy\n"
	tk := h.mustSubmit("default", doc)
	h.logs.append(t, store.LogKey{TaskID: tk.ID, Container: "envoy"}, "proxy up\n", true)
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs?container=envoy", nil); string(b) != "proxy up\n" {
		t.Fatalf("envoy's log: %s %q", resp.Status, b)
	}
	if resp, _ := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs?container=other", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a container without a log: %s", resp.Status)
	}
}

func TestLogsWithoutArchive(t *testing.T) {
	h := newHarness(t, func(c *server.Config) { c.Logs = nil })
	tk := h.mustSubmit("default", taskDoc("hello"))
	if resp, b := h.do(http.MethodGet, api.Prefix+"/tasks/"+tk.ID+"/logs", nil); resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("%s %s", resp.Status, b)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// A follow from an offset beyond the archived end (a client that read the
// log elsewhere) waits for the log to reach it, and then goes on from there.
func TestLogsFollowFromBeyondTheEnd(t *testing.T) {
	h := newHarness(t, nil)
	tk := h.mustSubmit("default", taskDoc("hello"))
	key := store.LogKey{TaskID: tk.ID, Attempt: 0, Container: "main"}
	h.logs.append(t, key, "one\n", false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.ts.URL+api.Prefix+"/tasks/"+tk.ID+"/logs?follow=true&offset=8", nil)
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("follow from beyond the end: %s", resp.Status)
	}
	h.logs.append(t, key, "two\nthree\n", false)
	h.logs.append(t, key, "end", true)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "three\nend" {
		t.Errorf("followed %q (%v), want the bytes from offset 8", rest, err)
	}
	if resp.Trailer.Get(api.HeaderLogComplete) != "true" {
		t.Errorf("trailers %v", resp.Trailer)
	}
}
