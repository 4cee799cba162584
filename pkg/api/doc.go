// Package api holds the wire types of kubetask's HTTP API (version 1, under
// Prefix): what `kubetask serve` (internal/server) sends and what the Go
// client (pkg/client) decodes. Both use these types, so the OpenAPI document
// the server generates from them describes exactly what the client reads.
//
// It depends on the standard library only, so that importing the client
// brings in no server code. docs/api.md documents the endpoints.
package api
