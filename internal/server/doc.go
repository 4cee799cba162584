// Package server is the HTTP API of `kubetask serve`: submit, get, list,
// cancel and rerun tasks, watch their state changes (Server-Sent Events,
// resumable by cursor) and read their archived logs (plain text, by byte
// offset, followed as they grow), under /api/v1, with /healthz, /readyz and
// /metrics beside it.
//
// The server is composed, not configured: New takes the executor (an
// Executor interface), the store's store.Pager and store.Logs, an optional
// Kubernetes client and an Authenticator (NewTokenAuth, NewKubernetesAuth).
// The command that embeds it feeds it the executor's events with Publish
// and, optionally, wakes log follows with NotifyLog. Serve it with Serve (it
// shuts down gracefully when its context ends) or mount Handler.
//
// The handlers' Go types (pkg/api) generate the OpenAPI 3.1 document served at
// /api/v1/openapi.json; testdata/openapi.json is its checked-in copy, which a
// test compares (go test ./internal/server -update rewrites it). Every error
// is RFC 9457 problem+json naming the field at fault. docs/api.md documents
// the API.
package server
