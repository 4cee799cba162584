package storetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubetask/kubetask/pkg/store"
)

// The cases below check the optional interfaces of `kubetask serve`
// (store.Pager, store.Logs, store.Retention); each is skipped for a store
// that does not implement its interface.

// serviceCases are run by Run.
var serviceCases = []struct {
	name string
	fn   func(t *testing.T, s store.Store)
}{
	{"PageFiltersAloneAndCombined", testPageFilters},
	{"PageThroughInsertsNoSkipNoRepeat", testPageThroughInserts},
	{"PageFilteredThroughInserts", testPageFilteredThroughInserts},
	{"PageBadContinue", testPageBadContinue},
	{"PageVisibleNamespacesOnly", testPageVisibleNamespaces},
	{"PageLimits", testPageLimits},
	{"PageLabelsFollowUpdates", testPageLabelsFollowUpdates},
	{"LogChunksReadBackAtAnyOffset", testLogChunks},
	{"LogOffsetMismatch", testLogOffsetMismatch},
	{"LogCompleteAndCursor", testLogCompleteAndCursor},
	{"LogReadBounds", testLogReadBounds},
	{"LogUnknownTask", testLogUnknownTask},
	{"LogOfAnotherRecordOfTheID", testLogOfAnotherRecord},
	{"LogKeysOrder", testLogKeysOrder},
	{"LogConcurrentAppends", testLogConcurrentAppends},
	{"LogDefaultCapNotReached", testLogDefaultCap},
	{"RetentionDeletesOnlyOldTerminal", testRetention},
}

// capCases need a store whose Options.MaxLogSize is testLogCap; RunWithOptions
// runs them.
var capCases = []struct {
	name string
	fn   func(t *testing.T, s store.Store)
}{
	{"LogCapTruncates", testLogCapTruncates},
}

// testLogCap is the MaxLogSize RunWithOptions gives the stores of capCases.
const testLogCap = 1000

// RunWithOptions is Run for a store that takes store.Options: besides Run's
// cases it runs those that need a store with a small log cap. open is called
// once per subtest with the options to use and must return an empty store;
// RunWithOptions closes it.
func RunWithOptions(t *testing.T, open func(t *testing.T, opts store.Options) store.Store) {
	t.Helper()
	Run(t, func(t *testing.T) store.Store { return open(t, store.Options{}) })
	for _, tc := range capCases {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, store.Options{MaxLogSize: testLogCap})
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

func pagerOf(t *testing.T, s store.Store) store.Pager {
	t.Helper()
	p, ok := s.(store.Pager)
	if !ok {
		t.Skip("the store does not implement store.Pager")
	}
	return p
}

func logsOf(t *testing.T, s store.Store) store.Logs {
	t.Helper()
	l, ok := s.(store.Logs)
	if !ok {
		t.Skip("the store does not implement store.Logs")
	}
	return l
}

// pageAll pages through opts with limit per page and returns the records in
// the order the pages listed them.
func pageAll(t *testing.T, p store.Pager, opts store.PageOptions, limit int) []store.Record {
	t.Helper()
	opts.Limit = limit
	var out []store.Record
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatalf("Page(%+v): more than 10000 pages", opts)
		}
		page, err := p.Page(context.Background(), opts)
		if err != nil {
			t.Fatalf("Page(%+v): %v", opts, err)
		}
		if len(page.Records) > limit {
			t.Fatalf("Page(%+v): %d records, more than the limit %d", opts, len(page.Records), limit)
		}
		if page.Continue != "" && len(page.Records) != limit {
			t.Fatalf("Page(%+v): %d records and a continue token: only the last page may be short", opts, len(page.Records))
		}
		out = append(out, page.Records...)
		if page.Continue == "" {
			return out
		}
		opts.Continue = page.Continue
	}
}

// inPageOrder reports whether a lists before b: newer first, then by ID
// descending.
func inPageOrder(a, b store.Record) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.After(b.CreatedAt)
	}
	return a.ID > b.ID
}

func ids(recs []store.Record) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

// createMany creates recs with 16 concurrent writers (so a store that groups
// writes commits them together) and returns the stored records by ID.
func createMany(t *testing.T, s store.Store, recs []store.Record) map[string]store.Record {
	t.Helper()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		out  = map[string]store.Record{}
		errs []error
		next = make(chan store.Record)
	)
	for range 16 {
		wg.Go(func() {
			for rec := range next {
				got, created, err := s.Create(context.Background(), rec)
				mu.Lock()
				if err == nil && !created {
					err = fmt.Errorf("%s: created = false for a new ID", rec.ID)
				}
				if err != nil {
					errs = append(errs, err)
				}
				out[got.ID] = got
				mu.Unlock()
			}
		})
	}
	for _, rec := range recs {
		next <- rec
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("Create: %v", errors.Join(errs...))
	}
	return out
}

// filterRecord is one record of testPageFilters' fixture.
func filterRecord(i int) store.Record {
	rec := Sample(fmt.Sprintf("f-%02d", i))
	rec.Namespace = []string{"ns-a", "ns-b"}[i%2]
	rec.Phase = []string{"Pending", "Running", "Succeeded", "Failed"}[i%4]
	rec.Reason = []string{"Submitted", "ContainerRunning", "Completed", "Error", "OOMKilled"}[i%5]
	rec.Terminal = rec.Phase == "Succeeded" || rec.Phase == "Failed"
	rec.Name = []string{"etl-daily", "etl-hourly", "report", "édition", "zz\xff\xff"}[i%5] + fmt.Sprintf("-%d", i)
	switch {
	case i%7 == 0:
		rec.Labels = nil
	case i%11 == 0:
		rec.Labels = map[string]string{}
	default:
		rec.Labels = map[string]string{
			"app": []string{"web", "db", "batch"}[i%3],
			"env": map[bool]string{true: "dev", false: "prod"}[i%4 == 1],
		}
		if i%6 == 0 {
			rec.Labels["kubetask.io/rerun"] = "true"
		}
	}
	return rec
}

