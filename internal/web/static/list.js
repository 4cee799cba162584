// The task list: a keyset page of tasks with filters, kept current by the
// watch stream (started from the page's own cursor, so that no change
// between the read and the stream is missed), and the counts of running,
// pending and failed tasks.

import {json, watch, query, ApiError} from './api.js';
import {h, replace, liveIndicator, fmtAge, fmtDuration, taskDuration, fmtTime, badge} from './util.js';

const PAGE = 50;
const PHASES = ['Pending', 'Running', 'Succeeded', 'Failed'];
const COUNT_PAGES = 5; // unfinished tasks counted: at most 5 pages of 1000

// trail keeps the continue tokens of the pages seen with the current
// filters, for the Newer button.
let trail = {key: '', tokens: []};

export function mount(main, {query: q, navigate}) {
  const ctl = new AbortController();
  const f = {phase: q.get('phase') || '', reason: q.get('reason') || '', namespace: q.get('namespace') || '', name: q.get('name') || '', labels: q.get('labels') || '',
    cluster: q.get('cluster') || ''};
  // clusters are the service's (GET /clusters; none for a service on one
  // cluster): with some, the table has a Cluster column and the filters a
  // cluster.
  let clusters = [];
  const cont = q.get('continue') || '';
  const key = JSON.stringify(f);
  if (trail.key !== key) trail = {key, tokens: []};
  const at = trail.tokens.indexOf(cont);
  if (cont === '') trail.tokens = [];
  else if (at < 0) trail.tokens.push(cont);
  else trail.tokens.length = at + 1;

  document.title = 'Tasks · kubetask';
  const rows = new Map(); // id -> {task, tr}
  const track = new Map(); // id -> {phase, terminal}: what the counts count
  const capped = {unfinished: false, failed: false};
  const inflight = new Set();
  const dirty = new Set();
  let nextToken = '';

  // --- the page's parts ---
  const countsEl = h('p', {class: 'counts', 'aria-live': 'polite', 'aria-atomic': 'true'});
  const liveMark = liveIndicator();
  const errorEl = h('div', {class: 'error', role: 'alert'});
  const tbody = h('tbody');
  const empty = h('p', {class: 'empty', hidden: true});
  const field = (name, label, attrs = {}) => {
    const id = 'f-' + name;
    return h('div', {class: 'field'}, h('label', {for: id}, label), h('input', {id, name, value: f[name], autocomplete: 'off', spellcheck: 'false', ...attrs}));
  };
  const phaseSel = h('select', {id: 'f-phase', name: 'phase'},
    h('option', {value: ''}, 'All'), PHASES.map((p) => h('option', {value: p, selected: f.phase === p}, p)));
  const form = h('form', {class: 'filters', role: 'search', 'aria-label': 'Filter the tasks', onsubmit: (e) => {
    e.preventDefault();
    const d = new FormData(form);
    navigate('/' + query({phase: d.get('phase'), reason: f.reason, namespace: d.get('namespace').trim(), name: d.get('name').trim(), labels: d.get('labels').trim(),
      cluster: d.get('cluster') || ''}));
  }},
  h('div', {class: 'field'}, h('label', {for: 'f-phase'}, 'State'), phaseSel),
  field('namespace', 'Namespace'),
  field('name', 'Name starts with'),
  field('labels', 'Labels', {placeholder: 'team=data,env=prod'}),
  h('div', {class: 'field buttons'},
    h('button', {type: 'submit', class: 'primary'}, 'Filter'),
    h('button', {type: 'button', onclick: () => navigate('/')}, 'Clear')));
  if (f.reason) form.append(h('p', {class: 'note'}, `Only reason ${f.reason}. `, h('a', {href: '/' + query({...f, reason: ''})}, 'Show every reason')));

  const newer = h('button', {type: 'button', disabled: !cont, onclick: () => {
    const prev = trail.tokens.length >= 2 ? trail.tokens[trail.tokens.length - 2] : '';
    navigate('/' + query({...f, continue: prev}));
  }}, '‹ Newer');
  const newest = h('button', {type: 'button', disabled: !cont, onclick: () => navigate('/' + query(f))}, 'Newest');
  const older = h('button', {type: 'button', disabled: true, onclick: () => navigate('/' + query({...f, continue: nextToken}))}, 'Older ›');

  // The table and the pager appear with the first page, not before: what
  // is on screen never moves when the data arrives.
  const thead = h('thead');
  const heads = () => replace(thead, h('tr', {}, ['State', 'Reason', 'Namespace', clusters.length ? 'Cluster' : null, 'Name', 'Attempts', 'Age', 'Duration']
    .filter(Boolean).map((c) => h('th', {scope: 'col'}, c))));
  heads();
  const results = h('div', {hidden: true},
    h('div', {class: 'table-wrap'},
      h('table', {class: 'tasks'},
        h('caption', {class: 'sr-only'}, 'Tasks, newest first'),
        thead,
        tbody)),
    empty,
    h('nav', {class: 'pager', 'aria-label': 'Pages'}, newer, newest, older));
  replace(main,
    h('div', {class: 'heading'}, h('h1', {tabindex: -1}, 'Tasks'), liveMark.el),
    countsEl, form, errorEl,
    results);

  // --- rows ---
  function cells(t) {
    const now = Date.now();
    const label = (l) => ({'data-label': l});
    return [
      h('td', label('State'), badge(t.phase)),
      h('td', {...label('Reason'), title: t.message || ''}, t.reason || ''),
      h('td', label('Namespace'), t.namespace),
      clusters.length ? h('td', label('Cluster'), t.cluster || '') : null,
      h('td', {...label('Name'), class: 'name'}, h('a', {href: `/tasks/${encodeURIComponent(t.id)}`}, t.name), h('span', {class: 'id'}, t.id)),
      h('td', {...label('Attempts'), class: 'num'}, String((t.attempt || 0) + 1)),
      h('td', {...label('Age'), class: 'num age'}, h('time', {datetime: t.createdAt, title: fmtTime(t.createdAt)}, fmtAge(t.createdAt, now))),
      h('td', {...label('Duration'), class: 'num dur'}, fmtDuration(taskDuration(t, now))),
    ].filter(Boolean);
  }

  // draw shows a row's task, replacing only the cells that changed: a cell
  // the user points at (the name's link) stays the same element, so a
  // click whose press and release straddle an update is not lost.
  function draw(id) {
    const r = rows.get(id);
    const next = cells(r.task);
    const cur = [...r.tr.children];
    if (cur.length !== next.length) replace(r.tr, next);
    else next.forEach((td, i) => { if (!cur[i].isEqualNode(td)) cur[i].replaceWith(td); });
    r.tr.dataset.phase = r.task.phase;
    r.tr.dataset.reason = r.task.reason;
  }

  function flash(tr) {
    tr.classList.remove('changed');
    void tr.offsetWidth; // restart the animation
    tr.classList.add('changed');
  }

  function matches(t) {
    return (!f.phase || t.phase === f.phase) && (!f.reason || t.reason === f.reason) && (!f.cluster || t.cluster === f.cluster);
  }

  function insert(t) {
    if (rows.has(t.id)) {
      rows.get(t.id).task = t;
      draw(t.id);
      flash(rows.get(t.id).tr);
      return;
    }
    if (!matches(t)) return;
    // Only tasks that belong on this page: newer than its oldest row, or
    // any while the page is not full.
    const list = [...rows.values()];
    const before = (a, b) => a.createdAt > b.createdAt || (a.createdAt === b.createdAt && a.id > b.id);
    if (nextToken && list.length && !before(t, list.at(-1).task)) return;
    const tr = h('tr', {dataset: {id: t.id}});
    rows.set(t.id, {task: t, tr});
    draw(t.id);
    const after = list.find((r) => before(t, r.task));
    tbody.insertBefore(tr, after ? after.tr : null);
    flash(tr);
    empty.hidden = true;
  }

  // refresh reads a task again (once at a time; again when events came
  // meanwhile) and shows it.
  function refresh(id) {
    if (inflight.has(id)) {
      dirty.add(id);
      return;
    }
    inflight.add(id);
    json(`/tasks/${encodeURIComponent(id)}`, {signal: ctl.signal})
      .then((t) => {
        track.set(t.id, {phase: t.phase, terminal: t.terminal});
        showCounts();
        insert(t);
      })
      .catch(() => {})
      .finally(() => {
        inflight.delete(id);
        if (dirty.delete(id) && !ctl.signal.aborted) refresh(id);
      });
  }

  function onEvent(ev) {
    if (ev.type === 'Bookmark') return;
    if (ev.type === 'Expired') {
      load();
      return;
    }
    const id = ev.taskId;
    if (!id) return;
    const finishedAttempt = ev.type === 'AttemptFinished';
    if (ev.phase && (!finishedAttempt || ev.terminal)) {
      track.set(id, {phase: ev.phase, terminal: !!ev.terminal});
      showCounts();
    }
    const r = rows.get(id);
    if (r) {
      if (ev.terminal || inflight.has(id)) {
        refresh(id); // its attempts and times
        return;
      }
      if (!ev.phase || finishedAttempt) return;
      Object.assign(r.task, {phase: ev.phase, reason: ev.reason, message: ev.message, attempt: ev.attempt, updatedAt: ev.time});
      if (ev.cluster) r.task.cluster = ev.cluster;
      if (ev.exitCode != null) r.task.exitCode = ev.exitCode;
      draw(id);
      flash(r.tr);
      return;
    }
    // A task whose first read is still in flight has no row yet: its
    // answer may predate this event, so read it again when it lands (an
    // event dropped here left the row showing a stale phase for good).
    if (inflight.has(id)) {
      refresh(id);
      return;
    }
    if (cont) return; // only the first page takes new tasks
    if (ev.type === 'Submitted' || ((f.phase || f.reason) && ev.phase && matches(ev))) refresh(id);
  }

  let counted = false; // until the first count, the numbers show as –
  function showCounts() {
    let running = 0, pending = 0, failed = 0;
    for (const s of track.values()) {
      if (s.terminal) failed += s.phase === 'Failed' ? 1 : 0;
      else if (s.phase === 'Running') running++;
      else if (s.phase === 'Pending') pending++;
    }
    const more = (c) => (c ? '+' : '');
    const num = (n, c) => (counted ? `${n}${more(c)}` : '–');
    const link = (phase, n, text) => h('a', {href: '/' + query({...f, phase, reason: '', continue: ''}), class: `count ph-${phase.toLowerCase()}`, dataset: {count: phase}},
      h('strong', {}, num(n, phase === 'Failed' ? capped.failed : capped.unfinished)), ' ', text);
    replace(countsEl, link('Running', running, 'running'), link('Pending', pending, 'pending'), link('Failed', failed, 'failed in the last 24 hours'));
  }

  async function loadCounts(signal) {
    const base = {namespace: f.namespace, namePrefix: f.name, labels: f.labels, cluster: f.cluster};
    track.clear();
    let token = '';
    for (let n = 0; n < COUNT_PAGES; n++) {
      const l = await json('/tasks' + query({...base, terminal: 'false', limit: 1000, continue: token}), {signal});
      for (const t of l.items) track.set(t.id, {phase: t.phase, terminal: false});
      token = l.continue || '';
      if (!token) break;
    }
    capped.unfinished = !!token;
    const since = new Date(Date.now() - 86400e3).toISOString();
    const l = await json('/tasks' + query({...base, phase: 'Failed', terminal: 'true', createdAfter: since, limit: 1000}), {signal});
    for (const t of l.items) track.set(t.id, {phase: t.phase, terminal: true});
    capped.failed = !!l.continue;
    counted = true;
    showCounts();
  }

  // loadClusters reads the service's clusters once: with some, the table
  // gets its Cluster column and the filters a choice of cluster. A caller
  // who may not list them (403: not allowed every namespace) sees the
  // column without the choice.
  let clustersRead = false;
  async function loadClusters(signal) {
    if (clustersRead) return;
    clustersRead = true;
    let names = [];
    try {
      names = (await json('/clusters', {signal})).items.map((c) => c.name);
    } catch (err) {
      if (signal.aborted) throw err;
      if (!(err instanceof ApiError && err.status === 403)) return;
    }
    if (!names.length && !f.cluster) return;
    clusters = names.length ? names : [f.cluster];
    heads();
    const sel = h('select', {id: 'f-cluster', name: 'cluster'},
      h('option', {value: ''}, 'All'), clusters.map((c) => h('option', {value: c, selected: f.cluster === c}, c)));
    form.querySelector('.field.buttons').before(h('div', {class: 'field'}, h('label', {for: 'f-cluster'}, 'Cluster'), sel));
  }

  let streamCtl = null;
  async function load() {
    streamCtl?.abort();
    streamCtl = new AbortController();
    const signal = AbortSignal.any([ctl.signal, streamCtl.signal]);
    errorEl.textContent = '';
    let page;
    try {
      page = await json('/tasks' + query({namespace: f.namespace, phase: f.phase, reason: f.reason, namePrefix: f.name, labels: f.labels, cluster: f.cluster, limit: PAGE, continue: cont}), {signal});
      await loadClusters(signal);
      await loadCounts(signal);
    } catch (err) {
      if (signal.aborted) return;
      failed(err);
      return;
    }
    rows.clear();
    tbody.replaceChildren();
    nextToken = page.continue || '';
    older.disabled = !nextToken;
    for (const t of page.items) {
      const tr = h('tr', {dataset: {id: t.id}});
      rows.set(t.id, {task: t, tr});
      draw(t.id);
      tbody.append(tr);
    }
    empty.hidden = page.items.length > 0;
    empty.textContent = Object.values(f).some(Boolean) ? 'No task matches these filters.' : 'No tasks yet: submit one with kubetask submit -f task.yaml.';
    results.hidden = false;
    main.dataset.loaded = 'true';
    watch('/watch' + query({namespace: f.namespace, namePrefix: f.name, labels: f.labels, cluster: f.cluster}), {
      cursor: page.cursor, signal, onEvent,
      onState: (s, err) => {
        liveMark.set(s);
        if (s === 'failed' && err) failed(err);
      },
    });
  }

  function failed(err) {
    if (err instanceof ApiError && err.status === 403 && !f.namespace) {
      errorEl.textContent = `${err.message}. Give a namespace you may see in the filter.`;
      form.querySelector('#f-namespace').focus();
    } else if (err instanceof ApiError && err.status === 400 && err.at('query.continue')) {
      errorEl.replaceChildren('This page is no longer valid. ', h('a', {href: '/' + query(f)}, 'Start again from the newest tasks.'));
    } else {
      errorEl.textContent = err.message;
    }
  }

  // Ages and durations move on without asking the server.
  const ticker = setInterval(() => {
    const now = Date.now();
    for (const {task, tr} of rows.values()) {
      const age = tr.querySelector('.age time');
      if (age) age.textContent = fmtAge(task.createdAt, now);
      const dur = tr.querySelector('.dur');
      if (dur && !task.terminal) dur.textContent = fmtDuration(taskDuration(task, now));
    }
  }, 1000);

  showCounts(); // their space, before the first count
  load();
  return {unmount() { ctl.abort(); streamCtl?.abort(); clearInterval(ticker); delete main.dataset.loaded; }};
}
