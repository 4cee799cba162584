// Small helpers shared by the views: DOM building and time formatting.

// h builds an element: h('a', {href: '/', class: 'x', onclick: fn}, 'text', child).
// Attributes whose value is null, undefined or false are left out; on* keys
// add event listeners; children may be strings, nodes, arrays or null.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

// liveIndicator is a page's "Live" mark. Every state's label is laid out
// in one grid cell and only the current one shown, so the mark is as wide
// as its longest label in every state: a change of state never moves what
// is beside it, or wraps the heading it sits in (on a phone, "Connecting…"
// turning into "Live" took the heading from two lines to one and moved the
// whole page up: a layout shift of 0.31). set(state) shows a state.
export function liveIndicator() {
  const labels = {connecting: 'Connecting…', live: 'Live', reconnecting: 'Reconnecting…', failed: 'Not live'};
  const spans = Object.entries(labels).map(([state, text]) => h('span', {dataset: {label: state}}, text));
  const el = h('span', {class: 'live'}, h('span', {class: 'live-labels'}, spans));
  const set = (state) => {
    el.dataset.state = state;
    for (const sp of spans) sp.classList.toggle('on', sp.dataset.label === state);
  };
  set('connecting');
  return {el, set};
}

function append(el, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

// clear empties el and appends children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// fmtDuration: 850ms, 12s, 3m 05s, 2h 10m, 3d 4h.
export function fmtDuration(ms) {
  if (ms == null || !isFinite(ms)) return '';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, '0')}s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr}h ${String(m % 60).padStart(2, '0')}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

// fmtAge: how long ago, coarse: 5s, 3m, 2h, 4d.
export function fmtAge(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (!isFinite(t)) return '';
  const s = Math.max(0, Math.floor((now - t) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

// fmtTime: a local date and time, to the second.
export function fmtTime(iso) {
  const t = new Date(iso);
  if (isNaN(t)) return '';
  const p = (n) => String(n).padStart(2, '0');
  return `${t.getFullYear()}-${p(t.getMonth() + 1)}-${p(t.getDate())} ${p(t.getHours())}:${p(t.getMinutes())}:${p(t.getSeconds())}`;
}

// timeEl is a <time> with the local time as text and the ISO time as title.
export function timeEl(iso, text) {
  return h('time', {datetime: iso, title: iso}, text ?? fmtTime(iso));
}

// fmtBytes: 512 B, 12.3 KiB, 50.0 MiB.
export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB'];
  let v = n / 1024, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

// taskDuration is how long a task ran: to its outcome when it has one
// (when kubetask recorded it: the kubelet's finish times have whole
// seconds only), else to now.
export function taskDuration(t, now = Date.now()) {
  const start = Date.parse(t.createdAt);
  let end = now;
  if (t.terminal) {
    const last = (t.attempts || []).at(-1);
    end = Date.parse((last && (last.observedAt || last.finishedAt)) || t.updatedAt);
  }
  return end - start;
}

// download saves a Blob as a file named name.
export function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h('a', {href: url, download: name, hidden: true});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// badge is a task state as text with its colour; never colour alone.
export function badge(phase, reason) {
  const text = reason && reason !== phase ? `${phase || '?'} · ${reason}` : (phase || '?');
  return h('span', {class: `badge ph-${(phase || 'unknown').toLowerCase()}`}, text);
}
