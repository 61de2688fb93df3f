// streamgate web page: a client of the run stream. The run list comes pushed over SSE
// (/api/runs/events); a run is followed from its events (/v1/runs/{tenant}/{run}/events),
// folded in fold.js into blocks in event order. Model text becomes HTML only through the
// server (/api/render: markdown rendered and sanitized there); every other string is set
// as text.
'use strict';
const $ = id => document.getElementById(id);
const Fold = window.StreamgateFold;
const DEFAULT_TENANT = 'default';
const RENDER_EVERY_MS = 150;

let runsCache = [];
let cur = null; // {tenant, run, es, fold, views: Map(block -> view), retry}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });
}
function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 10) return 'just now';
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return new Date(ms).toLocaleDateString();
}
function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 60 ? s + ' s' : Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
}
const LABEL = {
  live: 'Live', completed: 'Completed', paused: 'Paused', incomplete: 'Incomplete',
  error: 'Error', interrupted: 'Interrupted', withdrawn: 'Withdrawn',
};

// ---- theme ----
function applyTheme(t) {
  if (t) document.documentElement.dataset.theme = t;
  else delete document.documentElement.dataset.theme;
}
function currentScheme() {
  return document.documentElement.dataset.theme ||
    (matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light');
}
try { applyTheme(localStorage.getItem('sg-theme')); } catch (e) { /* storage off */ }
$('theme').onclick = () => {
  const next = currentScheme() === 'dark' ? 'light' : 'dark';
  applyTheme(next);
  try { localStorage.setItem('sg-theme', next); } catch (e) { /* storage off */ }
};

// ---- narrow screens: the run list is a drawer ----
function setNav(open) {
  document.body.classList.toggle('nav-open', open);
  $('menu').setAttribute('aria-expanded', String(open));
}
$('menu').onclick = () => setNav(!document.body.classList.contains('nav-open'));
$('scrim').onclick = () => setNav(false);

// ---- run list (pushed) ----
function renderList(runs) {
  runsCache = runs;
  const box = $('runs');
  box.textContent = '';
  if (!runs.length) box.appendChild(el('div', 'no-runs', 'No runs yet.'));
  for (const r of runs) {
    const sel = cur && r.run_id === cur.run && r.tenant === cur.tenant;
    const b = el('button', 'run-item' + (sel ? ' sel' : ''));
    b.type = 'button';
    b.dataset.run = r.run_id;
    b.dataset.tenant = r.tenant;
    b.dataset.status = r.status;
    const top = el('div', 'run-top');
    top.appendChild(el('span', 'dot ' + r.status));
    top.appendChild(el('span', 'run-id', r.run_id));
    top.appendChild(el('span', 'run-when', r.status === 'live' ? 'live' : ago(r.ended_ms || r.updated_ms)));
    b.appendChild(top);
    const sub = el('div', 'run-preview', r.preview || (r.status === 'live' ? 'working…' : LABEL[r.status] || ''));
    b.appendChild(sub);
    if (r.tenant !== DEFAULT_TENANT) b.appendChild(el('div', 'run-tenant', r.tenant));
    b.title = r.run_id + ' · tenant ' + r.tenant + (r.chat_id ? ' · ' + r.chat_id : '');
    b.onclick = () => { open(r.tenant, r.run_id, true); setNav(false); };
    box.appendChild(b);
  }
  $('conn').className = 'conn ok';
  $('conn').textContent = runs.some(r => r.status === 'live') ? 'live' : 'idle';
  if (!cur) {
    $('empty').hidden = false;
    $('empty-title').textContent = runs.length ? 'Pick a run' : 'Waiting for runs';
  }
}
function followList() {
  const es = new EventSource('/api/runs/events');
  es.onmessage = m => renderList(JSON.parse(m.data));
  es.onerror = () => {
    $('conn').className = 'conn down';
    $('conn').textContent = 'reconnecting…';
    if (es.readyState === EventSource.CLOSED) setTimeout(followList, 2000);
  };
}

// ---- markdown, rendered and sanitized by the server ----
async function renderMarkdown(view, block) {
  if (view.rendering) { view.again = true; return; }
  view.rendering = true;
  try {
    do {
      view.again = false;
      const text = block.text;
      const r = await fetch('/api/render', { method: 'POST', body: text, headers: { 'content-type': 'text/plain; charset=utf-8' } });
      if (!r.ok) throw new Error('render ' + r.status);
      const html = await r.text();
      if (view.renderedText !== text) {
        view.body.innerHTML = html; // server-rendered, sanitized
        view.renderedText = text;
        decorateCode(view.body);
      }
      if (view.again) await new Promise(res => setTimeout(res, RENDER_EVERY_MS));
    } while (view.again);
  } catch (e) {
    view.body.textContent = block.text; // shown as text when the server cannot render
  } finally {
    view.rendering = false;
  }
}

// Code blocks: a language label, a copy button and highlighting (highlight.js reads the
// block's text and writes escaped spans: no model text becomes markup).
function decorateCode(root) {
  for (const pre of root.querySelectorAll('pre')) {
    const code = pre.querySelector('code');
    if (!code || pre.classList.contains('math') || pre.parentElement.classList.contains('code')) continue;
    const lang = (pre.dataset.lang || '').toLowerCase();
    const wrap = el('div', 'code');
    const bar = el('div', 'code-bar');
    bar.appendChild(el('span', 'code-lang', lang || 'text'));
    const copy = el('button', 'copy', 'Copy');
    copy.type = 'button';
    copy.onclick = () => copyText(code.textContent, copy);
    bar.appendChild(copy);
    pre.replaceWith(wrap);
    wrap.appendChild(bar);
    wrap.appendChild(pre);
    if (window.hljs && lang && hljs.getLanguage(lang)) {
      code.className = 'language-' + lang;
      hljs.highlightElement(code);
    }
  }
}
async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch (e) {
    const t = el('textarea');
    t.value = text;
    document.body.appendChild(t);
    t.select();
    try { ok = document.execCommand('copy'); } catch (e2) { ok = false; }
    t.remove();
  }
  button.textContent = ok ? 'Copied' : 'Copy failed';
  document.body.dataset.copied = ok ? text : '';
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

// ---- one run's blocks ----
function thinkingLabel(b) {
  if (b.variant === 'redacted') return b.active ? 'Thinking (hidden)…' : 'Thought (hidden by the provider)';
  if (b.active) return 'Thinking… ' + duration(Date.now() - b.start_ms);
  return 'Thought for ' + Math.max(1, Math.round((b.end_ms - b.start_ms) / 1000)) + ' s';
}
const TOOL_ICON = { tool: '🔧', shell: '💻', command: '💻', bash: '💻', web_search: '🌐', search: '🔍', file: '📄', edit: '✏️', mcp: '🔌' };
const STATE_LABEL = { running: 'running', done: 'done', failed: 'failed', requested: 'requested', ended: 'called' };
function toolIcon(b) {
  const n = (b.name || '').toLowerCase();
  if (/bash|shell|exec|command/.test(n)) return '💻';
  if (/search/.test(n)) return '🔍';
  if (/web|fetch|http|url/.test(n)) return '🌐';
  if (/read|file|write|edit/.test(n)) return /write|edit/.test(n) ? '✏️' : '📄';
  return TOOL_ICON[b.tool_kind] || '🔧';
}
function oneLine(s) {
  const t = (s || '').replace(/\s+/g, ' ').trim();
  return t.length > 120 ? t.slice(0, 119) + '…' : t;
}

function makeView(b) {
  const v = { kind: b.kind, answer: !!b.answer, rev: 0 };
  if (b.kind === 'thinking') {
    v.root = el('details', 'block thinking');
    v.summary = el('summary', '');
    v.body = el('div', 'thought');
    v.root.append(v.summary, v.body);
    v.userToggled = false;
    v.root.addEventListener('toggle', () => { if (v.programmatic) v.programmatic = false; else v.userToggled = true; });
  } else if (b.kind === 'tool') {
    v.root = el('details', 'block tool');
    v.summary = el('summary', '');
    v.body = el('div', 'tool-body');
    v.root.append(v.summary, v.body);
  } else if (b.kind === 'text' && b.answer) {
    v.root = el('article', 'block answer');
    v.root.appendChild(el('div', 'answer-label', 'Answer'));
    v.body = el('div', 'md final');
    v.root.appendChild(v.body);
  } else if (b.kind === 'text') {
    v.root = el('div', 'block commentary');
    v.body = el('div', 'md');
    v.root.appendChild(v.body);
  } else {
    v.root = el('div', 'block notice ' + (b.level || ''));
  }
  v.root.dataset.kind = b.kind === 'text' ? (b.answer ? 'answer' : 'commentary') : b.kind;
  return v;
}

// Sets a growing text: appends what was added since the last draw, unless the text was
// rewritten (then sets it whole).
function setGrowing(v, node, text, rewrites) {
  if (v.shownRewrites === (rewrites || 0) && v.shownLen !== undefined && text.length >= v.shownLen) {
    if (text.length > v.shownLen) node.appendChild(document.createTextNode(text.slice(v.shownLen)));
  } else {
    node.textContent = text;
  }
  v.shownLen = text.length;
  v.shownRewrites = rewrites || 0;
}

function drawThinking(v, b) {
  v.summary.textContent = thinkingLabel(b);
  setGrowing(v, v.body, b.text, b.rewrites);
  v.root.classList.toggle('active', b.active);
  v.root.dataset.startMs = b.start_ms;
  if (b.end_ms != null) v.root.dataset.endMs = b.end_ms;
  if (!v.userToggled && v.root.open !== b.active) { v.programmatic = true; v.root.open = b.active; }
}
function drawTool(v, b) {
  v.root.className = 'block tool ' + b.state;
  v.summary.textContent = '';
  v.summary.appendChild(el('span', 'tool-icon', toolIcon(b)));
  v.summary.appendChild(el('span', 'tool-name', b.name));
  v.summary.appendChild(el('span', 'tool-state ' + b.state, STATE_LABEL[b.state] || b.state));
  const detail = oneLine(b.output && b.state !== 'running' ? b.input + ' → ' + b.output : b.input);
  if (detail) v.summary.appendChild(el('span', 'tool-detail', detail));
  v.body.textContent = '';
  if (b.input) { v.body.appendChild(el('div', 'io-label', 'Input')); v.body.appendChild(el('pre', 'io', b.input)); }
  if (b.output) { v.body.appendChild(el('div', 'io-label', b.state === 'failed' ? 'Error' : 'Output')); v.body.appendChild(el('pre', 'io', b.output)); }
  if (b.state === 'requested') v.body.appendChild(el('div', 'io-note', 'The model asked for this call; the run ended for the caller to run it.'));
}
function drawText(v, b) {
  v.root.classList.toggle('streaming', !!b.active);
  if (v.renderedText === undefined && !v.rendering) v.body.textContent = b.text; // until rendered
  renderMarkdown(v, b);
}

function draw() {
  if (!cur) return;
  cur.drawPending = false;
  const run = cur.fold;
  const box = $('blocks');
  run.blocks.forEach((b, i) => {
    let v = cur.views[i];
    if (v && b.kind === 'text' && v.answer !== !!b.answer) {
      const nv = makeView(b); // commentary claimed as the answer: same place, new look
      v.root.replaceWith(nv.root);
      v = cur.views[i] = nv;
    }
    if (!v) {
      v = cur.views[i] = makeView(b);
      box.appendChild(v.root);
    }
    if (v.rev === b.rev && !(b.kind === 'thinking' && b.active)) return;
    v.rev = b.rev;
    if (b.kind === 'thinking') drawThinking(v, b);
    else if (b.kind === 'tool') drawTool(v, b);
    else if (b.kind === 'text') drawText(v, b);
    else v.root.textContent = b.text;
  });
  drawHead();
}
// Draws at most every DRAW_EVERY_MS whatever the event rate: at once when the last draw
// is that old, else once by a timer. The run's end draws at once (a page that renders no
// frames or runs no timers, like a DOM dump, still shows how the run ended).
const DRAW_EVERY_MS = 40;
function scheduleDraw(now) {
  if (!cur) return;
  const c = cur;
  const since = performance.now() - (c.drewAt || 0);
  if (now || since >= DRAW_EVERY_MS) {
    c.drewAt = performance.now();
    draw();
  } else if (!c.drawPending) {
    c.drawPending = true;
    setTimeout(() => { if (cur === c) { c.drewAt = performance.now(); draw(); } }, DRAW_EVERY_MS);
  }
}

function drawHead() {
  const run = cur.fold;
  const started = run.started_ms != null;
  const status = started ? run.status : 'waiting';
  const badge = $('badge');
  badge.className = 'badge ' + status;
  badge.textContent = !started ? 'Waiting for the run…'
    : status === 'live' ? '● Live'
    : (LABEL[status] || status) + (run.ended_ms ? ' · ended ' + clock(run.ended_ms) : '');
  const meta = ['tenant ' + cur.tenant];
  if (run.session) meta.push('session ' + run.session);
  if (run.model) meta.push(run.model);
  if (started) meta.push('started ' + clock(run.started_ms));
  if (run.ended_ms) meta.push('took ' + duration(run.ended_ms - run.started_ms));
  if (run.truncated) meta.push('answer cut by the token limit');
  $('meta').textContent = meta.join(' · ');
  document.title = (status === 'live' ? '● ' : '') + cur.run + ' · streamgate';
  document.body.dataset.status = status;
}

function showGone(message, replayIntro) {
  const g = $('gone');
  g.hidden = false;
  g.textContent = '';
  g.appendChild(el('p', '', message));
  g.appendChild(el('p', '', replayIntro || 'An operator can replay it from the archive:'));
  const cmd = 'streamgate replay ' + cur.run + (cur.tenant !== DEFAULT_TENANT ? ' --tenant ' + cur.tenant : '');
  g.appendChild(el('pre', 'cmd', cmd));
}

function connect() {
  const c = cur;
  const url = '/v1/runs/' + encodeURIComponent(c.tenant) + '/' + encodeURIComponent(c.run) +
    '/events?wait=3600' + (c.fold.last_seq ? '&after=' + c.fold.last_seq : '');
  const es = c.es = new EventSource(url);
  es.onopen = () => { document.body.dataset.sse = 'open'; };
  es.onmessage = m => {
    if (cur !== c) return;
    let ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    Fold.apply(c.fold, ev);
    $('gone').hidden = true;
    const ended = c.fold.status !== 'live';
    if (ended) { es.close(); document.body.dataset.sse = 'ended'; }
    scheduleDraw(ended);
  };
  // The stream says why it ends early (`event: error` with data), or the connection
  // dropped (no data): EventSource resumes by itself with Last-Event-ID; when it gave up
  // (an HTTP error), reconnect after a pause from the last seq folded.
  es.addEventListener('error', m => {
    if (cur !== c) return;
    document.body.dataset.sse = 'closed';
    if (m.data) {
      es.close();
      let code = '';
      try { code = JSON.parse(m.data).code || ''; } catch (e) { code = ''; }
      if (code === 'not_started' && !c.fold.started_ms) {
        showGone('This run is not in the event stream: it has not started yet, or it ended longer ago than the stream keeps events.');
        $('badge').textContent = 'Not found';
        return;
      }
      c.retry = setTimeout(connect, 1000);
    } else if (es.readyState === EventSource.CLOSED) {
      c.retry = setTimeout(connect, 2000);
    }
  });
}

function open(tenant, run, push) {
  if (cur) { if (cur.es) cur.es.close(); clearTimeout(cur.retry); }
  if (!tenant) {
    const rows = runsCache.filter(r => r.run_id === run);
    tenant = rows.length === 1 ? rows[0].tenant : DEFAULT_TENANT;
  }
  cur = { tenant, run, es: null, fold: Fold.newRun(), views: [], retry: null, drawPending: false };
  if (push) history.replaceState(null, '', '?run=' + encodeURIComponent(run) + '&tenant=' + encodeURIComponent(tenant));
  document.querySelectorAll('.run-item').forEach(b => b.classList.toggle('sel', b.dataset.run === run && b.dataset.tenant === tenant));
  $('blocks').textContent = '';
  $('gone').hidden = true;
  $('empty').hidden = true;
  $('run').hidden = false;
  $('title').textContent = run;
  $('top-title').textContent = run;
  document.body.dataset.sse = 'closed';
  drawHead();
  connect();
  // A link to a run that does not stream yet: say what waiting means, and how to see it
  // if it ended longer ago than the event stream keeps runs.
  const c = cur;
  setTimeout(() => {
    if (cur === c && c.fold.started_ms == null && $('gone').hidden) {
      showGone('Waiting for this run to start. If it ended longer ago than the event stream keeps runs, it will not show here.',
        'An operator can replay it from the archive:');
    }
  }, 2000);
}

// Live durations (thinking timers, relative times in the list) move without events.
setInterval(() => { if (cur && cur.fold.status === 'live') scheduleDraw(); }, 1000);
setInterval(() => renderList(runsCache), 15000);

const params = new URLSearchParams(location.search);
if (params.get('run')) open(params.get('tenant'), params.get('run'), false);
followList();
