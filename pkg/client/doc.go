// Package client is the Go client of kubetask's HTTP API (the API of
// `kubetask serve`, version 1, whose wire types are in pkg/api).
//
// A Client submits tasks (idempotently, by task ID), reads, lists, cancels and
// reruns them, watches their events and reads their logs:
//
//	c, err := client.New("http://127.0.0.1:8080", client.WithToken(token))
//	t, created, err := c.Submit(ctx, "default", doc, client.SubmitOptions{ID: "nightly-2026-01-02"})
//	t, err = c.Wait(ctx, t.ID)
//
// Every method takes a context first and ends when it ends. A non-2xx answer
// is an *Error that carries the HTTP status and the server's problem details
// (RFC 9457, api.Problem); branch on it with IsNotFound, IsConflict,
// IsUnauthorized, IsForbidden and IsInvalid.
//
// The streaming calls survive dropped connections: Watch resumes after the
// last event it delivered (the SSE Last-Event-ID), so its callback misses no
// event and sees none twice; the reader of Logs resumes at the byte offset it
// reached, so it returns the log's bytes exactly once, and with Follow it ends
// exactly when the server says the log is complete. Both retry with
// exponential backoff until their context ends or the server refuses them
// (a 4xx answer); only their first connection fails at once, so that a wrong
// address or token is reported rather than retried.
//
// The package depends on pkg/api and the standard library only.
package client