// testPageFilters pages through a fixture of 60 records with each filter
// alone and in combinations, with several page sizes, and compares with the
// records a plain filter over Get selects, in page order.
func testPageFilters(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	const n = 60
	var all []store.Record
	for i := range n { // one by one: CreatedAt follows i
		all = append(all, mustCreate(t, s, filterRecord(i)))
	}
	// Bounds between records 20/21 and 40/41 (as created, with the store's
	// clock), so the time filters select by position.
	after, before := all[20].CreatedAt, all[40].CreatedAt
	yes, no := true, false
	tests := map[string]struct {
		opts store.PageOptions
		want func(r store.Record) bool
	}{
		"no filter":             {store.PageOptions{}, func(store.Record) bool { return true }},
		"namespace":             {store.PageOptions{Namespace: "ns-b"}, func(r store.Record) bool { return r.Namespace == "ns-b" }},
		"phase":                 {store.PageOptions{Phase: "Failed"}, func(r store.Record) bool { return r.Phase == "Failed" }},
		"reason":                {store.PageOptions{Reason: "OOMKilled"}, func(r store.Record) bool { return r.Reason == "OOMKilled" }},
		"name prefix":           {store.PageOptions{NamePrefix: "etl-"}, func(r store.Record) bool { return strings.HasPrefix(r.Name, "etl-") }},
		"name prefix, one name": {store.PageOptions{NamePrefix: "report-10"}, func(r store.Record) bool { return strings.HasPrefix(r.Name, "report-10") }},
		"name prefix, unicode":  {store.PageOptions{NamePrefix: "é"}, func(r store.Record) bool { return strings.HasPrefix(r.Name, "é") }},
		"name prefix, 0xff":     {store.PageOptions{NamePrefix: "zz\xff\xff"}, func(r store.Record) bool { return strings.HasPrefix(r.Name, "zz\xff\xff") }},
		"name prefix, no match": {store.PageOptions{NamePrefix: "etl-dailyx"}, func(store.Record) bool { return false }},
		"label":                 {store.PageOptions{Labels: map[string]string{"app": "db"}}, labelsMatch(map[string]string{"app": "db"})},
		"two labels":            {store.PageOptions{Labels: map[string]string{"app": "web", "env": "dev"}}, labelsMatch(map[string]string{"app": "web", "env": "dev"})},
		"three labels":          {store.PageOptions{Labels: map[string]string{"app": "web", "env": "prod", "kubetask.io/rerun": "true"}}, labelsMatch(map[string]string{"app": "web", "env": "prod", "kubetask.io/rerun": "true"})},
		"label key missing":     {store.PageOptions{Labels: map[string]string{"nope": "web"}}, func(store.Record) bool { return false }},
		"label value differs":   {store.PageOptions{Labels: map[string]string{"app": "nope"}}, func(store.Record) bool { return false }},
		"empty label filter":    {store.PageOptions{Labels: map[string]string{}}, func(store.Record) bool { return true }},
		"created after":         {store.PageOptions{CreatedAfter: after}, func(r store.Record) bool { return !r.CreatedAt.Before(after) }},
		"created before":        {store.PageOptions{CreatedBefore: before}, func(r store.Record) bool { return r.CreatedAt.Before(before) }},
		"created between":       {store.PageOptions{CreatedAfter: after, CreatedBefore: before}, func(r store.Record) bool { return !r.CreatedAt.Before(after) && r.CreatedAt.Before(before) }},
		"created, empty range":  {store.PageOptions{CreatedAfter: before, CreatedBefore: after}, func(store.Record) bool { return false }},
		"created, far bounds": {store.PageOptions{CreatedAfter: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), CreatedBefore: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)},
			func(store.Record) bool { return true }},
		"terminal":           {store.PageOptions{Terminal: &yes}, func(r store.Record) bool { return r.Terminal }},
		"not terminal":       {store.PageOptions{Terminal: &no}, func(r store.Record) bool { return !r.Terminal }},
		"namespace, phase":   {store.PageOptions{Namespace: "ns-a", Phase: "Succeeded"}, func(r store.Record) bool { return r.Namespace == "ns-a" && r.Phase == "Succeeded" }},
		"namespace, reason":  {store.PageOptions{Namespace: "ns-a", Reason: "Error"}, func(r store.Record) bool { return r.Namespace == "ns-a" && r.Reason == "Error" }},
		"phase, reason":      {store.PageOptions{Phase: "Running", Reason: "Completed"}, func(r store.Record) bool { return r.Phase == "Running" && r.Reason == "Completed" }},
		"namespace, label":   {store.PageOptions{Namespace: "ns-b", Labels: map[string]string{"env": "prod"}}, func(r store.Record) bool { return r.Namespace == "ns-b" && r.Labels["env"] == "prod" }},
		"phase, terminal":    {store.PageOptions{Phase: "Failed", Terminal: &no}, func(store.Record) bool { return false }},
		"terminal, created":  {store.PageOptions{Terminal: &yes, CreatedAfter: after}, func(r store.Record) bool { return r.Terminal && !r.CreatedAt.Before(after) }},
		"name prefix, label": {store.PageOptions{NamePrefix: "etl", Labels: map[string]string{"app": "batch"}}, func(r store.Record) bool { return strings.HasPrefix(r.Name, "etl") && r.Labels["app"] == "batch" }},
		"namespace, phase, label": {store.PageOptions{Namespace: "ns-b", Phase: "Running", Labels: map[string]string{"env": "prod"}},
			func(r store.Record) bool {
				return r.Namespace == "ns-b" && r.Phase == "Running" && r.Labels["env"] == "prod"
			}},
		"label, reason, created": {store.PageOptions{Labels: map[string]string{"env": "prod"}, Reason: "Completed", CreatedBefore: before},
			func(r store.Record) bool {
				return r.Labels["env"] == "prod" && r.Reason == "Completed" && r.CreatedAt.Before(before)
			}},
		"every filter": {
			store.PageOptions{Namespace: "ns-a", Phase: "Succeeded", Reason: "Completed", NamePrefix: "rep",
				Labels: map[string]string{"app": "web"}, CreatedAfter: all[0].CreatedAt, CreatedBefore: all[n-1].CreatedAt, Terminal: &yes},
			func(r store.Record) bool {
				return r.Namespace == "ns-a" && r.Phase == "Succeeded" && r.Reason == "Completed" && strings.HasPrefix(r.Name, "rep") &&
					r.Labels["app"] == "web" && !r.CreatedAt.Before(all[0].CreatedAt) && r.CreatedAt.Before(all[n-1].CreatedAt) && r.Terminal
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var want []store.Record
			for _, r := range all {
				if tc.want(r) {
					want = append(want, r)
				}
			}
			slices.SortFunc(want, func(a, b store.Record) int {
				if inPageOrder(a, b) {
					return -1
				}
				return 1
			})
			for _, limit := range []int{1, 4, 7, 100} {
				got := pageAll(t, p, tc.opts, limit)
				if diff := cmp.Diff(ids(want), ids(got)); diff != "" {
					t.Fatalf("limit %d: IDs (-want +got):\n%s", limit, diff)
				}
				for i, r := range got {
					if diff := cmp.Diff(want[i], r); diff != "" {
						t.Fatalf("limit %d: record %s differs from the stored one (-stored +page):\n%s", limit, r.ID, diff)
					}
				}
			}
		})
	}
}

