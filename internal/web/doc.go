// Package web is kubetask serve's web page: the task list, each task's page
// and its logs, as static files embedded in the binary (plain JavaScript
// modules, CSS and HTML under static/; no build step, nothing fetched from
// elsewhere). The page's only data source is the HTTP API under /api/v1,
// called with the token the user signs in with.
//
// Handler serves the files: index.html for every route of the page (the
// page routes itself), the other files under a path that names their
// content's hash, so that they can be cached for good.
package web
