// ANSI colours of log lines: SGR sequences (ESC [ ... m) become styled
// spans; every other escape sequence (cursor movement, erasing, titles) is
// dropped. Each line starts with the default style: a viewer that shows any
// part of a large log cannot know the style the lines before it left.

// ESC [ params final | ESC ] ... BEL/ST | ESC + one character
const ESCAPES = /\x1b\[([0-9;:?]*)([@-~])|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?/g;

// strip returns text without escape sequences.
export function strip(text) {
  return text.indexOf('\x1b') < 0 ? text : text.replace(ESCAPES, '');
}

function cube(n) {
  if (n < 232) {
    n -= 16;
    const lv = [0, 95, 135, 175, 215, 255];
    return `rgb(${lv[Math.floor(n / 36)]},${lv[Math.floor(n / 6) % 6]},${lv[n % 6]})`;
  }
  const g = 8 + 10 * (n - 232);
  return `rgb(${g},${g},${g})`;
}

// parse splits text into segments {text, fg, bg, bold, dim, italic,
// underline, strike} (fg/bg: 0-15 for the palette or a CSS colour).
export function parse(text) {
  if (text.indexOf('\x1b') < 0) return [{text}];
  const out = [];
  let st = {};
  let last = 0;
  ESCAPES.lastIndex = 0;
  let m;
  while ((m = ESCAPES.exec(text)) !== null) {
    if (m.index > last) out.push({...st, text: text.slice(last, m.index)});
    last = ESCAPES.lastIndex;
    if (m[2] === 'm') st = sgr(st, m[1]);
    if (m[0] === '') ESCAPES.lastIndex++; // never loop on an empty match
  }
  if (last < text.length) out.push({...st, text: text.slice(last)});
  return out;
}

function sgr(prev, params) {
  const st = {...prev};
  const p = (params === '' ? '0' : params).split(/[;:]/).map((x) => (x === '' ? 0 : Number(x)));
  for (let i = 0; i < p.length; i++) {
    const c = p[i];
    if (c === 0) { for (const k of Object.keys(st)) delete st[k]; }
    else if (c === 1) st.bold = true;
    else if (c === 2) st.dim = true;
    else if (c === 3) st.italic = true;
    else if (c === 4) st.underline = true;
    else if (c === 7) st.inverse = true;
    else if (c === 9) st.strike = true;
    else if (c === 22) { delete st.bold; delete st.dim; }
    else if (c === 23) delete st.italic;
    else if (c === 24) delete st.underline;
    else if (c === 27) delete st.inverse;
    else if (c === 29) delete st.strike;
    else if (c >= 30 && c <= 37) st.fg = c - 30;
    else if (c >= 90 && c <= 97) st.fg = c - 90 + 8;
    else if (c === 39) delete st.fg;
    else if (c >= 40 && c <= 47) st.bg = c - 40;
    else if (c >= 100 && c <= 107) st.bg = c - 100 + 8;
    else if (c === 49) delete st.bg;
    else if (c === 38 || c === 48) {
      const key = c === 38 ? 'fg' : 'bg';
      if (p[i + 1] === 5 && i + 2 < p.length) {
        const n = p[i + 2] & 255;
        st[key] = n < 16 ? n : cube(n);
        i += 2;
      } else if (p[i + 1] === 2 && i + 4 < p.length) {
        st[key] = `rgb(${p[i + 2] & 255},${p[i + 3] & 255},${p[i + 4] & 255})`;
        i += 4;
      } else {
        break;
      }
    }
  }
  return st;
}

// render appends the segments of text to el, marking the ranges of marks
// ([start, end) offsets in the text without escapes) with <mark>.
export function render(el, text, marks = []) {
  let pos = 0;
  let mi = 0;
  for (const seg of parse(text)) {
    const segEnd = pos + seg.text.length;
    let at = pos;
    while (at < segEnd) {
      while (mi < marks.length && marks[mi][1] <= at) mi++;
      const mk = marks[mi];
      let end = segEnd;
      let marked = false;
      if (mk && mk[0] <= at) { end = Math.min(segEnd, mk[1]); marked = true; }
      else if (mk && mk[0] < segEnd) end = mk[0];
      el.append(span(seg, seg.text.slice(at - pos, end - pos), marked));
      at = end;
    }
    pos = segEnd;
  }
}

function span(seg, text, marked) {
  const plain = seg.fg === undefined && seg.bg === undefined && !seg.bold && !seg.dim && !seg.italic && !seg.underline && !seg.strike && !seg.inverse;
  if (plain && !marked) return document.createTextNode(text);
  const el = document.createElement(marked ? 'mark' : 'span');
  el.textContent = text;
  if (plain) return el;
  let {fg, bg} = seg;
  if (seg.inverse) [fg, bg] = [bg ?? 'inv-fg', fg ?? 'inv-bg'];
  const cls = [];
  if (typeof fg === 'number') cls.push('f' + fg);
  else if (fg === 'inv-fg') cls.push('finv');
  else if (fg) el.style.color = fg;
  if (typeof bg === 'number') cls.push('b' + bg);
  else if (bg === 'inv-bg') cls.push('binv');
  else if (bg) el.style.backgroundColor = bg;
  if (seg.bold) cls.push('a-bold');
  if (seg.dim) cls.push('a-dim');
  if (seg.italic) cls.push('a-italic');
  if (seg.underline) cls.push('a-underline');
  if (seg.strike) cls.push('a-strike');
  if (cls.length) el.className = (el.className ? el.className + ' ' : '') + cls.join(' ');
  return el;
}
