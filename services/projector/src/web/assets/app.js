// streamgate web channel page. Every string from the server is set as text, except the
// answer and commentary HTML, which the server rendered from markdown and sanitized.
'use strict';
const $ = id => document.getElementById(id);
let cur = null, curTenant = "", es = null, lastView = null, runsCache = [];
const userOpen = new Map(); // thinking block index -> open state the reader chose

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
function badgeText(v) {
  if (v.status === 'live') return '● Live';
  const label = LABEL[v.status] || v.status;
  return v.ended_ms ? label + ' · ended ' + clock(v.ended_ms) : label;
}

// ---- run list ----
function renderList(runs) {
  runsCache = runs;
  const box = $('runs');
  box.textContent = '';
  if (!runs.length) box.appendChild(el('div', 'no-runs', 'No runs yet.'));
  for (const r of runs) {
    // A run is (tenant, run id): the same run id under two tenants is two runs.
    const b = el('button', 'run-item' + (r.run_id === cur && (!curTenant || r.tenant === curTenant) ? ' sel' : ''));
    b.dataset.run = r.run_id;
    b.dataset.tenant = r.tenant;
    b.dataset.status = r.status;
    const top = el('div', 'run-top');
    top.appendChild(el('span', 'dot ' + r.status));
    top.appendChild(el('span', 'run-id', r.run_id));
    top.appendChild(el('span', 'run-when', r.status === 'live' ? 'live' : ago(r.ended_ms || r.updated_ms)));
    b.appendChild(top);
    b.appendChild(el('div', 'run-preview', r.preview || (r.status === 'live' ? 'working…' : LABEL[r.status] || '')));
    b.title = r.run_id + ' · tenant ' + r.tenant + ' · ' + r.chat_id;
    b.onclick = () => open(r.run_id, r.tenant, true);
    box.appendChild(b);
  }
  $('conn').className = 'conn ok';
  $('conn').textContent = runs.some(r => r.status === 'live') ? 'live' : 'idle';
  if (!cur) {
    $('empty').hidden = false;
    $('empty-title').textContent = runs.length ? 'Pick a run' : 'Waiting for runs';
  }
}
async function refresh() {
  try {
    const r = await fetch('/api/runs', { cache: 'no-store' });
    if (!r.ok) throw new Error(r.status);
    renderList(await r.json());
  } catch (e) {
    $('conn').className = 'conn down';
    $('conn').textContent = 'reconnecting…';
  }
}

// ---- one run ----
function thinkingStep(s, i) {
  const d = el('details', 'thinking' + (s.active ? ' active' : ''));
  d.dataset.i = i;
  const label = s.active ? 'Thinking…' : 'Thought for ' + Math.max(1, s.secs ?? 0) + ' s';
  d.appendChild(el('summary', '', label));
  d.appendChild(el('div', 'thought', s.text));
  d.open = userOpen.has(i) ? userOpen.get(i) : s.active;
  d.addEventListener('toggle', () => userOpen.set(i, d.open));
  return d;
}
function toolStep(s) {
  const row = el('div', 'tool ' + s.state);
  row.appendChild(el('span', 'tool-icon', s.icon));
  row.appendChild(el('span', 'tool-name', s.name));
  row.appendChild(el('span', 'tool-state ' + s.state, s.state === 'done' ? 'done' : s.state === 'failed' ? 'failed' : 'running'));
  if (s.detail) {
    const d = el('span', 'tool-detail', s.detail);
    d.title = s.detail;
    row.appendChild(d);
  }
  return row;
}
function textStep(s, last, live) {
  const d = el('div', 'commentary md' + (last && live ? ' streaming' : ''));
  d.innerHTML = s.html; // server-rendered, sanitized
  return d;
}
function renderRun(v) {
  const prev = lastView;
  lastView = v;
  $('empty').hidden = true;
  $('run').hidden = false;
  $('title').textContent = v.run_id;
  const took = (v.ended_ms || Date.now()) - v.started_ms;
  $('meta').textContent = 'chat ' + v.chat_id + ' · started ' + clock(v.started_ms) +
    (v.ended_ms ? ' · took ' + duration(took) : '');
  // The list shows this run too: bring it up to date as soon as the run changes state.
  if (!prev || prev.status !== v.status) refresh();
  const badge = $('badge');
  badge.className = 'badge ' + v.status;
  badge.textContent = badgeText(v);
  document.title = (v.status === 'live' ? '● ' : '') + v.run_id + ' · streamgate';
  if (!prev || JSON.stringify(prev.steps) !== JSON.stringify(v.steps) || prev.status !== v.status) {
    const box = $('steps');
    box.textContent = '';
    const live = v.status === 'live';
    let ti = 0;
    v.steps.forEach((s, i) => {
      if (s.kind === 'thinking') box.appendChild(thinkingStep(s, ti++));
      else if (s.kind === 'tool') box.appendChild(toolStep(s));
      else box.appendChild(textStep(s, i === v.steps.length - 1, live));
    });
  }
  if (!prev || prev.final_html !== v.final_html) {
    $('answer').hidden = !v.final_html;
    $('final').innerHTML = v.final_html || ''; // server-rendered, sanitized
  }
  $('suffix').hidden = !v.suffix;
  $('suffix').textContent = v.suffix || '';
  const n = $('notices');
  n.textContent = '';
  for (const t of v.notices) n.appendChild(el('div', 'notice', t));
}
function open(run, tenant, push) {
  if (es) es.close();
  cur = run;
  curTenant = tenant || '';
  const tq = curTenant ? '?tenant=' + encodeURIComponent(curTenant) : '';
  lastView = null;
  userOpen.clear();
  document.body.dataset.sse = 'closed';
  if (push) history.replaceState(null, '', '?run=' + encodeURIComponent(run) + (curTenant ? '&tenant=' + encodeURIComponent(curTenant) : ''));
  document.querySelectorAll('.run-item').forEach(b => b.classList.toggle('sel', b.dataset.run === run && (!curTenant || b.dataset.tenant === curTenant)));
  $('steps').textContent = '';
  $('answer').hidden = true;
  es = new EventSource('/runs/' + encodeURIComponent(run) + '/events' + tq);
  es.onopen = () => { document.body.dataset.sse = 'open'; };
  es.onerror = () => { document.body.dataset.sse = 'closed'; };
  es.onmessage = m => renderRun(JSON.parse(m.data));
  // An ended run shows at once, without waiting for the stream to connect.
  fetch('/api/runs/' + encodeURIComponent(run) + tq, { cache: 'no-store' })
    .then(r => (r.ok ? r.json() : null))
    .then(v => { if (v && cur === run && !lastView) renderRun(v); })
    .catch(() => {});
  $('empty').hidden = true;
  $('run').hidden = false;
  $('title').textContent = run;
  $('badge').className = 'badge';
  $('badge').textContent = 'loading…';
}

const params = new URLSearchParams(location.search);
const q = params.get('run');
if (q) open(q, params.get('tenant'), false);
refresh();
setInterval(refresh, 2000);
// Keep relative times fresh while idle.
setInterval(() => renderList(runsCache), 15000);
