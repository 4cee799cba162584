package web

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
)

//go:embed static
var static embed.FS

// AssetsPrefix is the path under which the page's files are served, followed
// by the hash of all of them: a new build's files have new URLs, so a browser
// never mixes the files of two versions and may cache them for good.
const AssetsPrefix = "/assets/"

// assetsPlaceholder, in index.html, stands for AssetsPrefix and the hash.
const assetsPlaceholder = "{{ASSETS}}"

// contentSecurityPolicy lets the page load its own files and call its own
// API, nothing else: no inline script, no other origin, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".json": "application/json",
}

// file is one file as served: its bytes, gzipped when that is smaller, and
// the ETags of both.
type file struct {
	name        string
	contentType string
	body, gz    []byte
	etag        string
}

type site struct {
	version string
	index   *file
	assets  map[string]*file
}

var (
	siteOnce sync.Once
	built    *site
	buildErr error
)

// Handler serves the web page: index.html (no-cache, revalidated by ETag)
// for every path that names no file (the page's routes: /, /tasks/{id},
// ...), the page's files under AssetsPrefix+version (cached for a year,
// immutable), gzipped for clients that accept it. A path with a file
// extension that is not one of the page's files is 404. Mount it as
// server.Config.UI; it answers GET and HEAD only.
func Handler() http.Handler {
	siteOnce.Do(func() { built, buildErr = build(static) })
	if buildErr != nil {
		// The files are embedded: this is a broken build, found by the
		// package's tests.
		panic(buildErr)
	}
	return built
}

// Version is the hash of the page's files: the path element after
// AssetsPrefix.
func Version() string {
	Handler()
	return built.version
}

func build(fsys fs.FS) (*site, error) {
	root, err := fs.Sub(fsys, "static")
	if err != nil {
		return nil, err
	}
	s := &site{assets: map[string]*file{}}
	var names []string
	err = fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the page's files: %w", err)
	}
	sort.Strings(names)
	sum := sha256.New()
	raw := map[string][]byte{}
	for _, n := range names {
		b, err := fs.ReadFile(root, n)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", n, err)
		}
		raw[n] = b
		if n != "index.html" {
			fmt.Fprintf(sum, "%s\x00%d\x00", n, len(b))
			sum.Write(b)
		}
	}
	index, ok := raw["index.html"]
	if !ok {
		return nil, fmt.Errorf("static/index.html is missing")
	}
	s.version = hex.EncodeToString(sum.Sum(nil))[:16]
	for _, n := range names {
		ct, ok := types[path.Ext(n)]
		if !ok {
			return nil, fmt.Errorf("static/%s: no content type for %q", n, path.Ext(n))
		}
		b := raw[n]
		if n == "index.html" {
			b = bytes.ReplaceAll(index, []byte(assetsPlaceholder), []byte(AssetsPrefix+s.version))
		}
		f, err := newFile(n, ct, b)
		if err != nil {
			return nil, err
		}
		if n == "index.html" {
			s.index = f
		} else {
			s.assets[n] = f
		}
	}
	return s, nil
}

func newFile(name, ct string, b []byte) (*file, error) {
	h := sha256.Sum256(b)
	f := &file{name: name, contentType: ct, body: b, etag: `"` + hex.EncodeToString(h[:8]) + `"`}
	if strings.HasPrefix(ct, "image/png") {
		return f, nil
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("gzip %s: %w", name, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip %s: %w", name, err)
	}
	if buf.Len() < len(b) {
		f.gz = buf.Bytes()
	}
	return f, nil
}

func (s *site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the web page answers GET and HEAD only", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, AssetsPrefix); ok {
		version, name, _ := strings.Cut(rest, "/")
		f, found := s.assets[name]
		if version != s.version || !found {
			// Another version's file (a page loaded before an upgrade):
			// reloading the page fetches the current ones.
			h.Set("Cache-Control", "no-store")
			http.Error(w, "no such file of this version of the page: reload the page", http.StatusNotFound)
			return
		}
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
		s.write(w, r, f)
		return
	}
	if strings.Contains(path.Base(p), ".") {
		h.Set("Cache-Control", "no-store")
		http.Error(w, "no such file", http.StatusNotFound)
		return
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	s.write(w, r, s.index)
}

// write sends f, gzipped when the client accepts it, or 304 when the
// client's copy is current.
func (s *site) write(w http.ResponseWriter, r *http.Request, f *file) {
	h := w.Header()
	body, etag := f.body, f.etag
	if f.gz != nil {
		h.Set("Vary", "Accept-Encoding")
		if acceptsGzip(r.Header.Get("Accept-Encoding")) {
			body, etag = f.gz, strings.TrimSuffix(f.etag, `"`)+`-gz"`
			h.Set("Content-Encoding", "gzip")
		}
	}
	h.Set("Content-Type", f.contentType)
	h.Set("ETag", etag)
	if matchesETag(r.Header.Get("If-None-Match"), etag) {
		h.Del("Content-Encoding")
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// acceptsGzip reports whether an Accept-Encoding header allows gzip (not
// refused with q=0).
func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}

func matchesETag(header, etag string) bool {
	if header == "" {
		return false
	}
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == etag || t == "*" {
			return true
		}
	}
	return false
}
