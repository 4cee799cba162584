// A task attempt's log, read on demand from the API by byte offset: fixed
// chunks of the log are fetched when a view or a search needs them and
// forgotten when many are held, so that a log of any size costs a bounded
// amount of memory. The newlines of each whole chunk are counted once, which
// gives line numbers.

import {request} from './api.js';

export const CHUNK = 256 * 1024;
const MAX_CHUNKS = 96; // 24 MiB held at most (plus the chunks in use)
const FETCH_MAX = 4 * 1024 * 1024; // one request's bytes at most
export const MAX_LINE = 1024 * 1024; // a longer line is shown in pieces of this
const NL = 10;

export class LogSource {
  // path: /tasks/{id}/logs?attempt=N&container=C (below the API prefix).
  constructor(path) {
    this.path = path;
    this.size = 0;
    this.complete = false;
    this.truncated = false;
    this.chunks = new Map(); // index -> {buf: Uint8Array(CHUNK), len, used}
    this.counts = []; // index -> newlines in the chunk, once it is whole
    this.countsVersion = 0;
    this.prefix = null; // prefix sums of counts, for countsVersion
    this.tick = 0;
  }

  // info takes the size and state of the archive from a response's headers.
  info(resp) {
    const size = Number(resp.headers.get('X-Kubetask-Log-Size'));
    if (isFinite(size)) this.size = Math.max(this.size, size);
    this.truncated = resp.headers.get('X-Kubetask-Log-Truncated') === 'true';
    if (resp.headers.get('X-Kubetask-Log-Complete') === 'true' && !this.complete) {
      this.complete = true;
      const last = Math.floor(Math.max(0, this.size - 1) / CHUNK);
      const c = this.chunks.get(last);
      if (c) this.count(last, c);
    }
  }

  // fetch reads up to limit bytes from start, keeps them and returns how
  // many came.
  async fetch(start, limit, signal) {
    const resp = await request(`${this.path}&offset=${start}&limit=${limit}`, {accept: 'text/plain', signal});
    this.info(resp);
    const bytes = new Uint8Array(await resp.arrayBuffer());
    this.write(start, bytes);
    return bytes.length;
  }

  // write keeps bytes read at pos (from a read or a follow). Bytes that
  // would leave a hole in a chunk are not kept (read again when needed).
  write(pos, bytes) {
    let off = 0;
    while (off < bytes.length) {
      const p = pos + off;
      const i = Math.floor(p / CHUNK);
      const at = p - i * CHUNK;
      let c = this.chunks.get(i);
      if (!c && at === 0) {
        c = {buf: new Uint8Array(CHUNK), len: 0, used: 0};
        this.chunks.set(i, c);
      }
      if (!c || at > c.len) {
        off += CHUNK - at;
        continue;
      }
      const n = Math.min(CHUNK - at, bytes.length - off);
      c.buf.set(bytes.subarray(off, off + n), at);
      c.len = Math.max(c.len, at + n);
      c.used = ++this.tick;
      this.count(i, c);
      off += n;
    }
    this.size = Math.max(this.size, pos + bytes.length);
    this.evict();
  }

  count(i, c) {
    if (this.counts[i] !== undefined) return;
    if (c.len < CHUNK && !(this.complete && i * CHUNK + c.len >= this.size)) return;
    let n = 0;
    const b = c.buf.subarray(0, c.len);
    for (let j = b.indexOf(NL); j >= 0; j = b.indexOf(NL, j + 1)) n++;
    this.counts[i] = n;
    this.countsVersion++;
  }

  evict() {
    if (this.chunks.size <= MAX_CHUNKS) return;
    const tail = Math.floor(Math.max(0, this.size - 1) / CHUNK);
    const order = [...this.chunks.entries()].filter(([i]) => i !== tail).sort((a, b) => a[1].used - b[1].used);
    for (let k = 0; k < order.length && this.chunks.size > MAX_CHUNKS; k++) this.chunks.delete(order[k][0]);
  }

  // missing returns where to read from to hold the bytes [start, end): the
  // start of the first chunk missing, or the end of the first chunk held in
  // part (chunks are filled from their start); -1 when all are held.
  missing(start, end) {
    end = Math.min(end, this.size);
    for (let i = Math.floor(start / CHUNK); i * CHUNK < end; i++) {
      const c = this.chunks.get(i);
      const need = Math.min(CHUNK, end - i * CHUNK);
      if (!c) return i * CHUNK;
      c.used = ++this.tick;
      if (c.len < need) return i * CHUNK + c.len;
    }
    return -1;
  }

