package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kubetask/kubetask/internal/pgtest"
	"github.com/kubetask/kubetask/pkg/store"
)

// postgresPlanFixture fills a new database with 20,000 tasks (20 namespaces,
// 4 phases, 8 reasons, 3 clusters, names by team and app, two labels each),
// 30 more whose values are rare, and the logs of 2,000 of them, then
// analyzes it, so the planner has the statistics of a table where an index
// beats a scan. It returns a connection to it.
func postgresPlanFixture(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	url := pgtest.Database(t)
	s, err := store.OpenPostgres(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	for _, q := range []string{
		`INSERT INTO tasks (id, namespace, name, executor, labels, origin, task, attempt, phase, reason, message,
			exit_code, retryable, result, terminal, cancelled_at, next_attempt_at, pod_created, attempts,
			created_at, updated_at, version, cluster)
		SELECT format('task-%s', lpad(i::text, 6, '0')),
			convert_to('team-' || i % 20, 'UTF8'),
			convert_to(format('team-%s-app-%s-%s', i % 20, i % 7, i), 'UTF8'),
			convert_to('exec-' || i % 3, 'UTF8'),
			json_build_object('app', format('team-%s-app-%s', i % 20, i % 7), 'env', (ARRAY['prod', 'dev'])[1 + i % 2]),
			'', '{}', 0,
			convert_to((ARRAY['Pending', 'Running', 'Succeeded', 'Failed'])[1 + i % 4], 'UTF8'),
			convert_to((ARRAY['Submitted', 'ContainerRunning', 'Completed', 'Error', 'OOMKilled', 'Evicted', 'DeadlineExceeded', 'Cancelled'])[1 + i % 8], 'UTF8'),
			'', NULL, false, NULL, i % 4 >= 2, NULL, NULL, true, '[]',
			1800000000000000000 + i::bigint * 1000000, 1800000000000000000 + i::bigint * 1000000 + 5, 3,
			convert_to('cluster-' || i % 3, 'UTF8')
		FROM generate_series(1, 20000) AS i`,
		// 30 tasks whose namespace, phase, reason, name, cluster and app
		// label are rare, so the planner's statistics make their indexes
		// the best.
		`INSERT INTO tasks (id, namespace, name, executor, labels, origin, task, attempt, phase, reason, message,
			exit_code, retryable, result, terminal, cancelled_at, next_attempt_at, pod_created, attempts,
			created_at, updated_at, version, cluster)
		SELECT format('task-%s', lpad(i::text, 6, '0')), convert_to('rare-ns', 'UTF8'),
			convert_to('rare-name-' || i, 'UTF8'), convert_to('exec-0', 'UTF8'),
			json_build_object('app', 'rare-app', 'env', 'prod'), '', '{}', 0,
			convert_to('Unknown', 'UTF8'), convert_to('Rare', 'UTF8'),
			'', NULL, false, NULL, false, NULL, NULL, true, '[]',
			1800000000000000000 + i::bigint * 1000000, 1800000000000000000 + i::bigint * 1000000 + 5, 3,
			convert_to('rare-cluster', 'UTF8')
		FROM generate_series(20001, 20030) AS i`,
		`INSERT INTO task_labels (task_id, key, value, created_at)
		SELECT t.id, convert_to(l.key, 'UTF8'), convert_to(l.value, 'UTF8'), t.created_at
		FROM tasks AS t, json_each_text(t.labels) AS l`,
		`INSERT INTO logs (task_id, attempt, container, size, complete, truncated, cursor)
		SELECT id, 0, convert_to(c, 'UTF8'), 1000, true, false, NULL
		FROM tasks, unnest(ARRAY['main', 'sidecar']) AS c WHERE id <= 'task-002000'`,
		`INSERT INTO log_chunks (task_id, attempt, container, "offset", data)
		SELECT task_id, attempt, container, o * 100, convert_to(repeat('x', 100), 'UTF8')
		FROM logs, generate_series(0, 9) AS o`,
		`ANALYZE`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("fixture: %v\n%s", err, q)
		}
	}
	return c
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	SubPlan   string     `json:"Subplan Name"`
	Plans     []planNode `json:"Plans"`
	IndexCond string     `json:"Index Cond"`
}

// walk calls fn on n and every node below it, depth first.
func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// String is the plan in one line per node, for failure messages.
func (n planNode) String() string {
	var b strings.Builder
	var rec func(n planNode, depth int)
	rec = func(n planNode, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), n.NodeType)
		if n.Index != "" {
			fmt.Fprintf(&b, " using %s", n.Index)
		}
		if n.Relation != "" {
			fmt.Fprintf(&b, " on %s", n.Relation)
		}
		if n.IndexCond != "" {
			fmt.Fprintf(&b, " (%s)", n.IndexCond)
		}
		b.WriteString("\n")
		for _, c := range n.Plans {
			rec(c, depth+1)
		}
	}
	rec(n, 0)
	return b.String()
}

