// Package service composes `kubetask serve`: its configuration (file, flags
// and defaults for a laptop), the store, the executor with log capture into
// the store's archive, the HTTP API, retention and a graceful shutdown that
// leaves running pods under their finalizer for the next start to adopt.
package service
