// The log viewer: one attempt's log of one container, followed live while
// the attempt runs and read from the archive afterwards (the API serves both
// the same way, so nothing changes on screen when the pod goes). Only the
// lines in view are in the page; the rest is read by byte offset when it is
// scrolled to or searched (logsource.js). Scrolling moves by lines (wheel,
// keys, touch); the scroll bar beside the lines places the view by byte.

import {request, sleep} from './api.js';
import {LogSource, CHUNK} from './logsource.js';
import {render as renderAnsi, strip} from './ansi.js';
import {h, replace, fmtBytes, download} from './util.js';

const SHOW_MAX = 10000; // characters of one line drawn
const SEARCH_WINDOW = 2 * 1024 * 1024;
const TIMESTAMP = /^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)(\s)/;
const decoder = new TextDecoder('utf-8');

let ids = 0;

export class LogView {
  // opts.fileName(attempt, container) names downloads.
  constructor(opts = {}) {
    this.opts = opts;
    this.settings = {numbers: localStorage.getItem('kubetask.log.numbers') !== 'false', timestamps: localStorage.getItem('kubetask.log.timestamps') !== 'false'};
    const id = ++ids;
    this.query = '';
    this.match = null;
    this.ops = [];
    this.top = 0;
    this.atEnd = true;
    this.rows = 20;
    this.lineHeight = 20;
    this.avgLine = 80;
    this.wheelAcc = 0;
    this.searchGen = 0;
    this.full = false;

    this.lines = h('div', {class: 'log-lines', tabindex: 0, role: 'region', 'aria-label': 'Log lines', 'aria-describedby': `log-help-${id}`,
      onkeydown: (e) => this.key(e), onwheel: (e) => this.wheel(e)});
    this.spacer = h('div', {class: 'log-spacer'});
    this.bar = h('div', {class: 'log-bar', 'aria-hidden': 'true', onscroll: () => this.barScrolled()}, this.spacer);
    this.statusEl = h('span', {class: 'log-state', role: 'status'});
    this.posEl = h('span', {class: 'log-pos'});
    this.endBtn = h('button', {type: 'button', class: 'small', hidden: true, onclick: () => { this.push({type: 'end'}); this.lines.focus(); }}, 'Jump to the end ↓');
    this.searchIn = h('input', {type: 'search', id: `log-search-${id}`, placeholder: 'Search the log', autocomplete: 'off', spellcheck: 'false',
      onkeydown: (e) => { if (e.key === 'Enter') { e.preventDefault(); this.search(e.shiftKey ? -1 : 1); } },
      oninput: () => {
        this.searchGen++; // a search under way for the old text stops
        this.query = this.searchIn.value;
        this.match = null;
        this.searchOut.textContent = '';
        this.push({type: 'draw'});
      }});
    this.searchOut = h('output', {class: 'log-search-state', 'aria-live': 'polite', for: `log-search-${id}`});
    const toggle = (key, label) => {
      const box = h('input', {type: 'checkbox', checked: this.settings[key], onchange: () => {
        this.settings[key] = box.checked;
        localStorage.setItem('kubetask.log.' + key, String(box.checked));
        this.push({type: 'draw'});
      }});
      return h('label', {class: 'toggle'}, box, ' ', label);
    };
    this.dlBtn = h('button', {type: 'button', class: 'small', onclick: () => this.downloadRaw()}, 'Download raw');
    this.el = h('div', {class: 'logview', dataset: {state: 'idle'}},
      h('div', {class: 'log-tools'},
        h('form', {role: 'search', class: 'log-search', onsubmit: (e) => { e.preventDefault(); this.search(1); }},
          h('label', {for: `log-search-${id}`, class: 'sr-only'}, 'Search the log'),
          this.searchIn,
          h('button', {type: 'button', class: 'small', onclick: () => this.search(-1), 'aria-label': 'Previous match'}, '↑'),
          h('button', {type: 'submit', class: 'small', 'aria-label': 'Next match'}, '↓'),
          this.searchOut),
        h('div', {class: 'log-opts'}, toggle('numbers', 'Line numbers'), toggle('timestamps', 'Timestamps'), this.dlBtn)),
      h('div', {class: 'log-body'}, this.lines, this.bar),
      h('div', {class: 'log-foot'}, this.statusEl, this.posEl, this.endBtn),
      h('p', {id: `log-help-${id}`, class: 'sr-only'}, 'Scroll with the arrow keys, Page Up, Page Down, Home and End; press / to search.'));
    // Touch: vertical moves scroll by lines (the lines pan sideways natively).
    this.lines.addEventListener('touchstart', (e) => { this.touchY = e.touches[0].clientY; }, {passive: true});
    this.lines.addEventListener('touchmove', (e) => {
      const dy = this.touchY - e.touches[0].clientY;
      const n = Math.trunc(dy / this.lineHeight);
      if (n) {
        this.touchY -= n * this.lineHeight;
        this.push({type: 'lines', n});
      }
    }, {passive: true});
    this.el.__view = this; // for debugging from the console
    this.resize = new ResizeObserver(() => this.measure());
    this.resize.observe(this.lines);
  }

