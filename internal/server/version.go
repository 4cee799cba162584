package server

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/kubetask/kubetask/pkg/api"
)

type versionOutput struct {
	Body api.Version
}

// registerVersion serves GET /api/v1/version, public like the OpenAPI
// document: a client compares its version with the server's before it
// authenticates.
func (s *Server) registerVersion() {
	huma.Register(s.api, huma.Operation{
		OperationID: "getVersion", Method: http.MethodGet, Path: api.Prefix + "/version", Tags: []string{"server"},
		Summary: "Get the server's version",
		Description: "The version, commit and build date of `kubetask serve` (also sent on every response as the header " +
			api.HeaderVersion + "). Needs no token.",
	}, func(context.Context, *struct{}) (*versionOutput, error) {
		return &versionOutput{Body: s.cfg.Version}, nil
	})
}

// sendVersion sets the version header on every response, errors included,
// so that any answer tells a client which server it talks to.
func (s *Server) sendVersion(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderVersion, s.cfg.Version.Version)
		next.ServeHTTP(w, r)
	})
}