// explain returns the plan of query with args: a custom plan (for these
// values), or the generic plan a prepared statement switches to after five
// executions (plan_cache_mode force_generic_plan), which pgx's statement
// cache uses.
func explain(t *testing.T, c *pgx.Conn, generic bool, query string, args ...any) planNode {
	t.Helper()
	ctx := context.Background()
	mode := "force_custom_plan"
	if generic {
		mode = "force_generic_plan"
	}
	if _, err := c.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	if err := c.Deallocate(ctx, "plan_check"); err != nil {
		t.Fatal(err)
	}
	sd, err := c.Prepare(ctx, "plan_check", query)
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, query)
	}
	if len(sd.ParamOIDs) != len(args) {
		t.Fatalf("%d parameters, %d arguments", len(sd.ParamOIDs), len(args))
	}
	// EXECUTE takes its parameters as expressions: literals, cast to the
	// parameters' types.
	params := make([]string, len(args))
	for i, a := range args {
		typ, ok := c.TypeMap().TypeForOID(sd.ParamOIDs[i])
		if !ok {
			t.Fatalf("parameter $%d: unknown type %d", i+1, sd.ParamOIDs[i])
		}
		params[i] = sqlLiteral(t, a, typ.Name)
	}
	var out []byte
	err = c.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE plan_check(`+strings.Join(params, ", ")+`)`).Scan(&out)
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, query)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain output %s: %v", out, err)
	}
	return plans[0].Plan
}

// sqlLiteral returns a as an SQL literal of type typ, for the argument
// types of the store's statements.
func sqlLiteral(t *testing.T, a any, typ string) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'::" + typ }
	switch v := a.(type) {
	case nil:
		return "NULL::" + typ
	case string:
		return quote(v)
	case []byte:
		switch {
		case v == nil:
			return "NULL::" + typ
		case typ == "bytea":
			return quote(fmt.Sprintf(`\x%x`, v))
		default: // json
			return quote(string(v))
		}
	case [][]byte:
		parts := make([]string, len(v))
		for i, b := range v {
			parts[i] = sqlLiteral(t, b, "bytea")
		}
		return "ARRAY[" + strings.Join(parts, ", ") + "]::" + typ
	case bool, int, int32, int64:
		return quote(fmt.Sprint(v))
	case *int32:
		if v == nil {
			return "NULL::" + typ
		}
		return quote(fmt.Sprint(*v))
	case *int64:
		if v == nil {
			return "NULL::" + typ
		}
		return quote(fmt.Sprint(*v))
	default:
		t.Fatalf("no literal for %T", a)
		return ""
	}
}

// TestPostgresPagePlans checks with EXPLAIN, on a table of 20,000 analyzed
// records, the plans of the first page and of a continued page of every
// filter, alone and combined:
//   - no plan scans a table or counts, and every plan stops after the page;
//   - a selective filter (a rare value) reads the range of its own index;
//   - a common value reads its own index or the ordered range of
//     tasks_by_created, checking the filter on each row;
//   - no filter, the time bounds and a label read their index in page
//     order, with no sort;
//   - a plan may sort only rows that index conditions selected (the name
//     prefix's range always; the matches of a rare value or of filters that
//     together match few rows when the planner finds that cheaper), never a
//     whole index or table.
//
// Page runs its statements unnamed, so they are planned for their
// arguments (custom plans), as here. The "statements" subtest checks the
// store's other statements on the same fixture.
func TestPostgresPagePlans(t *testing.T) {
	t.Parallel()
	c := postgresPlanFixture(t)
	t.Run("statements", func(t *testing.T) { testPostgresStatementPlans(t, c) })
	yes, no := true, false
	day := time.Unix(0, 1800000000000000000+10000*1000000)
	const created = "tasks_by_created"
	tests := map[string]struct {
		opts store.PageOptions
		// indexes are those the plan may read first; ordered plans must read
		// in page order, without sorting.
		indexes []string
		ordered bool
	}{
		"no filter":              {opts: store.PageOptions{}, indexes: []string{created}, ordered: true},
		"namespace, rare":        {opts: store.PageOptions{Namespace: "rare-ns"}, indexes: []string{"tasks_by_namespace", "tasks_by_namespace_phase"}},
		"namespace":              {opts: store.PageOptions{Namespace: "team-3"}, indexes: []string{"tasks_by_namespace", created}},
		"cluster, rare":          {opts: store.PageOptions{Cluster: "rare-cluster"}, indexes: []string{"tasks_by_cluster_created", "tasks_by_cluster"}},
		"cluster":                {opts: store.PageOptions{Cluster: "cluster-1"}, indexes: []string{"tasks_by_cluster_created", created}},
		"namespace, cluster":     {opts: store.PageOptions{Namespace: "team-3", Cluster: "cluster-1"}, indexes: []string{"tasks_by_namespace", "tasks_by_cluster_created", "tasks_by_cluster", created}},
		"phase, rare":            {opts: store.PageOptions{Phase: "Unknown"}, indexes: []string{"tasks_by_phase"}},
		"phase":                  {opts: store.PageOptions{Phase: "Failed"}, indexes: []string{"tasks_by_phase", created}},
		"reason, rare":           {opts: store.PageOptions{Reason: "Rare"}, indexes: []string{"tasks_by_reason"}},
		"reason":                 {opts: store.PageOptions{Reason: "OOMKilled"}, indexes: []string{"tasks_by_reason", created}},
		"name prefix, rare":      {opts: store.PageOptions{NamePrefix: "rare-name-"}, indexes: []string{"tasks_by_name"}},
		"name prefix":            {opts: store.PageOptions{NamePrefix: "team-5-app-1-"}, indexes: []string{"tasks_by_name"}},
		"name prefix, 0xff":      {opts: store.PageOptions{NamePrefix: "\xff\xff"}, indexes: []string{"tasks_by_name"}},
		"terminal":               {opts: store.PageOptions{Terminal: &yes}, indexes: []string{"tasks_by_terminal_created", created}},
		"not terminal":           {opts: store.PageOptions{Terminal: &no}, indexes: []string{"tasks_by_terminal_created", created}},
		"created after":          {opts: store.PageOptions{CreatedAfter: day}, indexes: []string{created}, ordered: true},
		"created before":         {opts: store.PageOptions{CreatedBefore: day}, indexes: []string{created}, ordered: true},
		"created between":        {opts: store.PageOptions{CreatedAfter: day, CreatedBefore: day.Add(time.Second)}, indexes: []string{created}, ordered: true},
		"label, rare":            {opts: store.PageOptions{Labels: map[string]string{"app": "rare-app"}}, indexes: []string{"task_labels_by_value"}},
		"label":                  {opts: store.PageOptions{Labels: map[string]string{"app": "team-3-app-2"}}, indexes: []string{"task_labels_by_value"}},
		"label, common":          {opts: store.PageOptions{Labels: map[string]string{"env": "prod"}}, indexes: []string{"task_labels_by_value"}, ordered: true},
		"namespace, phase":       {opts: store.PageOptions{Namespace: "team-3", Phase: "Running"}, indexes: []string{"tasks_by_namespace_phase", "tasks_by_namespace", "tasks_by_phase", created}},
		"namespace, phase, rare": {opts: store.PageOptions{Namespace: "rare-ns", Phase: "Unknown"}, indexes: []string{"tasks_by_namespace_phase", "tasks_by_namespace", "tasks_by_phase"}},
		"two labels, namespace, created after": {
			opts:    store.PageOptions{Labels: map[string]string{"app": "team-3-app-2", "env": "prod"}, Namespace: "team-3", CreatedAfter: day},
			indexes: []string{"task_labels_by_value"}},
		"namespace, phase, label": {opts: store.PageOptions{Namespace: "team-3", Phase: "Running", Labels: map[string]string{"env": "prod"}},
			indexes: []string{"tasks_by_namespace_phase", "tasks_by_namespace", "tasks_by_phase", created}},
		"namespace, reason":   {opts: store.PageOptions{Namespace: "team-3", Reason: "Error"}, indexes: []string{"tasks_by_reason", "tasks_by_namespace", created}},
		"phase, terminal":     {opts: store.PageOptions{Phase: "Running", Terminal: &yes}, indexes: []string{"tasks_by_phase", "tasks_by_terminal_created", created}},
		"namespace, terminal": {opts: store.PageOptions{Namespace: "team-3", Terminal: &yes}, indexes: []string{"tasks_by_namespace", "tasks_by_terminal_created", created}},
		"reason, name prefix": {opts: store.PageOptions{Reason: "Error", NamePrefix: "team-5"}, indexes: []string{"tasks_by_reason", "tasks_by_name", created}},
		"namespace, name, time": {opts: store.PageOptions{Namespace: "team-3", NamePrefix: "team-3-app-1", CreatedBefore: day},
			indexes: []string{"tasks_by_name", "tasks_by_namespace", created}},
		"every filter": {opts: store.PageOptions{Namespace: "team-3", Phase: "Succeeded", Reason: "Completed", NamePrefix: "team-3",
			Labels: map[string]string{"env": "prod"}, CreatedAfter: day, CreatedBefore: day.Add(time.Hour), Terminal: &yes},
			indexes: []string{"tasks_by_namespace_phase", "tasks_by_namespace", "tasks_by_phase", "tasks_by_reason", created}},
		// Several namespaces: one range per namespace, merged (the driver
		// checked is the first namespace's).
		"namespaces":        {opts: store.PageOptions{Namespaces: []string{"team-3", "team-4", "rare-ns"}}, indexes: []string{"tasks_by_namespace", "tasks_by_namespace_phase", created}},
		"namespaces, label": {opts: store.PageOptions{Namespaces: []string{"team-3", "team-4"}, Labels: map[string]string{"app": "team-3-app-2"}}, indexes: []string{"task_labels_by_value"}},
		"namespaces, phase": {opts: store.PageOptions{Namespaces: []string{"team-3", "team-4"}, Phase: "Running"}, indexes: []string{"tasks_by_namespace_phase", "tasks_by_namespace", "tasks_by_phase", created}},
	}
	last := store.Record{ID: "task-012000", CreatedAt: day.Add(2 * time.Second)}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tok, err := store.ContinueToken(tc.opts, last)
			if err != nil {
				t.Fatal(err)
			}
			next := tc.opts
			next.Continue = tok
			for _, page := range []struct {
				name string
				opts store.PageOptions
			}{{"first page", tc.opts}, {"continued", next}} {
				query, args, err := store.PostgresPageSQL(page.opts)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(strings.ToUpper(query), "COUNT(") || strings.Contains(strings.ToUpper(query), " LIKE ") {
					t.Errorf("%s: the statement counts or uses LIKE: %s", page.name, query)
				}
				plan := explain(t, c, false, query, args...)
				t.Logf("%s:\n%s", page.name, plan)
				checkPagePlan(t, page.name, plan, tc.indexes, tc.ordered)
			}
		})
	}
}

// checkPagePlan checks a page's plan (see TestPostgresPagePlans).
func checkPagePlan(t *testing.T, where string, plan planNode, indexes []string, ordered bool) {
	t.Helper()
	if plan.NodeType != "Limit" && (plan.NodeType != "Sort" || len(plan.Plans) != 1 || !plan.Plans[0].contains("Limit")) {
		t.Errorf("%s: the plan does not stop after the page:\n%s", where, plan)
	}
	var driver string
	plan.walk(func(n planNode) {
		switch {
		case n.NodeType == "Seq Scan":
			t.Errorf("%s: scans %s:\n%s", where, n.Relation, plan)
		case n.NodeType == "Aggregate":
			t.Errorf("%s: aggregates:\n%s", where, plan)
		case strings.Contains(n.NodeType, "Sort"):
			if ordered {
				t.Errorf("%s: sorts:\n%s", where, plan)
			}
			n.walk(func(m planNode) {
				if strings.Contains(m.NodeType, "Index") && m.IndexCond == "" {
					t.Errorf("%s: sorts a whole index (%s):\n%s", where, m.Index, plan)
				}
			})
		case n.Index != "" && driver == "":
			driver = n.Index
		}
	})
	if !slices.Contains(indexes, driver) {
		t.Errorf("%s: reads %q first, want one of %v:\n%s", where, driver, indexes, plan)
	}
}

// contains reports whether n or a node below it has the node type typ.
func (n planNode) contains(typ string) bool {
	found := false
	n.walk(func(m planNode) { found = found || m.NodeType == typ })
	return found
}

// testPostgresStatementPlans checks, on TestPostgresPagePlans' fixture, that
// the other statements of the store (Get, Create, Update, the log archive,
// retention, and the deletes that the foreign keys cascade to) search an
// index, in custom and generic plans (they are prepared statements, which
// switch to a generic plan): no plan scans a table, but kubetask_terms
// (a row per executor instance, which the planner reads whole while it is
// small).
func testPostgresStatementPlans(t *testing.T, c *pgx.Conn) {
	for name, st := range store.PostgresStatements {
		t.Run(name, func(t *testing.T) {
			for _, generic := range []bool{false, true} {
				plan := explain(t, c, generic, st.SQL, st.Args...)
				t.Logf("generic plan %v:\n%s", generic, plan)
				plan.walk(func(n planNode) {
					if n.NodeType == "Seq Scan" && n.Relation != "kubetask_terms" {
						t.Errorf("generic plan %v: scans %s:\n%s", generic, n.Relation, plan)
					}
				})
			}
		})
	}
}
