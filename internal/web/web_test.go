package web_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kubetask/kubetask/internal/web"
)

func get(t *testing.T, method, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	web.Handler().ServeHTTP(rec, req)
	return rec
}

// The page's routes all get index.html, which the browser must revalidate
// (no-cache) and which names the files of this version.
func TestRoutesServeTheIndex(t *testing.T) {
	for _, path := range []string{"/", "/tasks/t01abc", "/tasks/t01abc/", "/some/route"} {
		rec := get(t, http.MethodGet, path)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, rec.Code)
		}
		h := rec.Header()
		if ct := h.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("GET %s: Content-Type %q", path, ct)
		}
		if h.Get("Cache-Control") != "no-cache" || h.Get("ETag") == "" {
			t.Errorf("GET %s: Cache-Control %q, ETag %q; want no-cache with an ETag", path, h.Get("Cache-Control"), h.Get("ETag"))
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
		body := rec.Body.String()
		if !strings.Contains(body, web.AssetsPrefix+web.Version()+"/app.js") || strings.Contains(body, "{{") {
			t.Errorf("GET %s: the index does not name this version's files:\n%s", path, body)
		}
	}
}

// referenced returns the paths of the files index.html names and, for
// each JavaScript module among them, the modules it imports: every file
// the list page loads.
func referenced(t *testing.T) []string {
	t.Helper()
	index := get(t, http.MethodGet, "/").Body.String()
	prefix := web.AssetsPrefix + web.Version() + "/"
	var todo []string
	for _, m := range regexp.MustCompile(`(?:href|src)="(`+regexp.QuoteMeta(prefix)+`[^"]+)"`).FindAllStringSubmatch(index, -1) {
		todo = append(todo, m[1])
	}
	imports := regexp.MustCompile(`(?m)^import\s[^'"]*['"]\./([^'"]+)['"]`)
	var seen []string
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		if slices.Contains(seen, p) {
			continue
		}
		seen = append(seen, p)
		if strings.HasSuffix(p, ".js") {
			for _, m := range imports.FindAllStringSubmatch(get(t, http.MethodGet, p).Body.String(), -1) {
				todo = append(todo, prefix+m[1])
			}
		}
	}
	return seen
}

// Every file the page loads is served with its type, cached for good
// (its URL changes with its content), gzipped when asked, and answers a
// revalidation with 304.
func TestFilesAreServedWithTypesAndCaching(t *testing.T) {
	types := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
	files := referenced(t)
	for _, want := range []string{"app.js", "api.js", "list.js", "task.js", "logview.js", "logsource.js", "ansi.js", "style.css", "icon.svg"} {
		if !slices.ContainsFunc(files, func(p string) bool { return strings.HasSuffix(p, "/"+want) }) {
			t.Errorf("the page does not load %s (it loads %v)", want, files)
		}
	}
	for _, p := range files {
		rec := get(t, http.MethodGet, p)
		h := rec.Header()
		if rec.Code != http.StatusOK {
			t.Errorf("GET %s: %d", p, rec.Code)
			continue
		}
		ext := p[strings.LastIndex(p, "."):]
		if h.Get("Content-Type") != types[ext] {
			t.Errorf("GET %s: Content-Type %q, want %q", p, h.Get("Content-Type"), types[ext])
		}
		if h.Get("Cache-Control") != "public, max-age=31536000, immutable" || h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: headers %v", p, h)
		}
		plain := rec.Body.Bytes()

		gz := get(t, http.MethodGet, p, "Accept-Encoding", "br, gzip;q=0.8")
		if gz.Header().Get("Content-Encoding") != "gzip" || !strings.Contains(gz.Header().Get("Vary"), "Accept-Encoding") {
			t.Errorf("GET %s with gzip: headers %v", p, gz.Header())
			continue
		}
		zr, err := gzip.NewReader(gz.Body)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		unzipped, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(unzipped, plain) {
			t.Errorf("GET %s: the gzipped body differs from the plain one (%v)", p, err)
		}
		if rec := get(t, http.MethodGet, p, "Accept-Encoding", "gzip;q=0"); rec.Header().Get("Content-Encoding") != "" {
			t.Errorf("GET %s: gzip refused with q=0 but sent", p)
		}

		if rec := get(t, http.MethodGet, p, "If-None-Match", h.Get("ETag")); rec.Code != http.StatusNotModified || rec.Body.Len() != 0 {
			t.Errorf("GET %s revalidated: %d with %d bytes, want 304", p, rec.Code, rec.Body.Len())
		}
		if rec := get(t, http.MethodHead, p); rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") != h.Get("Content-Length") {
			t.Errorf("HEAD %s: %d, %d bytes, Content-Length %q", p, rec.Code, rec.Body.Len(), rec.Header().Get("Content-Length"))
		}
	}
}

func TestUnknownFilesAre404(t *testing.T) {
	for _, path := range []string{
		web.AssetsPrefix + "0123456789abcdef/app.js", // another version's
		web.AssetsPrefix + web.Version() + "/nope.js",
		web.AssetsPrefix + web.Version() + "/index.html",
		"/favicon.ico",
		"/app.js",
	} {
		if rec := get(t, http.MethodGet, path); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, rec.Code)
		}
	}
	if rec := get(t, http.MethodPost, "/"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", rec.Code)
	}
}

// The list page's files (index.html and every file it loads, as sent
// gzipped) stay under 200 KB: the page must be quick on a slow link.
func TestListPageIsSmall(t *testing.T) {
	const budget = 200 << 10
	total, plain := 0, 0
	for _, p := range append([]string{"/"}, referenced(t)...) {
		rec := get(t, http.MethodGet, p, "Accept-Encoding", "gzip")
		total += rec.Body.Len()
		plain += len(get(t, http.MethodGet, p).Body.Bytes())
	}
	t.Logf("the list page loads %d bytes gzipped (%d bytes plain)", total, plain)
	if total > budget {
		t.Errorf("the list page loads %d bytes gzipped, over the budget of %d", total, budget)
	}
}