func labelsMatch(sel map[string]string) func(store.Record) bool {
	return func(r store.Record) bool {
		for k, v := range sel {
			if got, ok := r.Labels[k]; !ok || got != v {
				return false
			}
		}
		return true
	}
}

// testPageVisibleNamespaces pages with PageOptions.Namespaces (the
// namespaces a caller may see) alone and with the other filters: the pages
// hold the matching records of those namespaces and nothing else, full pages
// until the last (never a short page with a token: no record of another
// namespace was read in its place), and a token issued for some namespaces
// is refused with others.
func testPageVisibleNamespaces(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	const n = 90
	var all []store.Record
	for i := range n {
		rec := filterRecord(i)
		rec.ID = fmt.Sprintf("v-%02d", i)
		rec.Namespace = []string{"team-a", "team-b", "team-c"}[i%3]
		all = append(all, mustCreate(t, s, rec))
	}
	many := []string{"team-b", "team-a"}
	for i := range 70 { // more than the stores read as one range each
		many = append(many, fmt.Sprintf("other-%02d", i))
	}
	visible := func(r store.Record) bool { return r.Namespace == "team-a" || r.Namespace == "team-b" }
	tests := map[string]struct {
		opts store.PageOptions
		want func(r store.Record) bool
	}{
		"two namespaces":           {store.PageOptions{Namespaces: []string{"team-b", "team-a"}}, visible},
		"two namespaces, repeated": {store.PageOptions{Namespaces: []string{"team-a", "team-b", "team-a"}}, visible},
		"one namespace":            {store.PageOptions{Namespaces: []string{"team-c"}}, func(r store.Record) bool { return r.Namespace == "team-c" }},
		"many namespaces":          {store.PageOptions{Namespaces: many}, visible},
		"namespace among them":     {store.PageOptions{Namespace: "team-b", Namespaces: []string{"team-a", "team-b"}}, func(r store.Record) bool { return r.Namespace == "team-b" }},
		"namespace not among them": {store.PageOptions{Namespace: "team-c", Namespaces: []string{"team-a", "team-b"}}, func(store.Record) bool { return false }},
		"name prefix":              {store.PageOptions{Namespaces: []string{"team-a", "team-b"}, NamePrefix: "etl-"}, func(r store.Record) bool { return visible(r) && strings.HasPrefix(r.Name, "etl-") }},
		"label":                    {store.PageOptions{Namespaces: []string{"team-a", "team-b"}, Labels: map[string]string{"app": "db"}}, func(r store.Record) bool { return visible(r) && r.Labels["app"] == "db" }},
		"label and name prefix": {store.PageOptions{Namespaces: []string{"team-a", "team-b"}, Labels: map[string]string{"app": "web"}, NamePrefix: "report"}, func(r store.Record) bool {
			return visible(r) && r.Labels["app"] == "web" && strings.HasPrefix(r.Name, "report")
		}},
		"phase":            {store.PageOptions{Namespaces: []string{"team-a", "team-b"}, Phase: "Failed"}, func(r store.Record) bool { return visible(r) && r.Phase == "Failed" }},
		"reason, terminal": {store.PageOptions{Namespaces: []string{"team-a", "team-b"}, Reason: "Completed", Terminal: new(true)}, func(r store.Record) bool { return visible(r) && r.Reason == "Completed" && r.Terminal }},
		"created": {store.PageOptions{Namespaces: []string{"team-a", "team-b"}, CreatedAfter: all[30].CreatedAt, CreatedBefore: all[60].CreatedAt}, func(r store.Record) bool {
			return visible(r) && !r.CreatedAt.Before(all[30].CreatedAt) && r.CreatedAt.Before(all[60].CreatedAt)
		}},
		"many namespaces, label, prefix": {store.PageOptions{Namespaces: many, Labels: map[string]string{"app": "web"}, NamePrefix: "report"}, func(r store.Record) bool {
			return visible(r) && r.Labels["app"] == "web" && strings.HasPrefix(r.Name, "report")
		}},
		"no such namespace": {store.PageOptions{Namespaces: []string{"team-x", "team-y"}}, func(store.Record) bool { return false }},
		"other namespace's filter values": {store.PageOptions{Namespaces: []string{"team-a"}, NamePrefix: "etl-", Labels: map[string]string{"app": "batch"}}, func(r store.Record) bool {
			return r.Namespace == "team-a" && strings.HasPrefix(r.Name, "etl-") && r.Labels["app"] == "batch"
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var want []store.Record
			for _, r := range all {
				if tc.want(r) {
					want = append(want, r)
				}
			}
			slices.SortFunc(want, func(a, b store.Record) int {
				if inPageOrder(a, b) {
					return -1
				}
				return 1
			})
			for _, limit := range []int{1, 4, 100} {
				// pageAll fails on a short page with a token: a page that
				// read another namespace's record in place of a visible one.
				got := pageAll(t, p, tc.opts, limit)
				if diff := cmp.Diff(ids(want), ids(got)); diff != "" {
					t.Fatalf("limit %d: IDs (-want +got):\n%s", limit, diff)
				}
			}
		})
	}
	t.Run("token of other namespaces", func(t *testing.T) {
		ctx := context.Background()
		first, err := p.Page(ctx, store.PageOptions{Namespaces: []string{"team-a", "team-b"}, Limit: 2})
		if err != nil || first.Continue == "" {
			t.Fatalf("first page: continue %q, err %v", first.Continue, err)
		}
		for _, o := range []store.PageOptions{
			{Namespaces: []string{"team-a", "team-b", "team-c"}, Continue: first.Continue},
			{Continue: first.Continue},
		} {
			if page, err := p.Page(ctx, o); !errors.Is(err, store.ErrBadContinue) {
				t.Errorf("Page(namespaces %v): %d records, err = %v; want ErrBadContinue", o.Namespaces, len(page.Records), err)
			}
		}
		same, err := p.Page(ctx, store.PageOptions{Namespaces: []string{"team-b", "team-a"}, Limit: 2, Continue: first.Continue})
		if err != nil || len(same.Records) != 2 {
			t.Errorf("the same namespaces in another order: %d records, err %v; want the next page", len(same.Records), err)
		}
	})
}

// testPageThroughInserts pages through 1,000 records while more are created
// between pages: every record that existed when paging began is listed
// exactly once, in page order, and none created later is listed (they are
// newer than the position reached).
func testPageThroughInserts(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	pageThroughInserts(t, s, p, store.PageOptions{}, func(i int) store.Record {
		return Sample(fmt.Sprintf("p-%04d", i))
	})
}

