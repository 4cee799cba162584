package web

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
	"github.com/kubetask/kubetask/pkg/api"
)

// layoutShiftObserver records the page's layout shifts from its start
// (buffered), as Chromium reports them to PerformanceObserver: the same
// entries Lighthouse's cumulative layout shift adds up.
const layoutShiftObserver = `window.kubetaskShifts = [];
new PerformanceObserver((l) => { for (const e of l.getEntries()) if (!e.hadRecentInput) window.kubetaskShifts.push({value: e.value, sources: (e.sources || []).map((s) => s.node ? (s.node.className || s.node.nodeName) : '?').join(',')}); })
  .observe({type: 'layout-shift', buffered: true});`

// cls is the sum of the recorded shifts and what moved.
func cls(b *tab) (float64, string) {
	return eval[float64](b, `window.kubetaskShifts.reduce((a, e) => a + e.value, 0)`),
		eval[string](b, `JSON.stringify(window.kubetaskShifts)`)
}

// The list and a task's page do not jump while their data arrives: the
// space that data fills is reserved, so the cumulative layout shift of a
// fresh load stays at most 0.1 (Lighthouse's "good").
func TestWebLayoutShift(t *testing.T) {
	env := clustertest.New(t)
	s := startService(t, env)
	var last string
	for i := range 3 {
		last = s.submit(shTask(fmt.Sprintf("done-%d", i), "", `echo "line one"; echo "line two"`)).ID
	}
	s.waitTask(last, time.Minute, "the last task to finish", func(tk api.Task) bool { return tk.Terminal })
	// A desktop window, and a phone as Lighthouse's default run emulates one
	// (412x823 at 1.75 device pixels per CSS pixel, a 4x slower CPU): on it,
	// timers and data land in other frames than on a desktop, which is how
	// the live mark's "Connecting…" turning into "Live" came to rewrap the
	// task page's heading (a shift of 0.31 that the desktop run missed).
	for _, size := range []struct {
		w, h     int
		phone    bool
		throttle float64
	}{{1350, 940, false, 1}, {412, 823, true, 4}} {
		b := newBrowser(t, s.URL, size.w, size.h)
		b.signIn(s.Token)
		// Every document from now on records its shifts from its start.
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: layoutShiftObserver}); err != nil {
			t.Fatal(err)
		}
		if size.phone {
			if _, err := chromedp.Call(ctx, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{Width: int64(size.w), Height: int64(size.h), DeviceScaleFactor: 1.75, Mobile: true}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := chromedp.Call(ctx, emulation.SetCPUThrottlingRate, emulation.SetCPUThrottlingRateParams{Rate: size.throttle}); err != nil {
			t.Fatal(err)
		}
		cancel()
		measure := func(path, ready string) {
			t.Helper()
			b.open(path)
			b.wait(30*time.Second, path+" loaded", ready)
			v, what := cls(b)
			t.Logf("%dx%d %s: cumulative layout shift %.3f %s", size.w, size.h, path, v, what)
			if v > 0.1 {
				t.Errorf("%dx%d %s: cumulative layout shift %.3f, want at most 0.1; shifts: %s", size.w, size.h, path, v, what)
			}
		}
		measure("/", `document.querySelector('main').dataset.loaded === 'true' && document.querySelector('.live').dataset.state === 'live'`)
		measure("/tasks/"+last, `document.querySelector('main').dataset.terminal === 'true' && document.querySelector('.logview')?.dataset.state === 'complete' && document.querySelector('.live').dataset.state === 'live'`)
	}
}
