// The page's shell: sign-in with the service's token, routes (/ is the task
// list, /tasks/{id} a task), links that change the route without loading
// the page again.

import {auth, request, ApiError} from './api.js';
import {h, replace} from './util.js';
import * as list from './list.js';
import * as task from './task.js';

const main = document.getElementById('main');
const signOut = document.getElementById('sign-out');
let current = null;
let open = false; // the API needs no token (auth mode none)
let navigated = false;

function route(path) {
  if (path === '/' || path === '') return {view: list, params: {}};
  const m = path.match(/^\/tasks\/([^/]+)\/?$/);
  if (m) return {view: task, params: {id: decodeURIComponent(m[1])}};
  return null;
}

// navigate changes the route (pushing history, or replacing the entry).
export function navigate(url, {replace: rep = false} = {}) {
  if (rep) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  navigated = true;
  show();
}

function show() {
  if (current) current.unmount();
  current = null;
  signOut.hidden = open || !auth.token;
  if (!open && !auth.token) return login();
  const r = route(location.pathname);
  if (!r) {
    document.title = 'Not found · kubetask';
    replace(main, h('h1', {tabindex: -1}, 'Not found'), h('p', {}, 'This page has no view at ', h('code', {}, location.pathname), '. ', h('a', {href: '/'}, 'See the tasks.')));
    return;
  }
  current = r.view.mount(main, {params: r.params, query: new URLSearchParams(location.search), navigate});
  if (navigated) main.querySelector('h1')?.focus({preventScroll: true});
}

function login(message) {
  document.title = 'Sign in · kubetask';
  const input = h('input', {id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false', 'aria-describedby': 'token-help'});
  const error = h('p', {class: 'error', role: 'alert'}, message || '');
  const button = h('button', {type: 'submit', class: 'primary'}, 'Sign in');
  const form = h('form', {class: 'login', onsubmit: async (e) => {
    e.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    button.disabled = true;
    error.textContent = '';
    auth.set(token);
    try {
      await request('/tasks?limit=1');
    } catch (err) {
      // 403: the token is known but may not list every namespace (the
      // list asks for a namespace then).
      if (!(err instanceof ApiError) || err.status === 401) {
        auth.clear();
        error.textContent = err.status === 401 ? 'The service does not know this token.' : `Cannot reach the service: ${err.message}`;
        button.disabled = false;
        input.focus();
        return;
      }
    }
    navigated = true; // the focus goes to the page's heading
    show();
  }},
  h('h1', {tabindex: -1}, 'Sign in'),
  h('p', {id: 'token-help'}, 'Paste a token of the service: the one ', h('code', {}, 'kubetask serve'), ' printed when it generated its token file, one from that file, or (auth mode kubernetes) your Kubernetes bearer token. The page keeps it until this tab closes.'),
  h('label', {for: 'token'}, 'Token'),
  input, button, error);
  replace(main, form);
  input.focus();
}

signOut.addEventListener('click', () => {
  auth.clear();
  navigated = false;
  show();
});

window.addEventListener('kubetask:unauthorized', () => {
  if (open || !auth.token) return;
  auth.clear();
  if (current) current.unmount();
  current = null;
  signOut.hidden = true;
  login('The service refused the token: sign in again.');
});

window.addEventListener('popstate', () => { navigated = true; show(); });

// Links to the page's own routes change the route in place.
document.addEventListener('click', (e) => {
  const a = e.target.closest('a[href]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith('/api/') || url.pathname.startsWith('/assets/')) return;
  e.preventDefault();
  navigate(url.pathname + url.search + url.hash);
});

async function start() {
  if (!auth.token) {
    // Auth mode none: the API answers without a token.
    try {
      const resp = await fetch('/api/v1/tasks?limit=1', {headers: {Accept: 'application/json'}});
      open = resp.ok;
    } catch { /* the service is unreachable: the sign-in form says so */ }
  }
  show();
}

start();