// testPageFilteredThroughInserts is testPageThroughInserts with a namespace
// and label filter, while records that match it and records that do not are
// created between pages.
func testPageFilteredThroughInserts(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	pageThroughInserts(t, s, p, store.PageOptions{Namespace: "ns-x", Labels: map[string]string{"app": "etl"}}, func(i int) store.Record {
		rec := Sample(fmt.Sprintf("p-%04d", i))
		rec.Namespace = []string{"ns-x", "ns-y"}[i%2]
		rec.Labels = map[string]string{"app": []string{"etl", "etl", "web"}[i%3]}
		return rec
	})
}

func pageThroughInserts(t *testing.T, s store.Store, p store.Pager, opts store.PageOptions, gen func(i int) store.Record) {
	const n, limit, perPage = 1000, 37, 5
	var recs []store.Record
	for i := range n {
		recs = append(recs, gen(i))
	}
	stored := createMany(t, s, recs)
	var want []store.Record
	for _, r := range stored {
		if (opts.Namespace == "" || r.Namespace == opts.Namespace) && labelsMatch(opts.Labels)(r) {
			want = append(want, r)
		}
	}
	if len(want) < 3*limit {
		t.Fatalf("fixture: %d records match, want several pages", len(want))
	}
	opts.Limit = limit
	seen := map[string]int{}
	var got []store.Record
	next := n
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatal("more pages than records")
		}
		page, err := p.Page(context.Background(), opts)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		for _, r := range page.Records {
			seen[r.ID]++
		}
		got = append(got, page.Records...)
		if page.Continue == "" {
			break
		}
		opts.Continue = page.Continue
		var more []store.Record
		for range perPage {
			more = append(more, gen(next))
			next++
		}
		createMany(t, s, more)
	}
	for _, r := range want {
		if seen[r.ID] != 1 {
			t.Errorf("%s listed %d times, want once", r.ID, seen[r.ID])
		}
	}
	if len(got) != len(want) {
		t.Errorf("listed %d records, want the %d that existed when paging began", len(got), len(want))
	}
	for i := 1; i < len(got); i++ {
		if !inPageOrder(got[i-1], got[i]) {
			t.Fatalf("record %d (%s, %v) listed after %s (%v): not in page order", i, got[i].ID, got[i].CreatedAt, got[i-1].ID, got[i-1].CreatedAt)
		}
	}
}

// testPageBadContinue checks that tokens that do not decode, and tokens of
// other filters, are ErrBadContinue, while the limit may change.
func testPageBadContinue(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	ctx := context.Background()
	var recs []store.Record
	for i := range 10 {
		rec := Sample(fmt.Sprintf("b-%02d", i))
		rec.Namespace = "ns-a"
		recs = append(recs, rec)
	}
	createMany(t, s, recs)
	yes := true
	opts := store.PageOptions{Namespace: "ns-a", Labels: map[string]string{"app": "demo"}, Limit: 3}
	first, err := p.Page(ctx, opts)
	if err != nil || first.Continue == "" {
		t.Fatalf("first page: continue %q, err %v", first.Continue, err)
	}
	tok := first.Continue
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	bad := map[string]store.PageOptions{
		"not base64":          {Continue: "!!!not a token!!!"},
		"base64 of garbage":   {Continue: base64.RawURLEncoding.EncodeToString([]byte("garbage"))},
		"base64 of JSON":      {Continue: base64.RawURLEncoding.EncodeToString([]byte(`{"a":1}`))},
		"std base64 padding":  {Continue: base64.StdEncoding.EncodeToString(raw) + "=="},
		"truncated":           {Continue: tok[:len(tok)/2]},
		"one byte changed":    {Continue: flipByte(tok)},
		"no filters":          {Continue: tok},
		"other namespace":     {Namespace: "ns-b", Labels: opts.Labels, Continue: tok},
		"other label value":   {Namespace: "ns-a", Labels: map[string]string{"app": "other"}, Continue: tok},
		"one label more":      {Namespace: "ns-a", Labels: map[string]string{"app": "demo", "x": "y"}, Continue: tok},
		"no label":            {Namespace: "ns-a", Continue: tok},
		"terminal added":      {Namespace: "ns-a", Labels: opts.Labels, Terminal: &yes, Continue: tok},
		"created after added": {Namespace: "ns-a", Labels: opts.Labels, CreatedAfter: time.Unix(1, 0), Continue: tok},
		"name prefix added":   {Namespace: "ns-a", Labels: opts.Labels, NamePrefix: "task", Continue: tok},
	}
	for name, o := range bad {
		t.Run(name, func(t *testing.T) {
			page, err := p.Page(ctx, o)
			if !errors.Is(err, store.ErrBadContinue) {
				t.Errorf("Page: %d records, err = %v; want ErrBadContinue", len(page.Records), err)
			}
		})
	}
	t.Run("same filters, other limit", func(t *testing.T) {
		o := opts
		o.Continue, o.Limit = tok, 100
		o.Labels = map[string]string{"app": "demo"} // an equal map, not the same one
		page, err := p.Page(ctx, o)
		if err != nil {
			t.Fatalf("Page: %v", err)
		}
		if len(page.Records) != 7 || page.Continue != "" {
			t.Errorf("Page: %d records, continue %q; want the other 7 and no token", len(page.Records), page.Continue)
		}
	})
}

