package simulation

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Retention, as `kubetask serve` runs it: finished records are deleted
// oldest first (store.Retention, the order DeleteFinishedBefore takes), and
// a user may then submit a task of the same ID again, which makes a new
// record with a new nonce (plan.prev). Pods of the deleted record may still
// be there (kept ones) or still be on their way (a stale term's creation):
// the new record must never take one of them.
//
// A record is deleted only once no pod of it holds kubetask's finalizer,
// which is released only once its logs are archived, so that invariant 10
// can be judged on what was archived when it went (world.retired).

// finished caches oldestFinished until a record is written or deleted
// (listing every record at each of the world's steps cost 7 % of a run).
type finished struct {
	writes int // seenRecords.writes when computed; -1: not computed
	rec    store.Record
	ok     bool
}

// oldestFinished is the finished record retention deletes next.
func (w *world) oldestFinished() (store.Record, bool) {
	w.hist.mu.Lock()
	writes := w.seen.writes
	w.hist.mu.Unlock()
	if w.fin.writes == writes {
		return w.fin.rec, w.fin.ok
	}
	r, ok := w.listOldestFinished()
	w.fin = finished{writes: writes, rec: r, ok: ok}
	return r, ok
}

func (w *world) listOldestFinished() (store.Record, bool) {
	recs, err := w.mem.List(context.Background(), store.ListOptions{})
	if err != nil {
		panic(err)
	}
	recs = slices.DeleteFunc(recs, func(r store.Record) bool { return !r.Terminal })
	if len(recs) == 0 {
		return store.Record{}, false
	}
	slices.SortFunc(recs, func(a, b store.Record) int {
		if c := a.UpdatedAt.Compare(b.UpdatedAt); c != 0 {
			return c
		}
		if a.ID < b.ID {
			return -1
		}
		return 1
	})
	return recs[0], true
}

// nextRetention is when retention may delete the next record (umu held).
func (w *world) nextRetention() (time.Time, bool) {
	if !w.retention {
		return time.Time{}, false
	}
	r, ok := w.oldestFinished()
	if !ok {
		return time.Time{}, false
	}
	return r.UpdatedAt.Add(w.retainFor), true
}

// retentionChoice deletes the oldest finished record once it is due and
// nothing of it holds kubetask's finalizer (umu held).
func (w *world) retentionChoice(now time.Time) (choice, bool) {
	if !w.retention {
		return choice{}, false
	}
	r, ok := w.oldestFinished()
	if !ok || now.Before(r.UpdatedAt.Add(w.retainFor)) {
		return choice{}, false
	}
	name := w.hist.name(r.ID, r.Nonce)
	var p *plan
	for _, q := range w.plans {
		if q.label == name {
			p = q
		}
	}
	// Not while the user may still send the submission again (an answer
	// lost, a retry due): sent after the deletion it would make a new
	// record, which the history would take for this one's.
	if p == nil || !p.submit.done || p.cancel.busy {
		return choice{}, false
	}
	w.srv.mu.Lock()
	var uids []string
	for _, pod := range w.srv.pods {
		if t, _ := w.srv.taskOf(pod); t == name && slices.Contains(pod.Finalizers, task.Finalizer) {
			w.srv.mu.Unlock()
			return choice{}, false
		}
	}
	for uid, c := range w.srv.clogs {
		if c.task == name {
			uids = append(uids, uid)
		}
	}
	w.srv.mu.Unlock()
	sort.Strings(uids)
	return choice{5, func() {
		for _, uid := range uids {
			w.srv.mu.Lock()
			c := *w.srv.clogs[uid]
			w.srv.mu.Unlock()
			w.retired[uid] = w.logFactsOf(c)
		}
		n, err := w.mem.(store.Retention).DeleteFinishedBefore(context.Background(), r.UpdatedAt.Add(time.Nanosecond), 1)
		if err != nil || n != 1 {
			panic(fmt.Sprintf("retention of %s: deleted %d: %v", r.ID, n, err))
		}
		w.fin.writes = -1
		p.retired = true
		w.hist.add(Event{Kind: KRetire, Task: name, Note: fmt.Sprintf("finished %s before", now.Sub(r.UpdatedAt))})
		for _, q := range w.plans {
			if q.prev == p {
				q.submitAt = now.Sub(w.start) + q.gap
				if q.cancelAt > 0 {
					q.cancelAt += q.submitAt
				}
				w.hist.reuse(q.id, q.label)
			}
		}
	}}, true
}
