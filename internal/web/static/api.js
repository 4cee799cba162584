// The HTTP API, with the signed-in token: JSON calls, the watch stream
// (Server-Sent Events read with fetch, since EventSource cannot send an
// Authorization header) and raw log reads.

export const PREFIX = '/api/v1';
const TOKEN_KEY = 'kubetask.token';

// auth keeps the token for the browser tab's session (sessionStorage): it
// is gone when the tab closes.
export const auth = {
  get token() { return sessionStorage.getItem(TOKEN_KEY) || ''; },
  set(token) { sessionStorage.setItem(TOKEN_KEY, token); },
  clear() { sessionStorage.removeItem(TOKEN_KEY); },
};

// ApiError is a non-2xx answer: its status and the problem details
// (detail, errors[].location/message) the server sent.
export class ApiError extends Error {
  constructor(status, problem) {
    super(describe(status, problem));
    this.status = status;
    this.problem = problem || {};
  }
  // at returns the first error detail at a location (query.namespace, ...).
  at(location) {
    return (this.problem.errors || []).find((e) => e.location === location);
  }
}

function describe(status, p) {
  if (!p) return `the server answered ${status}`;
  let s = p.detail || p.title || `the server answered ${status}`;
  const extra = (p.errors || []).filter((e) => e.message && !s.includes(e.message));
  if (extra.length) s += ' (' + extra.map((e) => (e.location ? e.location + ': ' : '') + e.message).join('; ') + ')';
  return s;
}

function headers(extra) {
  const hd = {...extra};
  const t = auth.token;
  if (t) hd.Authorization = 'Bearer ' + t;
  return hd;
}

// unauthorized tells the app that the token was refused (it signs out).
function unauthorized(err) {
  window.dispatchEvent(new CustomEvent('kubetask:unauthorized', {detail: err.message}));
}

async function failure(resp) {
  let problem = null;
  try { problem = await resp.json(); } catch { /* not JSON */ }
  const err = new ApiError(resp.status, problem);
  if (resp.status === 401) unauthorized(err);
  return err;
}

// request calls the API and returns the Response (2xx only; else throws
// ApiError). path is below PREFIX.
export async function request(path, {method = 'GET', body, signal, accept = 'application/json', extraHeaders} = {}) {
  const init = {method, signal, headers: headers({Accept: accept, ...extraHeaders})};
  if (body !== undefined) {
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const resp = await fetch(PREFIX + path, init);
  if (!resp.ok) throw await failure(resp);
  return resp;
}

// json calls the API and returns the decoded body.
export async function json(path, opts) {
  return (await request(path, opts)).json();
}

// query builds ?a=b&c=d from an object, leaving out empty values.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== '' && v != null) q.set(k, String(v));
  const s = q.toString();
  return s ? '?' + s : '';
}

// watch reads a watch stream (path below PREFIX, e.g. /watch?namespace=x)
// from cursor until signal aborts: onEvent(event) for each event (Bookmark
// and Expired included), onState('live' | 'reconnecting' | 'failed', err).
// It resumes from the last event's id after the server ends the stream or
// the connection breaks (a dead connection is noticed by the missing
// heartbeat), with a growing pause between failures. It stops for good on
// 4xx answers.
export function watch(path, {cursor = '', onEvent, onState = () => {}, signal}) {
  let last = cursor;
  let failures = 0;
  const run = async () => {
    while (!signal.aborted) {
      const ctl = new AbortController();
      const stop = () => ctl.abort();
      signal.addEventListener('abort', stop);
      let watchdog;
      const started = Date.now();
      const pet = () => {
        clearTimeout(watchdog);
        watchdog = setTimeout(() => ctl.abort(), 45000); // three missed heartbeats
      };
      try {
        const sep = path.includes('?') ? '&' : '?';
        const hd = headers({Accept: 'text/event-stream'});
        const resp = await fetch(PREFIX + path + (last ? sep + 'cursor=' + encodeURIComponent(last) : ''), {headers: hd, signal: ctl.signal});
        if (!resp.ok) {
          const err = await failure(resp);
          if (resp.status < 500) { onState('failed', err); return; }
          throw err;
        }
        pet();
        onState('live');
        await readEvents(resp.body, (ev) => {
          if (ev.id) last = ev.id;
          let data = null;
          try { data = JSON.parse(ev.data); } catch { return; }
          onEvent(data);
        }, pet);
        // The server ended the stream (its time limit, a shutdown): resume
        // at once, unless streams end as soon as they start.
        failures = Date.now() - started < 5000 ? failures + 1 : 0;
        if (!signal.aborted) onState('reconnecting');
      } catch (err) {
        if (signal.aborted) return;
        failures++;
        onState('reconnecting', err);
      } finally {
        clearTimeout(watchdog);
        signal.removeEventListener('abort', stop);
      }
      if (signal.aborted) return;
      if (failures > 0) await sleep(Math.min(15000, 500 * 2 ** Math.min(failures, 5)), signal);
    }
  };
  run();
}

// readEvents parses Server-Sent Events from a byte stream: blocks of
// "field: value" lines ended by an empty line; comments (":...") only call
// onBytes.
async function readEvents(body, onEvent, onBytes) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let ev = {data: []};
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    onBytes();
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      let line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') {
        if (ev.data.length) onEvent({id: ev.id, event: ev.event, data: ev.data.join('\n')});
        ev = {data: []};
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') ev.data.push(value);
      else if (field === 'id') ev.id = value;
      else if (field === 'event') ev.event = value;
    }
  }
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, {once: true});
  });
}