// flipByte changes one character in the middle of tok.
func flipByte(tok string) string {
	b := []byte(tok)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// testPageLimits checks the default and maximum page sizes and that the last
// page has no token, also when it is exactly full.
func testPageLimits(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	ctx := context.Background()
	empty, err := p.Page(ctx, store.PageOptions{})
	if err != nil || len(empty.Records) != 0 || empty.Continue != "" {
		t.Fatalf("Page of an empty store: %d records, continue %q, err %v", len(empty.Records), empty.Continue, err)
	}
	var recs []store.Record
	for i := range store.MaxPageSize + 5 {
		recs = append(recs, Sample(fmt.Sprintf("l-%04d", i)))
	}
	createMany(t, s, recs)
	for _, tc := range []struct {
		limit, want int
		more        bool
	}{
		{0, store.DefaultPageSize, true},
		{-5, store.DefaultPageSize, true},
		{store.MaxPageSize + 1000, store.MaxPageSize, true},
		{store.MaxPageSize, store.MaxPageSize, true},
		{len(recs), store.MaxPageSize, true},
	} {
		page, err := p.Page(ctx, store.PageOptions{Limit: tc.limit})
		if err != nil {
			t.Fatalf("limit %d: %v", tc.limit, err)
		}
		if len(page.Records) != tc.want || (page.Continue != "") != tc.more {
			t.Errorf("limit %d: %d records, continue %q; want %d, more %v", tc.limit, len(page.Records), page.Continue, tc.want, tc.more)
		}
	}
	// The last page, exactly full: no token.
	page, err := p.Page(ctx, store.PageOptions{Limit: 5, NamePrefix: "task-l-000"}) // l-0000..l-0009
	if err != nil || len(page.Records) != 5 || page.Continue == "" {
		t.Fatalf("first of two full pages: %d records, continue %q, err %v", len(page.Records), page.Continue, err)
	}
	page, err = p.Page(ctx, store.PageOptions{Limit: 5, NamePrefix: "task-l-000", Continue: page.Continue})
	if err != nil || len(page.Records) != 5 || page.Continue != "" {
		t.Errorf("second of two full pages: %d records, continue %q, err %v; want 5 and no token", len(page.Records), page.Continue, err)
	}
}

// testPageLabelsFollowUpdates changes a record's labels with Update: the
// label filter finds it by its new labels only.
func testPageLabelsFollowUpdates(t *testing.T, s store.Store) {
	p := pagerOf(t, s)
	ctx := context.Background()
	rec := Sample("a")
	rec.Labels = map[string]string{"app": "old", "keep": "yes"}
	rec = mustCreate(t, s, rec)
	find := func(sel map[string]string) []string {
		t.Helper()
		page, err := p.Page(ctx, store.PageOptions{Labels: sel})
		if err != nil {
			t.Fatalf("Page: %v", err)
		}
		return ids(page.Records)
	}
	rec.Labels = map[string]string{"app": "new", "keep": "yes", "added": "1"}
	rec, err := s.Update(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sel  map[string]string
		want []string
	}{
		{map[string]string{"app": "old"}, nil},
		{map[string]string{"app": "new"}, []string{"a"}},
		{map[string]string{"keep": "yes", "added": "1"}, []string{"a"}},
	} {
		if diff := cmp.Diff(tc.want, find(tc.sel), cmpEmpty); diff != "" {
			t.Errorf("after the labels changed, Page(%v) (-want +got):\n%s", tc.sel, diff)
		}
	}
	rec.Labels = nil
	if _, err = s.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got := find(map[string]string{"keep": "yes"}); len(got) != 0 {
		t.Errorf("after the labels were removed, Page(keep=yes) = %v, want none", got)
	}
}

// cmpEmpty treats nil and empty slices alike.
var cmpEmpty = cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })

// logData returns n bytes of lines, deterministic by seed.
func logData(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1)) //nolint:gosec // deterministic test data
	var b bytes.Buffer
	for line := 0; b.Len() < n; line++ {
		fmt.Fprintf(&b, "line %d of log %d: %s\n", line, seed, strings.Repeat(string(rune('a'+r.IntN(26))), r.IntN(80)))
		if r.IntN(10) == 0 {
			b.Write([]byte{0, 0xff, 0xfe, '\r'}) // not only text
		}
	}
	return b.Bytes()[:n]
}

// appendChunks appends data to key in chunks of random sizes (some empty,
// carrying only a cursor), each at the size so far, and returns the info of
// the last append.
func appendChunks(t *testing.T, l store.Logs, key store.LogKey, data []byte, seed uint64, maxChunk int) store.LogInfo {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7)) //nolint:gosec // deterministic test data
	var info store.LogInfo
	for off := 0; off < len(data); {
		size := min(r.IntN(maxChunk+1), len(data)-off)
		cursor := fmt.Appendf(nil, "cursor@%d", off+size)
		var err error
		info, err = l.AppendLog(context.Background(), key, store.LogAppend{Offset: int64(off), Data: data[off : off+size], Cursor: cursor})
		if err != nil {
			t.Fatalf("AppendLog(%v, %d, %d bytes): %v", key, off, size, err)
		}
		off += size
		if info.Size != int64(off) || !bytes.Equal(info.Cursor, cursor) || info.Complete || info.Truncated {
			t.Fatalf("AppendLog(%v) up to %d: info %+v", key, off, info)
		}
	}
	return info
}

// testLogChunks appends a log in many chunks of random sizes and reads it
// back byte-exact at arbitrary offsets and limits, across chunk boundaries.
func testLogChunks(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	mustCreate(t, s, Sample("a"))
	key := store.LogKey{TaskID: "a", Attempt: 0, Container: "main"}
	data := logData(1, 200_000)
	appendChunks(t, l, key, data, 1, 4096)
	r := rand.New(rand.NewPCG(2, 3)) //nolint:gosec // deterministic test data
	reads := [][2]int{{0, len(data)}, {0, len(data) + 100}, {0, 1}, {len(data) - 1, 10}, {len(data), 10}, {12345, 0}}
	for range 200 {
		off := r.IntN(len(data) + 1)
		reads = append(reads, [2]int{off, r.IntN(20_000)})
	}
	for _, rd := range reads {
		off, limit := rd[0], rd[1]
		got, info, err := l.ReadLog(ctx, key, int64(off), limit)
		if err != nil {
			t.Fatalf("ReadLog(%d, %d): %v", off, limit, err)
		}
		want := data[off:min(off+limit, len(data))]
		if !bytes.Equal(got, want) {
			t.Fatalf("ReadLog(%d, %d): %d bytes differ from the %d appended there", off, limit, len(got), len(want))
		}
		if info.Size != int64(len(data)) || info.Complete || info.Truncated {
			t.Fatalf("ReadLog(%d, %d): info %+v", off, limit, info)
		}
	}
	// Read the whole log back in pieces of another size.
	var whole []byte
	for off := 0; off < len(data); {
		got, _, err := l.ReadLog(ctx, key, int64(off), 3333)
		if err != nil || len(got) == 0 {
			t.Fatalf("ReadLog(%d, 3333): %d bytes, err %v", off, len(got), err)
		}
		whole = append(whole, got...)
		off += len(got)
	}
	if !bytes.Equal(whole, data) {
		t.Fatal("the log read in pieces differs from the appended bytes")
	}
	// A second store handle would see the same; so does a scribble on the
	// returned bytes not change the log.
	got, _, _ := l.ReadLog(ctx, key, 0, 10)
	copy(got, "XXXXXXXXXX")
	if again, _, _ := l.ReadLog(ctx, key, 0, 10); !bytes.Equal(again, data[:10]) {
		t.Error("changing ReadLog's output changed the log")
	}
}

// testLogOffsetMismatch appends at wrong offsets: each is ErrLogOffset with
// the log's info, and changes nothing.
func testLogOffsetMismatch(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	mustCreate(t, s, Sample("a"))
	key := store.LogKey{TaskID: "a", Attempt: 1, Container: "main"}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Offset: 5, Data: []byte("x")}); !errors.Is(err, store.ErrLogOffset) {
		t.Errorf("first append at 5: err = %v, want ErrLogOffset", err)
	}
	if _, _, err := l.ReadLog(ctx, key, 0, 10); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after a refused first append, ReadLog: err = %v, want ErrNotFound", err)
	}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("hello\n"), Cursor: []byte("c1")}); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 3, 7, -1} {
		info, err := l.AppendLog(ctx, key, store.LogAppend{Offset: off, Data: []byte("again\n"), Cursor: []byte("c2"), Complete: true})
		if !errors.Is(err, store.ErrLogOffset) {
			t.Errorf("append at %d: err = %v, want ErrLogOffset", off, err)
		}
		if info.Size != 6 || string(info.Cursor) != "c1" || info.Complete {
			t.Errorf("append at %d: info %+v, want the log's (size 6, cursor c1)", off, info)
		}
	}
	got, info, err := l.ReadLog(ctx, key, 0, 100)
	if err != nil || string(got) != "hello\n" || info.Size != 6 || string(info.Cursor) != "c1" || info.Complete {
		t.Errorf("after refused appends: %q, info %+v, err %v", got, info, err)
	}
}

