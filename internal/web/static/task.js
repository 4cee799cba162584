// A task's page: its outcome in words, the attempts as a timeline with
// their pods and events, the result, cancel and rerun, and the logs. The
// task's watch stream (from the cursor of the read) makes it read the task
// again whenever something happens to it.

import {json, request, watch, ApiError} from './api.js';
import {h, replace, liveIndicator, fmtDuration, taskDuration, timeEl, badge, download, fmtBytes} from './util.js';
import {explain} from './explain.js';
import {LogView} from './logview.js';

export function mount(main, {params, navigate}) {
  const id = params.id;
  const ctl = new AbortController();
  let t = null;
  let selected = null; // the attempt whose log shows; null: the latest
  let container = '';
  const seen = new Map(); // attempt -> [{time, type, reason, message, kube}]
  let inflight = false, again = false;

  document.title = `${id} · kubetask`;
  const title = h('h1', {tabindex: -1}, id);
  const stateEl = h('span');
  const liveMark = liveIndicator();
  const actionState = h('span', {class: 'action-state', role: 'status'});
  const cancelBtn = h('button', {type: 'button', class: 'danger', hidden: true, onclick: () => dialog.showModal()}, 'Cancel task');
  const rerunBtn = h('button', {type: 'button', hidden: true, onclick: rerun}, 'Rerun');
  const summary = h('section', {class: 'summary card', 'aria-labelledby': 'sum-h'});
  const pendingEl = h('section', {class: 'card', hidden: true, 'aria-labelledby': 'pend-h'});
  const timeline = h('ol', {class: 'timeline'});
  const resultEl = h('section', {class: 'card result', hidden: true, 'aria-labelledby': 'res-h'});
  const tabs = h('div', {role: 'tablist', 'aria-label': 'Attempts', class: 'tabs', onkeydown: tabKeys});
  const containerSel = h('select', {id: 'log-container', onchange: () => { container = containerSel.value; openLog(); }});
  const containerField = h('div', {class: 'field inline', hidden: true}, h('label', {for: 'log-container'}, 'Container'), containerSel);
  const docEl = h('pre', {class: 'doc'});
  const view = new LogView({fileName: (a, c) => `${t ? t.name : 'task'}-${id}-attempt${a + 1}${c ? '-' + c : ''}.log`});
  view.el.id = 'log-panel';
  view.el.setAttribute('role', 'tabpanel');

  const confirmBtn = h('button', {type: 'button', class: 'danger', onclick: cancel}, 'Cancel task');
  const dialog = h('dialog', {class: 'confirm', 'aria-labelledby': 'dlg-h'},
    h('h2', {id: 'dlg-h'}, 'Cancel this task?'),
    h('p', {}, 'Its pod is stopped and the task ends Failed/Cancelled, unless its main container has already finished. It is not retried.'),
    h('div', {class: 'buttons'}, confirmBtn, h('button', {type: 'button', onclick: () => dialog.close()}, 'Keep it running')));

  // Everything the task's data fills appears with its first read, not
  // before: what is on screen never moves when the data arrives.
  const body = h('div', {hidden: true},
    h('div', {class: 'actions'}, cancelBtn, rerunBtn, actionState),
    summary, pendingEl,
    h('section', {class: 'card', 'aria-labelledby': 'att-h'}, h('h2', {id: 'att-h'}, 'Attempts'), timeline),
    resultEl,
    h('section', {class: 'card logs', 'aria-labelledby': 'log-h'},
      h('div', {class: 'logs-head'}, h('h2', {id: 'log-h'}, 'Log'), tabs, containerField),
      view.el),
    h('details', {class: 'card'}, h('summary', {}, 'Task document'), docEl));
  replace(main,
    h('nav', {class: 'crumbs', 'aria-label': 'Breadcrumb'}, h('a', {href: '/'}, 'Tasks'), ' › ', h('span', {class: 'crumb-here'}, id)),
    h('div', {class: 'heading'}, title, stateEl, liveMark.el),
    body, dialog);

  async function load() {
    let resp;
    try {
      resp = await request(`/tasks/${encodeURIComponent(id)}`, {signal: ctl.signal});
    } catch (err) {
      if (ctl.signal.aborted) return;
      if (err instanceof ApiError && err.status === 404) {
        replace(main, h('nav', {class: 'crumbs'}, h('a', {href: '/'}, 'Tasks')), h('h1', {tabindex: -1}, 'No such task'),
          h('p', {}, `There is no task ${id}, or you may not see it.`));
        return;
      }
      summary.replaceChildren(h('p', {class: 'error', role: 'alert'}, err.message));
      body.hidden = false;
      return;
    }
    const cursor = resp.headers.get('X-Kubetask-Cursor') || '';
    show(await resp.json());
    watch(`/tasks/${encodeURIComponent(id)}/watch`, {
      cursor, signal: ctl.signal,
      onEvent: (ev) => {
        if (ev.type === 'Bookmark') return;
        if (ev.taskId === id) note(ev.attempt, {time: ev.time, type: ev.type, phase: ev.phase, reason: ev.reason, message: ev.message, pod: ev.pod});
        reload();
      },
      onState: (s) => {
        liveMark.set(s);
      },
    });
  }

  // reload reads the task again: one read at a time, one more if events
  // came during it.
  async function reload() {
    if (inflight) { again = true; return; }
    inflight = true;
    try {
      do {
        again = false;
        const nt = await json(`/tasks/${encodeURIComponent(id)}`, {signal: ctl.signal});
        show(nt);
      } while (again && !ctl.signal.aborted);
    } catch { /* the stream's next event reads again */ } finally {
      inflight = false;
    }
  }

  function note(attempt, e) {
    if (!seen.has(attempt)) seen.set(attempt, []);
    const list = seen.get(attempt);
    if (e.kube && list.some((x) => x.kube && x.reason === e.reason && x.message === e.message && x.time === e.time)) return;
    list.push(e);
  }

  function show(nt) {
    const prev = t;
    t = nt;
    document.title = `${t.name} · ${t.phase} · kubetask`;
    title.textContent = t.name;
    main.querySelector('.crumb-here').textContent = `${t.namespace} / ${t.name}`;
    replace(stateEl, badge(t.phase, t.reason));
    main.dataset.phase = t.phase;
    main.dataset.terminal = String(t.terminal);
    cancelBtn.hidden = t.terminal;
    body.hidden = false;
    rerunBtn.hidden = !t.terminal;
    for (const e of t.events || []) note(t.attempt, {time: e.lastSeen, type: e.type, reason: e.reason, message: e.message, count: e.count, kube: true});
    drawSummary();
    drawPending();
    drawTimeline();
    drawResult();
    docEl.textContent = t.document ? JSON.stringify(t.document, null, 2) : '';
    const containers = logContainers(t);
    if (!prev) {
      container = containers[0] || '';
      replace(containerSel, containers.map((c) => h('option', {value: c}, c)));
      containerField.hidden = containers.length < 2;
    }
    drawTabs();
    const attempt = selected ?? t.attempt;
    const live = !t.terminal && attempt === t.attempt;
    if (!prev || (selected == null && prev.attempt !== t.attempt)) openLog();
    else view.setLive(live);
  }

  function openLog() {
    const attempt = selected ?? t.attempt;
    view.open(id, attempt, container, !t.terminal && attempt === t.attempt);
    drawTabs();
  }

  // actorEl shows who did something: the user, and how they signed in
  // (with the Kubernetes UID and groups on hover).
  function actorEl(a) {
    const more = [a.auth && `signed in with ${a.auth === 'none' ? 'no authentication' : a.auth === 'token' ? 'a kubetask token' : 'a Kubernetes token'}`,
      a.uid && `UID ${a.uid}`, a.groups?.length && `groups ${a.groups.join(', ')}`].filter(Boolean).join('; ');
    return h('span', {class: 'actor', title: more}, a.user);
  }

  function drawSummary() {
    const x = explain(t);
    const facts = [
      ['ID', h('code', {}, t.id)],
      ['Namespace', t.namespace],
      t.cluster ? ['Cluster', t.cluster] : null,
      t.labels && Object.keys(t.labels).length ? ['Labels', h('span', {class: 'labels'}, Object.entries(t.labels).map(([k, v]) => h('code', {class: 'label'}, `${k}=${v}`)))] : null,
      t.origin ? ['Rerun of', h('a', {href: `/tasks/${encodeURIComponent(t.origin)}`}, t.origin)] : null,
      t.submittedBy ? [t.origin ? 'Rerun by' : 'Submitted by', actorEl(t.submittedBy)] : null,
      ['Created', timeEl(t.createdAt)],
      t.terminal ? ['Finished', timeEl((t.attempts || []).at(-1)?.finishedAt || t.updatedAt)] : ['Updated', timeEl(t.updatedAt)],
      [t.terminal ? 'Took' : 'Age', fmtDuration(taskDuration(t))],
      ['Attempts', String((t.attempts || []).length || t.attempt + 1)],
      t.exitCode != null ? ['Exit code', String(t.exitCode)] : null,
      t.cancelledAt ? ['Cancel requested', timeEl(t.cancelledAt)] : null,
      t.cancelledBy ? ['Cancelled by', actorEl(t.cancelledBy)] : null,
    ].filter(Boolean);
    replace(summary,
      h('h2', {id: 'sum-h', class: 'sr-only'}, 'Summary'),
      h('p', {class: `headline ph-${(t.phase || '').toLowerCase()}`}, x.headline),
      x.detail ? h('p', {class: 'detail'}, x.detail) : null,
      t.message ? h('p', {class: 'message'}, h('span', {class: 'sr-only'}, 'Message: '), t.message) : null,
      x.hint ? h('p', {class: 'hint'}, x.hint) : null,
      h('dl', {class: 'facts'}, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])));
  }

  function drawPending() {
    const evs = t.events || [];
    pendingEl.hidden = !(t.phase === 'Pending' && evs.length);
    if (pendingEl.hidden) return;
    replace(pendingEl, h('h2', {id: 'pend-h'}, 'Why it is pending: the pod\'s events'),
      h('ul', {class: 'events'}, evs.map((e) => h('li', {class: e.type === 'Warning' ? 'warn' : ''},
        h('strong', {}, e.reason), e.count > 1 ? ` (×${e.count})` : '', ': ', e.message, ' ', h('span', {class: 'muted'}, timeEl(e.lastSeen))))));
  }

  function drawTimeline() {
    const items = [h('li', {class: 'tl-start'}, h('div', {class: 'tl-head'}, h('strong', {}, 'Submitted'), ' ', timeEl(t.createdAt)))];
    const created = Date.parse(t.createdAt);
    const attempts = t.attempts || [];
    for (const a of attempts) {
      const current = !a.finishedAt;
      const evs = seen.get(a.attempt) || [];
      const offset = a.finishedAt ? `+${fmtDuration(Date.parse(a.observedAt || a.finishedAt) - created)}` : '';
      items.push(h('li', {class: `tl-attempt ph-${(a.phase || '').toLowerCase()}`, dataset: {attempt: a.attempt}},
        h('div', {class: 'tl-head'},
          h('strong', {}, `Attempt ${a.attempt}`), ' ', badge(a.phase, a.reason),
          a.exitCode != null ? h('span', {class: 'muted'}, ` exit code ${a.exitCode}`) : null,
          current && !t.terminal ? h('span', {class: 'muted'}, ' · current') : null),
        h('div', {class: 'tl-meta'},
          a.cluster ? ['cluster ', h('strong', {class: 'cluster'}, a.cluster), ' · '] : null,
          a.pod ? ['pod ', h('code', {}, a.pod)] : 'no pod yet',
          a.finishedAt ? [' · ended ', timeEl(a.finishedAt), ` (${offset} after submission)`] : null,
          a.retryable ? ' · retryable failure' : null),
        a.message ? h('p', {class: 'tl-msg'}, a.message) : null,
        evs.length ? h('details', {class: 'tl-events'}, h('summary', {}, `Events (${evs.length})`),
          h('ul', {}, evs.map((e) => h('li', {class: e.type === 'Warning' ? 'warn' : ''},
            h('span', {class: 'muted'}, timeEl(e.time)), ' ', h('strong', {}, e.kube ? e.reason : e.type),
            !e.kube && e.phase ? ` ${e.phase}${e.reason ? '/' + e.reason : ''}` : '',
            e.count > 1 ? ` (×${e.count})` : '', e.message ? ': ' + e.message : '')))) : null,
        h('button', {type: 'button', class: 'link', onclick: () => { selectAttempt(a.attempt); view.lines.focus(); }}, 'Show its log')));
    }
    replace(timeline, items);
  }

  function drawResult() {
    const has = t.result !== undefined && t.result !== '' || t.resultBase64;
    resultEl.hidden = !has;
    if (!has) return;
    const name = `${t.name}-${t.id}-result`;
    if (t.resultBase64) {
      const bytes = Uint8Array.from(atob(t.resultBase64), (c) => c.charCodeAt(0));
      const hex = [...bytes.subarray(0, 48)].map((b) => b.toString(16).padStart(2, '0')).join(' ');
      replace(resultEl, h('h2', {id: 'res-h'}, 'Result'),
        h('p', {}, `Binary, ${fmtBytes(bytes.length)}. First bytes:`), h('pre', {class: 'hex'}, hex + (bytes.length > 48 ? ' …' : '')),
        h('button', {type: 'button', onclick: () => download(new Blob([bytes], {type: 'application/octet-stream'}), name + '.bin')}, 'Download the result'));
      return;
    }
    let text = t.result, kind = 'Text', ext = '.txt';
    try {
      const v = JSON.parse(t.result);
      if (v !== null && typeof v === 'object') { text = JSON.stringify(v, null, 2); kind = 'JSON'; ext = '.json'; }
    } catch { /* text */ }
    replace(resultEl, h('h2', {id: 'res-h'}, 'Result'), h('p', {class: 'muted'}, kind),
      h('pre', {class: `result-body ${kind === 'JSON' ? 'json' : ''}`, tabindex: 0}, text),
      h('button', {type: 'button', onclick: () => download(new Blob([t.result], {type: 'text/plain'}), name + ext)}, 'Download the result'));
  }

  function drawTabs() {
    const current = selected ?? t.attempt;
    const n = Math.max(t.attempt + 1, (t.attempts || []).length);
    const btns = [];
    for (let a = 0; a < n; a++) {
      const att = (t.attempts || []).find((x) => x.attempt === a);
      btns.push(h('button', {type: 'button', role: 'tab', id: `tab-${a}`, 'aria-selected': String(a === current), 'aria-controls': 'log-panel', tabindex: a === current ? 0 : -1,
        class: att ? `ph-${(att.phase || '').toLowerCase()}` : '', onclick: () => selectAttempt(a)}, `Attempt ${a}`));
    }
    replace(tabs, btns);
    view.el.setAttribute('aria-labelledby', `tab-${current}`);
  }

  function selectAttempt(a) {
    selected = a === t.attempt && !t.terminal ? null : a;
    openLog();
  }

  function tabKeys(e) {
    const list = [...tabs.querySelectorAll('[role=tab]')];
    const i = list.indexOf(document.activeElement);
    if (i < 0) return;
    let j = {ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: list.length - 1}[e.key];
    if (j === undefined) return;
    e.preventDefault();
    j = (j + list.length) % list.length;
    selectAttempt(j);
    tabs.querySelector(`#tab-${j}`)?.focus();
  }

  async function cancel() {
    confirmBtn.disabled = true;
    try {
      const nt = await json(`/tasks/${encodeURIComponent(id)}/cancel`, {method: 'POST'});
      dialog.close();
      actionState.textContent = nt.terminal ? 'The task had finished already.' : 'Cancellation requested: the pod is being stopped.';
      show(nt);
    } catch (err) {
      dialog.close();
      actionState.textContent = `Cannot cancel: ${err.message}`;
    } finally {
      confirmBtn.disabled = false;
    }
  }

  async function rerun() {
    rerunBtn.disabled = true;
    actionState.textContent = 'Submitting the rerun…';
    try {
      const nt = await json(`/tasks/${encodeURIComponent(id)}/rerun`, {method: 'POST'});
      navigate(`/tasks/${encodeURIComponent(nt.id)}`);
    } catch (err) {
      actionState.textContent = `Cannot rerun: ${err.message}`;
      rerunBtn.disabled = false;
    }
  }

  load();
  return {unmount() { ctl.abort(); view.destroy(); }};
}

// logContainers are the containers whose logs the task keeps, the main one
// first.
function logContainers(t) {
  const spec = (t.document && t.document.spec) || {};
  const main = spec.mainContainer || '';
  const list = (spec.logs && spec.logs.containers) || [];
  return [...new Set([main, ...list].filter(Boolean))];
}
