package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
)

// BenchmarkPages measures what `kubetask serve` lists and gets from a SQLite
// store of 1,000,000 task records: the latency (p50 and p99 in
// milliseconds) of the first page, of a deep page reached by continue token
// after 10,000 records, of filtered pages, and of a Get by ID. The goal is
// every page under 20 ms.
//
//	go test ./pkg/store -run '^$' -bench BenchmarkPages
//
// Setting up the records takes a few minutes (they are bulk-loaded in
// transactions of 50,000, through the store's writer, indexes and label
// triggers included). KUBETASK_BENCH_PAGES_DB names a file to keep them in:
// a later run reuses it (delete it to rebuild). KUBETASK_BENCH_PAGES_RECORDS
// changes the number of records (for a quick try).
func BenchmarkPages(b *testing.B) {
	ctx := context.Background()
	n := 1_000_000
	if v := os.Getenv("KUBETASK_BENCH_PAGES_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 20_000 {
			b.Fatalf("KUBETASK_BENCH_PAGES_RECORDS=%q: want a number of at least 20000", v)
		}
	}
	path := os.Getenv("KUBETASK_BENCH_PAGES_DB")
	if path == "" {
		path = filepath.Join(b.TempDir(), "tasks.db")
	}
	s := openPagesFixture(ctx, b, path, n)
	defer s.Close()
	p := s.(store.Pager)

	// The deep page's token: the one after 10,000 records, reached by
	// paging as a client does.
	deep := pageTokenAfter(b, p, store.PageOptions{}, 100)
	filtered := store.PageOptions{Namespace: "team-07", Phase: "Failed", Labels: map[string]string{"env": "prod"}}
	filteredDeep := pageTokenAfter(b, p, filtered, min(10, max(1, n/100_000)))
	withToken := func(o store.PageOptions, tok string) store.PageOptions {
		o.Continue = tok
		return o
	}
	r := rand.New(rand.NewPCG(1, 2))
	pages := []struct {
		name string
		opts store.PageOptions
	}{
		{"first-page", store.PageOptions{}},
		{"deep-page-after-10000", withToken(store.PageOptions{}, deep)},
		{"filtered-page-namespace+phase+label", filtered},
		{"filtered-deep-page", withToken(filtered, filteredDeep)},
		{"label-page-app", store.PageOptions{Labels: map[string]string{"app": "team-03-app-2"}}},
		{"namespace-page", store.PageOptions{Namespace: "team-11"}},
		{"reason-page", store.PageOptions{Reason: "OOMKilled"}},
		{"name-prefix-page", store.PageOptions{NamePrefix: "team-05-app-1-backfill"}},
		{"unfinished-page", store.PageOptions{Terminal: new(bool)}},
	}
	for _, pg := range pages {
		b.Run(pg.name, func(b *testing.B) {
			opts := pg.opts
			opts.Limit = 100
			lat := make([]time.Duration, 0, b.N)
			records := 0
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				page, err := p.Page(ctx, opts)
				lat = append(lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				records = len(page.Records)
			}
			b.StopTimer()
			if records != 100 && n >= 1_000_000 {
				b.Fatalf("%d records, want a full page of 100", records)
			}
			reportLatency(b, lat)
		})
	}
	b.Run("get-by-id", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			id := pagesFixtureID(r.IntN(n))
			start := time.Now()
			_, err := s.Get(ctx, id)
			lat = append(lat, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
}

// reportLatency reports the p50 and p99 of lat in milliseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// pageTokenAfter pages through opts, 100 records a page, and returns the
// token after the given number of pages.
func pageTokenAfter(b *testing.B, p store.Pager, opts store.PageOptions, pages int) string {
	b.Helper()
	opts.Limit = 100
	for i := range pages {
		page, err := p.Page(context.Background(), opts)
		if err != nil || page.Continue == "" {
			b.Fatalf("page %d of %+v: continue %q, err %v", i, opts, page.Continue, err)
		}
		opts.Continue = page.Continue
	}
	return opts.Continue
}

// openPagesFixture opens the store at path with n records, loading them if
// the file does not hold them yet.
func openPagesFixture(ctx context.Context, b *testing.B, path string, n int) store.Store {
	b.Helper()
	s, err := store.OpenSQLite(ctx, path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Get(ctx, pagesFixtureID(n-1)); err == nil {
		b.Logf("reusing the %d records in %s", n, path)
		return s
	}
	start := time.Now()
	if err := store.SQLiteBulkLoad(ctx, s, n, pagesFixtureRecord); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d records into %s in %v", n, path, time.Since(start).Round(time.Second))
	return s
}

// pagesFixtureEpoch is when the fixture's first task was created; one task
// was created every 2.6 s after it (a month of tasks).
var pagesFixtureEpoch = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)

func pagesFixtureID(i int) string {
	// Server-made IDs sort by creation time.
	return fmt.Sprintf("t-%013x", pagesFixtureEpoch.Add(time.Duration(i)*2600*time.Millisecond).UnixMilli())
}

var pagesFixtureJobs = []string{"nightly-etl", "hourly-sync", "report", "backfill", "train", "export", "cleanup", "index"}

// pagesFixtureRecord is record i of the fixture: 20 namespaces (teams) with
// 10 apps each, apps running their jobs; 85 % succeed and 15 % fail, and the
// newest 2,000 are still pending or running; labels app, team, env and
// trigger, as a platform team would set them.
func pagesFixtureRecord(i int) store.Record {
	r := rand.New(rand.NewPCG(uint64(i), 42))
	created := pagesFixtureEpoch.Add(time.Duration(i) * 2600 * time.Millisecond)
	team := r.IntN(20)
	ns := fmt.Sprintf("team-%02d", team)
	app := fmt.Sprintf("%s-app-%d", ns, r.IntN(10))
	job := pagesFixtureJobs[r.IntN(len(pagesFixtureJobs))]
	env := []string{"prod", "prod", "prod", "prod", "prod", "prod", "staging", "staging", "staging", "dev"}[r.IntN(10)]
	rec := store.Record{
		ID:        pagesFixtureID(i),
		Namespace: ns,
		Name:      app + "-" + job,
		Executor:  "serve-0",
		Labels: map[string]string{
			"app":                 app,
			"team":                ns,
			"env":                 env,
			"kubetask.io/trigger": []string{"schedule", "schedule", "api", "manual"}[r.IntN(4)],
		},
		Task: fmt.Appendf(nil, `{"apiVersion":"kubetask.io/v1","kind":"Task","metadata":{"name":%q,"namespace":%q,"labels":{"app":%q,"env":%q}},`+
			`"spec":{"image":"registry.example.com/%s/%s:1.%d","command":["/bin/%s","--date","%s"],"resources":{"cpu":"500m","memory":"512Mi"},"retries":2,"timeout":"1h"}}`,
			app+"-"+job, ns, app, env, ns, job, r.IntN(40), job, created.Format(time.DateOnly)),
		PodCreated: true,
		CreatedAt:  created,
		UpdatedAt:  created.Add(time.Duration(30+r.IntN(600)) * time.Second),
		Version:    4,
	}
	exit := func(c int32) *int32 { return &c }
	switch {
	case i >= 1_000_000-2_000 || i%1000 == 999 && r.IntN(10) == 0:
		rec.Phase, rec.Reason, rec.Message = []string{"Pending", "Running"}[r.IntN(2)], "ContainerRunning", "main container running"
		if rec.Phase == "Pending" {
			rec.Reason, rec.Message = "Unschedulable", "0/10 nodes are available: 10 Insufficient cpu"
		}
		rec.UpdatedAt, rec.Version = created, 2
	case r.IntN(100) < 85:
		rec.Phase, rec.Reason, rec.Message, rec.ExitCode = "Succeeded", "Completed", `main container "main" exited with code 0`, exit(0)
		rec.Result = []byte(`{"rows": 1234, "status": "ok"}`)
		rec.Terminal = true
	default:
		reasons := []string{"Error", "Error", "Error", "Error", "OOMKilled", "DeadlineExceeded", "Evicted", "ImagePullBackOff"}
		rec.Phase, rec.Reason = "Failed", reasons[r.IntN(len(reasons))]
		rec.Message, rec.ExitCode = fmt.Sprintf(`main container "main": %s`, rec.Reason), exit(int32(1+r.IntN(137)))
		rec.Terminal = true
	}
	if rec.Terminal {
		rec.Attempts = []store.AttemptOutcome{{
			Attempt: 0, Pod: rec.Name + "-0", Phase: rec.Phase, Reason: rec.Reason, Message: rec.Message,
			ExitCode: rec.ExitCode, FinishedAt: rec.UpdatedAt, ObservedAt: rec.UpdatedAt.Add(12 * time.Millisecond),
		}}
	}
	return rec
}