// testLogCompleteAndCursor checks the cursor and complete flag round trip.
func testLogCompleteAndCursor(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	mustCreate(t, s, Sample("a"))
	key := store.LogKey{TaskID: "a", Container: "main"}
	check := func(step string, info store.LogInfo, size int64, cursor []byte, complete bool) {
		t.Helper()
		if info.Size != size || !bytes.Equal(info.Cursor, cursor) || (info.Cursor == nil) != (cursor == nil) || info.Complete != complete || info.Truncated {
			t.Errorf("%s: info %+v, want size %d cursor %q (nil %v) complete %v", step, info, size, cursor, cursor == nil, complete)
		}
		_, read, err := l.ReadLog(ctx, key, 0, 0)
		if err != nil {
			t.Fatalf("%s: ReadLog: %v", step, err)
		}
		if diff := cmp.Diff(info, read); diff != "" {
			t.Errorf("%s: ReadLog's info differs from AppendLog's (-append +read):\n%s", step, diff)
		}
	}
	binary := []byte{0, 1, 0xff, '\n'}
	info, err := l.AppendLog(ctx, key, store.LogAppend{Cursor: binary}) // a cursor before any byte
	if err != nil {
		t.Fatal(err)
	}
	check("cursor only", info, 0, binary, false)
	binary[0] = 'X' // the store keeps its own copy
	info, _ = l.AppendLog(ctx, key, store.LogAppend{Data: []byte("abc")})
	check("nil cursor", info, 3, nil, false)
	info, _ = l.AppendLog(ctx, key, store.LogAppend{Offset: 3, Data: []byte("def"), Cursor: []byte{}})
	check("empty cursor", info, 6, []byte{}, false)
	info, _ = l.AppendLog(ctx, key, store.LogAppend{Offset: 6, Data: []byte("g\n"), Cursor: []byte("end"), Complete: true})
	check("complete", info, 8, []byte("end"), true)
	info, err = l.AppendLog(ctx, key, store.LogAppend{Offset: 8, Cursor: []byte("end2")})
	if err != nil {
		t.Fatalf("empty append after complete: %v", err)
	}
	check("complete stays set", info, 8, []byte("end2"), true)
	info, err = l.AppendLog(ctx, key, store.LogAppend{Offset: 8, Data: []byte("more"), Cursor: []byte("end3"), Complete: true})
	if !errors.Is(err, store.ErrLogComplete) {
		t.Errorf("data after complete: err = %v, want ErrLogComplete", err)
	}
	check("refused data after complete", info, 8, []byte("end2"), true)
	if got, _, _ := l.ReadLog(ctx, key, 0, 100); string(got) != "abcdefg\n" {
		t.Errorf("log %q, want %q", got, "abcdefg\n")
	}
}

// testLogReadBounds reads at the edges of a log.
func testLogReadBounds(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	mustCreate(t, s, Sample("a"))
	key := store.LogKey{TaskID: "a", Container: "main"}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("0123456789")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		off   int64
		limit int
		want  string
		err   error
	}{
		{0, 10, "0123456789", nil},
		{0, 1 << 30, "0123456789", nil},
		{9, 5, "9", nil},
		{10, 5, "", nil},
		{3, 0, "", nil},
		{3, -1, "", nil},
		{11, 5, "", store.ErrLogOffset},
		{-1, 5, "", store.ErrLogOffset},
	} {
		got, info, err := l.ReadLog(ctx, key, tc.off, tc.limit)
		if !errors.Is(err, tc.err) || string(got) != tc.want {
			t.Errorf("ReadLog(%d, %d) = %q, err %v; want %q, err %v", tc.off, tc.limit, got, err, tc.want, tc.err)
		}
		if info.Size != 10 {
			t.Errorf("ReadLog(%d, %d): info %+v, want size 10", tc.off, tc.limit, info)
		}
	}
}

// testLogOfAnotherRecord: an append carrying a record's nonce is refused
// (ErrNotFound, nothing written) once the task's record is another one: a
// record with another nonce, and a later record of the ID after retention
// deleted the first (simulation seed 1100034445: a capture of the earlier
// record's pod wrote its lines at the start of the later record's log).
func testLogOfAnotherRecord(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	key := store.LogKey{TaskID: "reused", Container: "main"}
	first := Sample("reused")
	first.Nonce = "first"
	first.Terminal = true
	mustCreate(t, s, first)
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("other\n"), Nonce: "other"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AppendLog with another record's nonce: err = %v, want ErrNotFound", err)
	}
	if _, _, err := l.ReadLog(ctx, key, 0, 10); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReadLog after a refused first append: err = %v, want ErrNotFound (no log)", err)
	}
	info, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("first\n"), Nonce: "first"})
	if err != nil || info.Size != 6 {
		t.Fatalf("AppendLog with the record's nonce: info %+v, err %v; want size 6", info, err)
	}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Offset: 6, Data: []byte("x"), Nonce: "other"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AppendLog at the size with another record's nonce: err = %v, want ErrNotFound", err)
	}
	if info, err := l.AppendLog(ctx, key, store.LogAppend{Offset: 6, Data: []byte("any\n")}); err != nil || info.Size != 10 {
		t.Errorf("AppendLog without a nonce: info %+v, err %v; want size 10 (no check)", info, err)
	}

	r, ok := s.(store.Retention)
	if !ok {
		return
	}
	// Retention deletes the record and its log; the ID is used again.
	if n, err := r.DeleteFinishedBefore(ctx, waitPast(t, time.Now()), 100); err != nil || n != 1 {
		t.Fatalf("DeleteFinishedBefore = %d, err %v; want the 1 finished task", n, err)
	}
	second := Sample("reused")
	second.Nonce = "second"
	mustCreate(t, s, second)
	// The first record's capture, outliving it, writes at offset 0.
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("first, late\n"), Nonce: "first", Complete: true}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AppendLog of the earlier record into the later one's log: err = %v, want ErrNotFound", err)
	}
	if keys, err := l.LogKeys(ctx, "reused"); err != nil || len(keys) != 0 {
		t.Errorf("LogKeys after the refused append = %v, err %v; want none", keys, err)
	}
	if info, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("second\n"), Nonce: "second", Complete: true}); err != nil || info.Size != 7 {
		t.Errorf("AppendLog of the later record: info %+v, err %v; want size 7", info, err)
	}
	if b, _, err := l.ReadLog(ctx, key, 0, 100); err != nil || string(b) != "second\n" {
		t.Errorf("ReadLog = %q, err %v; want only the later record's line", b, err)
	}
}