  // open shows the log of attempt/container of task id; live says whether
  // the attempt may still write.
  open(id, attempt, container, live) {
    this.close();
    this.key_ = {id, attempt, container};
    this.live = live;
    this.ctl = new AbortController();
    this.src = new LogSource(logPath(id, attempt, container));
    this.top = 0;
    this.atEnd = true;
    this.match = null;
    this.error = null;
    this.followed = false;
    replace(this.lines);
    this.setState('loading');
    this.start(this.src, this.ctl.signal);
  }

  // setLive says that the attempt ended (false): a follow that gets no more
  // bytes stops once the server says so.
  setLive(live) {
    this.live = live;
    this.status();
  }

  close() {
    this.ctl?.abort();
    this.src = null;
  }

  destroy() {
    this.close();
    this.resize.disconnect();
  }

  async start(src, signal) {
    try {
      await src.fetch(0, CHUNK, signal);
      if (src !== this.src) return;
      this.setState(src.complete ? 'complete' : 'following');
      this.push({type: 'draw'});
      if (!src.complete) await this.follow(src, signal);
    } catch (err) {
      if (signal.aborted || src !== this.src) return;
      this.error = err;
      this.setState('error');
    }
  }

  // follow reads what the log gets, until it is complete: one streaming
  // request at a time, resumed from the bytes held after it ends.
  async follow(src, signal) {
    let idle = 0;
    while (!signal.aborted && !src.complete) {
      this.followed = true;
      this.setState('following');
      await src.ensure(Math.floor(src.size / CHUNK) * CHUNK, src.size, signal);
      let pos = src.size;
      const from = pos;
      try {
        const resp = await request(`${src.path}&follow=true&offset=${from}`, {accept: 'text/plain', signal});
        src.info(resp);
        const reader = resp.body.getReader();
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          src.write(pos, value);
          pos += value.length;
          this.grew();
        }
      } catch (err) {
        if (signal.aborted) return;
        if (err.status && err.status < 500) throw err;
      }
      if (src.complete) break;
      idle = pos > from ? 0 : idle + 1;
      if (idle > 0) {
        // The attempt is over and the server waited for the rest of its
        // log in vain (it waits LogWait, 30 s by default): stop.
        if (!this.live && idle >= 1) {
          this.setState(src.size ? 'incomplete' : 'none');
          this.push({type: 'draw'});
          return;
        }
        await sleep(Math.min(15000, 1000 * 2 ** (idle - 1)), signal);
      }
    }
    if (!signal.aborted) {
      this.setState('complete');
      this.push({type: 'draw'});
    }
  }

  grew() {
    if (this.atEnd || !this.full) this.push({type: 'draw'});
    else this.status();
  }

  setState(s) {
    this.el.dataset.state = s;
    this.status();
  }

  status() {
    const src = this.src;
    if (!src) return;
    const s = this.el.dataset.state;
    const what = {
      loading: 'Loading…',
      following: this.live ? 'Following live' : 'Waiting for the archive to be complete…',
      none: 'No log was archived for this attempt',
      complete: 'Complete',
      incomplete: 'The archive of this log is incomplete',
      error: `Cannot read the log: ${this.error?.message || ''}`,
    }[s] || '';
    this.statusEl.textContent = `${fmtBytes(src.size)} · ${what}${src.truncated ? ' · cut at the size cap' : ''}`;
    this.el.dataset.size = String(src.size);
    this.endBtn.hidden = this.atEnd || s !== 'following';
  }

  measure() {
    const probe = this.lines.querySelector('.line');
    if (probe) this.lineHeight = probe.getBoundingClientRect().height || this.lineHeight;
    const rows = Math.max(1, Math.floor(this.lines.clientHeight / this.lineHeight));
    if (rows !== this.rows) {
      this.rows = rows;
      this.push({type: 'draw'});
    }
  }

  // --- navigation: operations run one at a time, then one draw ---

  push(op) {
    if (op.type === 'lines') {
      const last = this.ops.at(-1);
      if (last && last.type === 'lines') { last.n += op.n; return this.pump(); }
    }
    if (op.type === 'jump') this.ops = this.ops.filter((o) => o.type !== 'jump');
    if (op.type !== 'draw' || !this.ops.some((o) => o.type === 'draw')) this.ops.push(op);
    this.pump();
  }

  async pump() {
    if (this.pumping) return;
    this.pumping = true;
    while (this.ops.length) {
      const src = this.src;
      if (!src) {
        this.ops = [];
        break;
      }
      const signal = this.ctl.signal;
      try {
        while (this.ops.length && src === this.src) {
          const op = this.ops.shift();
          if (op.type !== 'draw') await this.apply(op, src, signal);
        }
        if (src === this.src) await this.draw(src, signal);
      } catch (err) {
        // A read of a log closed since (another attempt shown) fails on
        // its aborted request: only the current log's failures count.
        if (src === this.src && !signal.aborted) {
          this.ops = [];
          this.error = err;
          this.setState('error');
        }
      }
    }
    this.pumping = false;
  }

  async apply(op, src, signal) {
    switch (op.type) {
      case 'lines':
        if (op.n > 0 && !this.atEnd) {
          for (let k = 0; k < op.n; k++) {
            const l = await src.lineFrom(this.top, signal);
            if (l.next >= src.size) break;
            this.top = l.next;
          }
        } else if (op.n < 0) {
          this.atEnd = false;
          for (let k = 0; k < -op.n && this.top > 0; k++) this.top = await src.lineContaining(this.top - 1, signal);
        }
        break;
      case 'jump':
        this.atEnd = false;
        this.top = src.size ? await src.lineContaining(Math.min(op.byte, src.size - 1), signal) : 0;
        break;
      case 'home':
        this.atEnd = false;
        this.top = 0;
        break;
      case 'end':
        this.atEnd = true;
        break;
      case 'goto': {
        this.atEnd = false;
        this.top = op.start;
        for (let k = 0; k < Math.floor(this.rows / 3) && this.top > 0; k++) this.top = await src.lineContaining(this.top - 1, signal);
        break;
      }
    }
  }

  // draw shows the lines from top (or the last lines, at the end).
  async draw(src, signal) {
    let lines = [];
    if (!this.atEnd) {
      for (let p = this.top; lines.length < this.rows && p < src.size;) {
        const l = await src.lineFrom(p, signal);
        lines.push(l);
        if (l.next <= p) break;
        p = l.next;
      }
      if (lines.length < this.rows && this.top > 0) this.atEnd = true; // the end is in view: stick to it
    }
    if (this.atEnd) {
      lines = [];
      if (src.size > 0) {
        let start = await src.lineContaining(src.size - 1, signal);
        // A last line cut because it is long: lineContaining went back to its
        // last piece's start at most MAX_LINE before the end.
        lines.unshift(await src.lineFrom(start, signal));
        while (lines.length < this.rows && start > 0) {
          start = await src.lineContaining(start - 1, signal);
          lines.unshift(await src.lineFrom(start, signal));
        }
      }
      this.top = lines.length ? lines[0].start : 0;
    }
    if (src !== this.src) return;
    this.paint(src, lines);
    if (lines.length) this.avgLine = Math.max(1, (lines.at(-1).next - lines[0].start) / lines.length);
    this.syncBar(src);
    this.status();
    this.countLines(src);
  }

  paint(src, lines) {
    const q = this.query.toLowerCase();
    let n = this.settings.numbers && lines.length ? src.lineNumber(lines[0].start) : null;
    const width = String((n || 1) + lines.length).length;
    const out = [];
    for (const l of lines) {
      const cut = l.end - l.start > SHOW_MAX * 4;
      let text = decoder.decode(src.slice(l.start, cut ? l.start + SHOW_MAX * 4 : l.end));
      if (text.indexOf('\r') >= 0) text = text.replace(/\r/g, '');
      let more = '';
      if (text.length > SHOW_MAX || cut) {
        text = text.slice(0, SHOW_MAX);
        more = ` … (${fmtBytes(l.end - l.start)} line: download the log for all of it)`;
      }
      const row = h('div', {class: 'line', dataset: {start: l.start}});
      if (this.match && this.match.start === l.start) row.classList.add('current');
      if (this.settings.numbers) row.append(h('span', {class: 'ln', 'aria-hidden': 'true'}, n == null ? '' : String(n).padStart(width)));
      const tx = h('span', {class: 'tx'});
      let rest = text;
      const ts = TIMESTAMP.exec(text);
      if (ts) {
        rest = text.slice(ts[0].length);
        if (this.settings.timestamps) tx.append(h('span', {class: 'ts'}, ts[1]), ts[2]);
      }
      renderAnsi(tx, rest, q ? marks(strip(rest).toLowerCase(), q) : []);
      if (more) tx.append(h('span', {class: 'more'}, more));
      row.append(tx);
      out.push(row);
      if (n != null && l.next > l.end) n++;
    }
    this.lines.replaceChildren(...out);
    this.lines.classList.toggle('numbers', this.settings.numbers);
    this.el.dataset.top = String(this.top);
    this.el.dataset.atEnd = String(this.atEnd);
    if (!out.length) {
      const s = this.el.dataset.state;
      const text = {complete: 'This attempt wrote no log.', following: 'Waiting for the container to write…', none: 'No log was archived: the container did not run, or its log was lost.'}[s] || '';
      this.lines.append(h('div', {class: 'line empty'}, text));
    }
    const first = lines.length && this.settings.numbers ? src.lineNumber(lines[0].start) : null;
    this.posEl.textContent = !lines.length ? '' : first != null ? `line ${first.toLocaleString('en-US')}` : `byte ${lines[0].start.toLocaleString('en-US')}`;
    this.full = lines.length >= this.rows;
    if (!this.measured && out.length) {
      this.measured = true;
      this.measure();
    }
  }

  // countLines counts the newlines of the chunks before the view in the
  // background, for its line numbers.
  async countLines(src) {
    if (!this.settings.numbers || this.counting === src || src.uncounted(this.top + 1) < 0) return;
    this.counting = src;
    const signal = this.ctl.signal;
    try {
      for (let i; src === this.src && (i = src.uncounted(this.top + 1)) >= 0;) {
        this.posEl.textContent = `counting lines… ${Math.floor((i * CHUNK * 100) / Math.max(1, src.size))}%`;
        await src.ensure(i * CHUNK, (i + 16) * CHUNK, signal);
      }
    } catch {
      return;
    } finally {
      if (this.counting === src) this.counting = null;
    }
    if (src === this.src) this.push({type: 'draw'});
  }

  syncBar(src) {
    const H = this.bar.clientHeight;
    const ratio = Math.min(2000, Math.max(1, src.size / Math.max(1, this.rows * this.avgLine)));
    this.spacer.style.height = `${Math.round(H * ratio)}px`;
    const max = this.bar.scrollHeight - H;
    const frac = this.atEnd ? 1 : src.size ? this.top / src.size : 0;
    this.bar.scrollTop = Math.round(frac * max);
    this.expectBar = this.bar.scrollTop;
  }

  barScrolled() {
    if (!this.src || Math.abs(this.bar.scrollTop - this.expectBar) <= 1) return;
    this.expectBar = this.bar.scrollTop;
    const max = this.bar.scrollHeight - this.bar.clientHeight;
    const frac = max > 0 ? this.bar.scrollTop / max : 0;
    if (frac >= 0.999) this.push({type: 'end'});
    else this.push({type: 'jump', byte: Math.floor(frac * this.src.size)});
  }

  wheel(e) {
    if (Math.abs(e.deltaY) <= Math.abs(e.deltaX)) return; // sideways: the lines scroll natively
    e.preventDefault();
    const px = e.deltaMode === 1 ? e.deltaY * this.lineHeight : e.deltaMode === 2 ? e.deltaY * this.rows * this.lineHeight : e.deltaY;
    this.wheelAcc += px;
    const n = Math.trunc(this.wheelAcc / this.lineHeight);
    if (n) {
      this.wheelAcc -= n * this.lineHeight;
      this.push({type: 'lines', n});
    }
  }

  key(e) {
    const page = Math.max(1, this.rows - 1);
    const ops = {ArrowDown: {type: 'lines', n: 1}, ArrowUp: {type: 'lines', n: -1}, PageDown: {type: 'lines', n: page}, PageUp: {type: 'lines', n: -page},
      ' ': {type: 'lines', n: e.shiftKey ? -page : page}, Home: {type: 'home'}, End: {type: 'end'}};
    if ((e.key === 'f' && (e.ctrlKey || e.metaKey)) || e.key === '/') {
      e.preventDefault();
      this.searchIn.focus();
      this.searchIn.select();
      return;
    }
    const op = ops[e.key];
    if (!op || e.altKey || e.ctrlKey || e.metaKey) return;
    e.preventDefault();
    this.push(op);
  }

  // --- search: chunk by chunk through the whole log, from the view ---

  async search(dir) {
    const src = this.src;
    const q = this.searchIn.value;
    if (!src || !q) return;
    const ql = q.toLowerCase();
    const gen = ++this.searchGen;
    const signal = this.ctl.signal;
    const same = this.match && this.match.q === ql;
    const from = same ? (dir > 0 ? this.match.next : this.match.start) : this.top;
    this.query = q;
    const say = (s) => { if (gen === this.searchGen) this.searchOut.textContent = s; };
    say('Searching…');
    this.el.dataset.search = 'running';
    try {
      const found = dir > 0 ? await this.scanForward(src, ql, from, gen, say, signal) : await this.scanBackward(src, ql, from, gen, say, signal);
      if (gen !== this.searchGen || src !== this.src) return;
      if (found == null) {
        say(`No match for “${q}”`);
        this.el.dataset.search = 'none';
        this.match = null;
        this.push({type: 'draw'});
        return;
      }
      const l = await src.lineFrom(found, signal);
      this.match = {q: ql, start: found, next: l.next};
      this.push({type: 'goto', start: found});
      const n = src.lineNumber(found);
      say(n != null ? `Match on line ${n.toLocaleString('en-US')}` : `Match at byte ${found.toLocaleString('en-US')}`);
      this.el.dataset.search = 'found';
    } catch (err) {
      if (!signal.aborted) say(`Search failed: ${err.message}`);
    }
  }

  // scanForward returns the start of the first line at or after from (a
  // line start) that holds q, wrapping around once; null when none does.
  async scanForward(src, q, from, gen, say, signal) {
    let pos = from;
    let wrapped = from === 0;
    let end = src.size;
    let scanned = 0;
    for (;;) {
      if (pos >= end) {
        if (wrapped) return null;
        wrapped = true;
        end = from;
        pos = 0;
        if (pos >= end) return null;
      }
      let stop = Math.min(end, pos + SEARCH_WINDOW);
      await src.ensure(pos, stop, signal);
      if (gen !== this.searchGen || src !== this.src) return null;
      if (stop < src.size) {
        const nl = src.lastIndexOfNL(pos, stop);
        if (nl >= 0) stop = nl + 1;
      }
      const hit = findIn(src, pos, stop, q, false);
      if (hit != null) return hit;
      scanned += stop - pos;
      pos = stop;
      say(`Searching… ${Math.min(99, Math.floor((scanned * 100) / Math.max(1, src.size)))}%`);
    }
  }

  async scanBackward(src, q, from, gen, say, signal) {
    let pos = from;
    let wrapped = false;
    let floor = 0;
    let scanned = 0;
    for (;;) {
      if (pos <= floor) {
        if (wrapped || from >= src.size) return null;
        wrapped = true;
        floor = from;
        pos = src.size;
      }
      let start = Math.max(floor, pos - SEARCH_WINDOW);
      await src.ensure(start, pos, signal);
      if (gen !== this.searchGen || src !== this.src) return null;
      if (start > floor) {
        const nl = src.indexOfNL(start, pos);
        if (nl >= 0 && nl + 1 < pos) start = nl + 1;
      }
      const hit = findIn(src, start, pos, q, true);
      if (hit != null) return hit;
      scanned += pos - start;
      pos = start;
      say(`Searching… ${Math.min(99, Math.floor((scanned * 100) / Math.max(1, src.size)))}%`);
    }
  }

  async downloadRaw() {
    const k = this.key_;
    if (!k) return;
    this.dlBtn.disabled = true;
    this.dlBtn.textContent = 'Downloading…';
    try {
      const resp = await request(logPath(k.id, k.attempt, k.container), {accept: 'text/plain'});
      const blob = await resp.blob();
      download(new Blob([blob], {type: 'application/octet-stream'}), this.opts.fileName ? this.opts.fileName(k.attempt, k.container) : 'log.txt');
    } catch (err) {
      this.searchOut.textContent = `Download failed: ${err.message}`;
    } finally {
      this.dlBtn.disabled = false;
      this.dlBtn.textContent = 'Download raw';
    }
  }
}

function logPath(id, attempt, container) {
  return `/tasks/${encodeURIComponent(id)}/logs?attempt=${attempt}` + (container ? `&container=${encodeURIComponent(container)}` : '');
}

// marks returns the [start, end) ranges of q in text.
function marks(text, q) {
  const out = [];
  for (let i = text.indexOf(q); i >= 0 && out.length < 200; i = text.indexOf(q, i + q.length)) out.push([i, i + q.length]);
  return out;
}

// findIn searches the held bytes [start, stop) (whole lines) for q and
// returns the start of the first (or, backward, the last) line holding it.
function findIn(src, start, stop, q, backward) {
  const text = strip(decoder.decode(src.slice(start, stop))).replace(/\r/g, '').toLowerCase();
  const i = backward ? text.lastIndexOf(q) : text.indexOf(q);
  if (i < 0) return null;
  let k = 0; // newlines before the match
  for (let j = text.indexOf('\n'); j >= 0 && j < i; j = text.indexOf('\n', j + 1)) k++;
  let p = start;
  for (let n = 0; n < k; n++) {
    const nl = src.indexOfNL(p, stop);
    if (nl < 0) break;
    p = nl + 1;
  }
  return p;
}
