package web

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// TestWebClusters: a service with two clusters (east and west: two names
// for the local cluster, whose instances keep apart by their pods'
// executor label) shows each task's cluster in the list's Cluster column,
// offers the clusters in the filters, and a filter by cluster keeps that
// cluster's tasks only; a task's page says its cluster, and each attempt's.
func TestWebClusters(t *testing.T) {
	env := clustertest.New(t)
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	doc := fmt.Sprintf("clusters:\n- {name: east, kubeconfig: %q}\n- {name: west, kubeconfig: %q}\n", env.Kubeconfig, env.Kubeconfig)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startService(t, env, "--config", cfg)
	b := newBrowser(t, s.URL, 1280, 900)
	b.signIn(s.Token)

	east := s.submit(shTask("on-east", "  placement: {cluster: east}", `echo east`))
	west := s.submit(shTask("on-west", "  placement: {cluster: west}", `echo west`))
	cell := func(id string) string { return row(id) + `?.querySelector('td[data-label=Cluster]')?.textContent` }
	b.wait(time.Minute, "both tasks in the list, with their clusters", fmt.Sprintf(`%s === 'east' && %s === 'west'`, cell(east.ID), cell(west.ID)))
	if got := eval[[]string](b, `[...document.querySelectorAll('table.tasks thead th')].map((th) => th.textContent)`); len(got) < 4 || got[3] != "Cluster" {
		b.fatalf("the list's columns %v: want Cluster after Namespace", got)
	}
	if got := eval[[]string](b, `[...document.querySelectorAll('#f-cluster option')].map((o) => o.value)`); fmt.Sprint(got) != "[ east west]" {
		b.fatalf("the cluster filter offers %q, want All, east and west", got)
	}
	b.checkAccessible("the list of a service with clusters")

	b.do(chromedp.SetValue(chromedp.CSS("#f-cluster"), "west"), chromedp.Click(chromedp.CSS("form.filters button[type=submit]")))
	b.wait(30*time.Second, "the list of west's tasks", fmt.Sprintf(`location.search === '?cluster=west' && document.querySelector('main').dataset.loaded === 'true' && %s && !%s`, row(west.ID), row(east.ID)))
	b.notReloaded()

	b.openTask(west.ID)
	b.wait(time.Minute, "the task's page with its cluster and its attempt's", `[...document.querySelectorAll('.facts dt')].some((dt) => dt.textContent === 'Cluster' && dt.nextElementSibling.textContent === 'west') && `+
		`document.querySelector('.tl-attempt .cluster')?.textContent === 'west'`)
}
