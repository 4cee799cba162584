package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// durableStores opens each durable store the service runs on: SQLite in a
// temporary directory and PostgreSQL (a database of its own on the test
// server).
func durableStores(t *testing.T) map[string]func(t *testing.T) store.Store {
	return map[string]func(t *testing.T) store.Store{
		"SQLite": func(t *testing.T) store.Store {
			st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "tasks.db"))
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		"PostgreSQL": func(t *testing.T) store.Store {
			st, err := store.OpenPostgres(context.Background(), pgtest.Database(t), store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
}

// TestConcurrentDuplicateSubmissions: two submissions of one ID sent at the
// same moment get exactly one 201 (the one that created the task) and, for
// the same document, one 200 (docs/api.md), for another document one 409;
// on each durable store, pair after pair.
func TestConcurrentDuplicateSubmissions(t *testing.T) {
	const pairs = 40
	for name, open := range durableStores(t) {
		t.Run(name, func(t *testing.T) {
			h := newHarnessOn(t, open(t), nil)
			codes := map[string]int{}
			for i := range pairs {
				id := fmt.Sprintf("dup-%d", i)
				other := taskDoc("same")
				want := [2]int{http.StatusOK, http.StatusCreated} // in ascending order, as got is sorted
				if i%4 == 3 {                                     // every fourth pair: another document under the ID
					other = taskDoc("different")
					want = [2]int{http.StatusCreated, http.StatusConflict}
				}
				got := h.submitTogether(id, taskDoc("same"), other)
				slices.Sort(got[:])
				codes[fmt.Sprint(got)]++
				if got != want {
					t.Errorf("pair %s: answers %v, want %v (in either order)", id, got, want)
				}
			}
			t.Logf("answers of %d pairs: %v", pairs, codes)
		})
	}
}

// submitTogether sends two submissions under id (docs a and b) at the same
// moment and returns their status codes, in the order of the documents.
func (h *harness) submitTogether(id, a, b string) [2]int {
	h.t.Helper()
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		codes [2]int
		errs  [2]error
	)
	for i, doc := range []string{a, b} {
		req, err := http.NewRequest(http.MethodPost, h.ts.URL+api.Prefix+"/namespaces/default/tasks?id="+id, bytes.NewReader([]byte(doc)))
		if err != nil {
			h.t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/yaml")
		wg.Go(func() {
			<-start
			resp, err := h.ts.Client().Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			codes[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			h.t.Fatal(err)
		}
	}
	return codes
}