// testLogUnknownTask: a log belongs to a task record.
func testLogUnknownTask(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	key := store.LogKey{TaskID: "missing", Container: "main"}
	if _, err := l.AppendLog(ctx, key, store.LogAppend{Data: []byte("x")}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AppendLog of a task without a record: err = %v, want ErrNotFound", err)
	}
	if _, _, err := l.ReadLog(ctx, key, 0, 10); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReadLog of a task without a record: err = %v, want ErrNotFound", err)
	}
	mustCreate(t, s, Sample("a"))
	if _, _, err := l.ReadLog(ctx, store.LogKey{TaskID: "a", Container: "main"}, 0, 10); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReadLog of a log never appended: err = %v, want ErrNotFound", err)
	}
	for _, id := range []string{"missing", "a"} {
		if keys, err := l.LogKeys(ctx, id); err != nil || len(keys) != 0 {
			t.Errorf("LogKeys(%s) = %v, err %v; want none", id, keys, err)
		}
	}
}

// testLogKeysOrder lists logs by attempt (numerically) then container, and
// only the task's own.
func testLogKeysOrder(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	mustCreate(t, s, Sample("a"))
	mustCreate(t, s, Sample("a2"))
	var want []store.LogKey
	for _, k := range []store.LogKey{
		{TaskID: "a", Attempt: 10, Container: "main"},
		{TaskID: "a", Attempt: 2, Container: "main"},
		{TaskID: "a", Attempt: 0, Container: "sidecar"},
		{TaskID: "a", Attempt: 0, Container: "main"},
		{TaskID: "a2", Attempt: 0, Container: "main"},
		{TaskID: "a", Attempt: 1, Container: "main"},
	} {
		if _, err := l.AppendLog(ctx, k, store.LogAppend{Data: []byte(k.String())}); err != nil {
			t.Fatal(err)
		}
		if k.TaskID == "a" {
			want = append(want, k)
		}
	}
	slices.SortFunc(want, func(a, b store.LogKey) int {
		if a.Attempt != b.Attempt {
			return a.Attempt - b.Attempt
		}
		return strings.Compare(a.Container, b.Container)
	})
	got, err := l.LogKeys(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LogKeys(a) (-want +got):\n%s", diff)
	}
	for _, k := range got {
		if data, _, err := l.ReadLog(ctx, k, 0, 100); err != nil || string(data) != k.String() {
			t.Errorf("ReadLog(%v) = %q, err %v; want %q", k, data, err, k.String())
		}
	}
}

// testLogConcurrentAppends appends to 24 logs at once (different tasks,
// attempts and containers), each in its own goroutine: every log reads back
// exactly as appended.
func testLogConcurrentAppends(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	const logs = 24
	keys := make([]store.LogKey, logs)
	for i := range keys {
		id := fmt.Sprintf("c-%d", i%8)
		if i < 8 {
			mustCreate(t, s, Sample(id))
		}
		keys[i] = store.LogKey{TaskID: id, Attempt: i / 8, Container: []string{"main", "sidecar"}[i%2]}
	}
	data := make([][]byte, logs)
	var wg sync.WaitGroup
	for i, k := range keys {
		data[i] = logData(uint64(100+i), 20_000+i*100)
		wg.Go(func() { appendChunks(t, l, k, data[i], uint64(i), 700) })
	}
	wg.Wait()
	for i, k := range keys {
		got, info, err := l.ReadLog(ctx, k, 0, 1<<20)
		if err != nil || !bytes.Equal(got, data[i]) || info.Size != int64(len(data[i])) {
			t.Errorf("%v: %d bytes (size %d), err %v; want the %d appended", k, len(got), info.Size, err, len(data[i]))
		}
	}
}

// testLogDefaultCap appends a little over a megabyte: far from the default
// cap, nothing is truncated.
func testLogDefaultCap(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	mustCreate(t, s, Sample("a"))
	key := store.LogKey{TaskID: "a", Container: "main"}
	data := logData(9, 1<<20+1)
	info := appendChunks(t, l, key, data, 9, 256<<10)
	if info.Truncated || info.Size != int64(len(data)) {
		t.Errorf("info %+v, want all %d bytes, not truncated", info, len(data))
	}
}

// testLogCapTruncates checks truncation at the cap (testLogCap bytes): bytes beyond
// it are dropped, the marker is appended once, on a line of its own, and
// later appends still save the cursor and the complete flag.
func testLogCapTruncates(t *testing.T, s store.Store) {
	l := logsOf(t, s)
	ctx := context.Background()
	mustCreate(t, s, Sample("a"))
	marker := store.LogTruncatedMarker(testLogCap)
	line := func(n int) []byte { return append(bytes.Repeat([]byte("x"), n-1), '\n') }
	tests := map[string]struct {
		appends [][]byte
		want    []byte
	}{
		"under the cap": {[][]byte{line(500), line(499)}, append(line(500), line(499)...)},
		"exactly the cap": {[][]byte{line(500), line(500)},
			append(line(500), line(500)...)},
		"one chunk over the cap, cut mid-line": {[][]byte{bytes.Repeat([]byte("y"), 1500)},
			[]byte(strings.Repeat("y", testLogCap) + "\n" + marker)},
		"cut at a line end": {[][]byte{line(600), line(400), line(10)},
			[]byte(string(line(600)) + string(line(400)) + marker)},
		"full log without a newline, then one byte": {[][]byte{bytes.Repeat([]byte("z"), testLogCap), []byte("!")},
			[]byte(strings.Repeat("z", testLogCap) + "\n" + marker)},
		"full log ending a line, then more": {[][]byte{line(300), line(700), []byte("more\n")},
			[]byte(string(line(300)) + string(line(700)) + marker)},
		"cut mid-line in a later chunk": {[][]byte{line(300), line(300), bytes.Repeat([]byte("w"), 600)},
			[]byte(string(line(300)) + string(line(300)) + strings.Repeat("w", 400) + "\n" + marker)},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			key := store.LogKey{TaskID: "a", Attempt: i, Container: "main"}
			var info store.LogInfo
			for j, chunk := range tc.appends {
				var err error
				info, err = l.AppendLog(ctx, key, store.LogAppend{Offset: info.Size, Data: chunk, Cursor: fmt.Appendf(nil, "c%d", j)})
				if err != nil {
					t.Fatalf("append %d: %v", j, err)
				}
			}
			truncated := len(tc.want) > testLogCap
			if info.Size != int64(len(tc.want)) || info.Truncated != truncated {
				t.Errorf("info %+v, want size %d truncated %v", info, len(tc.want), truncated)
			}
			got, _, err := l.ReadLog(ctx, key, 0, 1<<20)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("log (err %v):\n%q\nwant:\n%q", err, got, tc.want)
			}
			if !truncated {
				return
			}
			// Later appends: data dropped, no second marker, cursor and
			// complete saved.
			after, err := l.AppendLog(ctx, key, store.LogAppend{Offset: info.Size, Data: []byte("dropped\n"), Cursor: []byte("later")})
			if err != nil || after.Size != info.Size || !after.Truncated || string(after.Cursor) != "later" {
				t.Errorf("append after truncation: info %+v, err %v", after, err)
			}
			after, err = l.AppendLog(ctx, key, store.LogAppend{Offset: info.Size, Data: []byte("dropped too\n"), Cursor: []byte("last"), Complete: true})
			if err != nil || after.Size != info.Size || !after.Complete || string(after.Cursor) != "last" {
				t.Errorf("completing append after truncation: info %+v, err %v", after, err)
			}
			if got, _, _ := l.ReadLog(ctx, key, 0, 1<<20); !bytes.Equal(got, tc.want) {
				t.Errorf("appends after truncation changed the log:\n%q", got)
			}
			if n := bytes.Count(got, []byte(marker)); n != 1 {
				t.Errorf("%d markers, want 1", n)
			}
		})
	}
}