  // ensure makes the bytes [start, end) held (those that exist), reading
  // whole chunks.
  async ensure(start, end, signal) {
    start = Math.max(0, start);
    for (;;) {
      const from = this.missing(start, end);
      if (from < 0) return;
      const to = Math.min(Math.ceil(Math.max(end, from + 1) / CHUNK) * CHUNK, from + FETCH_MAX);
      const got = await this.fetch(from, to - from, signal);
      if (got === 0) return; // the end of the log
    }
  }

  held(p) {
    const c = this.chunks.get(Math.floor(p / CHUNK));
    return c && p - Math.floor(p / CHUNK) * CHUNK < c.len;
  }

  // slice copies the held bytes [start, end).
  slice(start, end) {
    const out = new Uint8Array(Math.max(0, end - start));
    let p = start;
    while (p < end) {
      const i = Math.floor(p / CHUNK);
      const at = p - i * CHUNK;
      const c = this.chunks.get(i);
      if (!c) break;
      const n = Math.min(c.len - at, end - p);
      if (n <= 0) break;
      out.set(c.buf.subarray(at, at + n), p - start);
      p += n;
    }
    return out.subarray(0, p - start);
  }

  // indexOfNL finds the first newline in the held bytes [from, to), or -1.
  indexOfNL(from, to) {
    let p = from;
    while (p < to) {
      const i = Math.floor(p / CHUNK);
      const c = this.chunks.get(i);
      if (!c) return -1;
      const at = p - i * CHUNK;
      const lim = Math.min(c.len, to - i * CHUNK);
      if (lim <= at) return -1;
      const j = c.buf.subarray(at, lim).indexOf(NL);
      if (j >= 0) return p + j;
      p = i * CHUNK + lim;
    }
    return -1;
  }

  // lastIndexOfNL finds the last newline in the held bytes [from, to), or -1.
  lastIndexOfNL(from, to) {
    let p = to;
    while (p > from) {
      const i = Math.floor((p - 1) / CHUNK);
      const c = this.chunks.get(i);
      if (!c) return -1;
      const lo = Math.max(from - i * CHUNK, 0);
      const hi = Math.min(p - i * CHUNK, c.len);
      const j = c.buf.subarray(lo, hi).lastIndexOf(NL);
      if (j >= 0) return i * CHUNK + lo + j;
      p = i * CHUNK + lo;
    }
    return -1;
  }

  // lineFrom returns the line that starts at start: {start, end (its
  // newline, or where it stops), next (the next line's start)}.
  async lineFrom(start, signal) {
    let scanned = start;
    for (let step = 16 * 1024; ; step *= 4) {
      const lim = Math.min(this.size, start + MAX_LINE, scanned + step);
      await this.ensure(scanned, lim, signal);
      const nl = this.indexOfNL(scanned, lim);
      if (nl >= 0) return {start, end: nl, next: nl + 1};
      if (lim >= this.size || lim >= start + MAX_LINE) return {start, end: lim, next: lim};
      scanned = lim;
    }
  }

  // lineContaining returns the start of the line that holds byte p (p is
  // a line's start when byte p-1 is a newline).
  async lineContaining(p, signal) {
    if (p <= 0) return 0;
    let to = p;
    for (let step = 16 * 1024; ; step *= 4) {
      const lo = Math.max(0, to - step, p - MAX_LINE);
      await this.ensure(lo, to, signal);
      const nl = this.lastIndexOfNL(lo, to);
      if (nl >= 0) return nl + 1;
      if (lo === 0 || lo <= p - MAX_LINE) return lo;
      to = lo;
    }
  }

  // lineNumber is the 1-based number of the line starting at p (held), or
  // null while the newlines before its chunk are not all counted.
  lineNumber(p) {
    const i = Math.floor(p / CHUNK);
    if (this.prefixVersion !== this.countsVersion) {
      this.prefix = [0];
      for (let k = 0; k < this.counts.length && this.counts[k] !== undefined; k++) this.prefix.push(this.prefix[k] + this.counts[k]);
      this.prefixVersion = this.countsVersion;
    }
    if (i >= this.prefix.length) return null;
    const c = this.chunks.get(i);
    if (!c) return null;
    let n = this.prefix[i] + 1;
    const b = c.buf.subarray(0, p - i * CHUNK);
    for (let j = b.indexOf(NL); j >= 0; j = b.indexOf(NL, j + 1)) n++;
    return n;
  }

  // uncounted is the first chunk index before end whose newlines are not
  // counted, or -1.
  uncounted(end) {
    const last = Math.floor(Math.max(0, end - 1) / CHUNK);
    for (let i = 0; i < last; i++) if (this.counts[i] === undefined) return i;
    return -1;
  }
}
