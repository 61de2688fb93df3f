// streamgate web page: one run's canonical events (the run stream, display-safe) folded
// into what the page shows, in the order the events give. No rendering here: the page
// (app.js) draws the blocks; tests can fold a run without a browser.
//
// Blocks, in event order:
//   {kind: 'thinking', variant, text, start_ms, end_ms, active}
//   {kind: 'text', text, answer, active}  commentary; `answer` once the final claims it
//   {kind: 'tool', id, name, tool_kind, input, output, error, state}
//       state: running | done | failed | requested (the model asked for it; the run
//       ended for the caller to run it, so nothing ran here)
//   {kind: 'notice', text, level}
// Every block has `rev`, bumped when it changes (the page redraws only those).
'use strict';
(function (root) {
  const FAILED = ['fail', 'error', 'cancel', 'declin', 'reject', 'denied'];

  function newRun() {
    return {
      blocks: [], status: 'live', reason: null, tenant: null, run_id: null, session: null,
      provider: null, model: null, started_ms: null, last_ms: null, ended_ms: null,
      last_seq: 0, usage: null, truncated: false,
      // Fold state: open thinking segments, the open commentary block, tools by id.
      _thinking: new Map(), _text: null, _textSinceActivity: false, _tools: new Map(),
    };
  }

  function push(run, block) {
    block.rev = 1;
    run.blocks.push(block);
    return block;
  }
  function touch(block) { block.rev = (block.rev || 0) + 1; }

  // A delta, or a snapshot that replaces the text (snapshots carry the whole text).
  // `rewrites` counts snapshots that replaced the text: a view that saw the same count
  // only has to append what was added (a long thinking segment costs the page its new
  // characters per draw, not the whole text again).
  function grow(block, d) {
    if (typeof d.delta === 'string') block.text += d.delta;
    else if (typeof d.text === 'string' && d.text !== block.text) {
      block.text = d.text;
      block.rewrites = (block.rewrites || 0) + 1;
    }
    touch(block);
  }

  function thinking(run, d, ts) {
    if (d.tokens !== undefined && d.delta === undefined && d.text === undefined && !d.phase) return;
    const key = (d.variant || 'raw') + '\u0000' + (d.id ?? '');
    let b = run._thinking.get(key);
    // An end marker only closes its segment: text streamed before it (a provider that
    // ends reasoning after the answer began) stays open for the final answer to claim.
    if (d.phase === 'end' && d.delta === undefined && d.text === undefined) {
      if (b) { endThinking(b, ts); run._thinking.delete(key); }
      return;
    }
    run._textSinceActivity = false;
    closeText(run);
    if (d.phase === 'start' || !b) {
      if (b && d.phase === 'start') endThinking(b, ts);
      b = push(run, { kind: 'thinking', variant: d.variant || 'raw', text: '', start_ms: ts, end_ms: null, active: true });
      run._thinking.set(key, b);
    }
    if (d.delta !== undefined || d.text !== undefined) grow(b, d);
    b.last_ms = ts;
    if (d.phase === 'end') {
      endThinking(b, ts);
      run._thinking.delete(key);
    }
  }
  function endThinking(b, ts) {
    b.active = false;
    b.end_ms = ts;
    touch(b);
  }
  function endAllThinking(run, ts) {
    for (const b of run._thinking.values()) endThinking(b, b.last_ms ?? ts);
    run._thinking.clear();
  }

  function closeText(run) {
    if (run._text) {
      run._text.active = false;
      touch(run._text);
      run._text = null;
    }
  }

  function assistant(run, d, ts) {
    if (d.phase === 'final_answer') return finalAnswer(run, d);
    const same = run._text && run._text.id === (d.id ?? null);
    if (!same) {
      closeText(run);
      run._text = push(run, { kind: 'text', id: d.id ?? null, text: '', answer: false, active: true });
      run._textSinceActivity = true;
    }
    grow(run._text, d);
    if (d.status === 'completed') closeText(run);
  }

  // The final answer claims the commentary block that streamed it (same segment id,
  // else the block opened since the last thinking or tool activity); a final nobody
  // streamed is a block of its own. Either way it is shown once, as the answer.
  function finalAnswer(run, d) {
    const text = d.text ?? d.delta ?? '';
    let b = null;
    if (d.id != null) b = run.blocks.find(x => x.kind === 'text' && x.id === d.id) || null;
    if (!b && run._textSinceActivity) {
      for (let i = run.blocks.length - 1; i >= 0; i--) {
        const x = run.blocks[i];
        if (x.kind === 'text') { b = x; break; }
        if (x.kind !== 'notice') break;
      }
    }
    closeText(run);
    if (!text.trim()) return;
    if (!b) b = push(run, { kind: 'text', id: d.id ?? null, text: '', answer: true, active: false });
    b.text = text;
    b.answer = true;
    b.active = false;
    if (d.truncated) run.truncated = true;
    touch(b);
  }

  function pretty(v) {
    if (v === undefined || v === null) return '';
    if (typeof v === 'string') return v;
    try { return JSON.stringify(v, null, 2); } catch (e) { return String(v); }
  }

  function item(run, d) {
    run._textSinceActivity = false;
    closeText(run);
    const key = d.id ?? ('item-' + (d.index ?? 0));
    let t = run._tools.get(key);
    if (!t) {
      t = push(run, { kind: 'tool', id: key, name: d.name || d.kind || 'tool', tool_kind: d.kind || 'tool', input: '', output: '', error: null, state: 'running', _args: '' });
      run._tools.set(key, t);
    }
    if (d.name) t.name = d.name;
    if (typeof d.input_delta === 'string') { t._args += d.input_delta; t.input = t._args; }
    const input = d.arguments ?? d.input;
    if (input !== undefined && !(typeof input === 'object' && input && !Array.isArray(input) && Object.keys(input).length === 0 && t.input)) {
      t.input = pretty(input);
    }
    if (typeof d.output_delta === 'string') t.output += d.output_delta;
    const out = d.result ?? d.output;
    if (out !== undefined && out !== null) t.output = pretty(out);
    if (d.phase === 'end') {
      const status = String(d.status || '').toLowerCase();
      if (FAILED.some(w => status.includes(w))) {
        t.state = 'failed';
        t.error = t.output || status;
      } else {
        t.state = t.output ? 'done' : 'ended';
      }
    }
    touch(t);
  }

  function lifecycle(run, d, ts) {
    if (d.provider) run.provider = d.provider;
    if (d.model) run.model = d.model;
    if (d.usage) run.usage = d.usage;
    const terminal = d.phase === 'end' || d.phase === 'error';
    if (d.phase === 'error' || (terminal && d.diagnostic && d.reason === 'error')) {
      const diag = d.diagnostic || {};
      push(run, { kind: 'notice', level: 'error', text: diag.message || diag.code || d.reason || 'error' });
    }
    if (!terminal) return;
    closeText(run);
    endAllThinking(run, ts);
    run.reason = d.reason || null;
    run.ended_ms = ts;
    run.status = statusOf(d);
    // A tool the model only asked for: the turn ended for the caller to run it.
    for (const t of run._tools.values()) {
      if (t.state === 'ended' || t.state === 'running') {
        t.state = d.reason === 'tool_use' ? 'requested' : (t.state === 'ended' ? 'done' : 'failed');
        touch(t);
      }
    }
  }

  function statusOf(d) {
    if (d.phase === 'error') return 'error';
    switch (d.reason) {
      case undefined: case null: case 'completed': case 'stop_sequence': case 'tool_use': case 'truncated':
        return 'completed';
      case 'paused': return 'paused';
      case 'error': return 'error';
      case 'refusal': case 'content_filter': return 'withdrawn';
      case 'stream_closed': return 'interrupted';
      default: return 'incomplete';
    }
  }

  // Folds one event (as the run stream sends it) into `run`. Events at or below the
  // last seq folded are ignored (a resumed stream never doubles a block).
  function apply(run, ev) {
    if (typeof ev.seq !== 'number' || ev.seq <= run.last_seq) return false;
    run.last_seq = ev.seq;
    const ts = ev.ts_ms;
    if (run.tenant === null) {
      run.tenant = ev.tenant ?? '';
      run.run_id = ev.run_id ?? '';
      run.session = ev.session_key ?? null;
      run.started_ms = ts;
    }
    run.last_ms = ts;
    const d = ev.data || {};
    switch (ev.stream) {
      case 'thinking': thinking(run, d, ts); break;
      case 'assistant': assistant(run, d, ts); break;
      case 'item': item(run, d); break;
      case 'lifecycle': lifecycle(run, d, ts); break;
      default: break;
    }
    return true;
  }

  const api = { newRun, apply };
  if (typeof module === 'object' && module.exports) module.exports = api;
  else root.StreamgateFold = api;
})(typeof window !== 'undefined' ? window : globalThis);