// testRetention deletes old terminal tasks in batches: only those, with
// their logs and labels; old unfinished tasks and recent finished ones stay,
// with their logs.
func testRetention(t *testing.T, s store.Store) {
	r, ok := s.(store.Retention)
	if !ok {
		t.Skip("the store does not implement store.Retention")
	}
	l, hasLogs := s.(store.Logs)
	p, hasPager := s.(store.Pager)
	ctx := context.Background()
	newTask := func(id string, terminal bool) store.Record {
		rec := Sample(id)
		rec.Terminal = terminal
		rec.Labels = map[string]string{"retention": "test", "id": id}
		rec = mustCreate(t, s, rec)
		if hasLogs {
			for _, c := range []string{"main", "sidecar"} {
				if _, err := l.AppendLog(ctx, store.LogKey{TaskID: id, Container: c}, store.LogAppend{Data: []byte(id + " " + c + "\n"), Complete: true}); err != nil {
					t.Fatal(err)
				}
			}
		}
		return rec
	}
	var oldDone, oldRunning []string
	var last store.Record
	for i := range 5 {
		last = newTask(fmt.Sprintf("old-done-%d", i), true)
		oldDone = append(oldDone, last.ID)
	}
	last = newTask("old-running", false)
	oldRunning = append(oldRunning, last.ID)
	// A finished task updated to terminal later is judged by its last update.
	lateFinish := newTask("late-finish", false)
	// The cutoff: after every old task's last update, before every later one.
	cutoff := waitPast(t, last.UpdatedAt)
	waitPast(t, cutoff)
	lateFinish.Terminal = true
	if _, err := s.Update(ctx, lateFinish); err != nil {
		t.Fatal(err)
	}
	recent := newTask("recent-done", true)

	if _, err := r.DeleteFinishedBefore(ctx, cutoff, 0); err == nil {
		t.Error("batch 0: err = nil, want an error")
	}
	var counts []int
	for total := 0; ; {
		n, err := r.DeleteFinishedBefore(ctx, cutoff, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n > 2 {
			t.Fatalf("batch of 2 deleted %d", n)
		}
		counts = append(counts, n)
		if n == 0 {
			break
		}
		if total += n; total > 5 {
			t.Fatalf("deleted %d tasks, more than the 5 old finished ones", total)
		}
	}
	t.Logf("deleted per call: %v", counts)
	for _, id := range oldDone {
		if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%s) after retention: err = %v, want ErrNotFound", id, err)
		}
		if hasLogs {
			if keys, err := l.LogKeys(ctx, id); err != nil || len(keys) != 0 {
				t.Errorf("LogKeys(%s) after retention = %v, err %v; want none", id, keys, err)
			}
			if _, _, err := l.ReadLog(ctx, store.LogKey{TaskID: id, Container: "main"}, 0, 10); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("ReadLog(%s) after retention: err = %v, want ErrNotFound", id, err)
			}
		}
		if hasPager {
			page, err := p.Page(ctx, store.PageOptions{Labels: map[string]string{"id": id}})
			if err != nil || len(page.Records) != 0 {
				t.Errorf("Page(id=%s) after retention: %d records, err %v", id, len(page.Records), err)
			}
		}
	}
	for _, id := range append(oldRunning, "late-finish", recent.ID) {
		if _, err := s.Get(ctx, id); err != nil {
			t.Errorf("Get(%s) after retention: %v, want it kept", id, err)
		}
		if hasLogs {
			keys, err := l.LogKeys(ctx, id)
			if err != nil || len(keys) != 2 {
				t.Errorf("LogKeys(%s) after retention = %v, err %v; want both logs", id, keys, err)
			}
			if got, _, err := l.ReadLog(ctx, store.LogKey{TaskID: id, Container: "main"}, 0, 100); err != nil || string(got) != id+" main\n" {
				t.Errorf("ReadLog(%s) after retention = %q, err %v", id, got, err)
			}
		}
	}
	if hasPager {
		page, err := p.Page(ctx, store.PageOptions{Labels: map[string]string{"retention": "test"}})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"recent-done", "late-finish", "old-running"}, ids(page.Records)); diff != "" {
			t.Errorf("Page(retention=test) after retention (-want +got):\n%s", diff)
		}
	}
	// Everything finished before a later cutoff goes too.
	if n, err := r.DeleteFinishedBefore(ctx, waitPast(t, time.Now()), 100); err != nil || n != 2 {
		t.Errorf("DeleteFinishedBefore(now, 100) = %d, err %v; want the 2 finished tasks", n, err)
	}
	if _, err := s.Get(ctx, "old-running"); err != nil {
		t.Errorf("the unfinished task was deleted: %v", err)
	}
}

// waitPast returns a time after t, once the real clock has passed it (the
// stores of Run use the real clock): a store write after waitPast returns
// has a later time.
func waitPast(t *testing.T, after time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := time.Now()
		if now.After(after) {
			return now
		}
		if now.After(deadline) {
			t.Fatalf("the clock did not pass %v", after)
		}
		time.Sleep(time.Microsecond)
	}
}
