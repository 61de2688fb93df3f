// The SSE parser and the delta fold, without a server.

import assert from "node:assert/strict";
import { test } from "node:test";
import { DeltaFolder, SseParser } from "../dist/index.js";
import { fixture } from "./harness.mjs";

/** Feeds `chunks` one by one; returns every message. */
function parse(...chunks) {
  const p = new SseParser();
  return { messages: chunks.flatMap((c) => p.feed(c)), parser: p };
}

test("sse: \\n, \\r\\n and \\r line ends, a \\r\\n split across chunks", () => {
  const { messages } = parse("id: 1\ndata: a\n\n", "id: 2\r\ndata: b\r\n\r\n", "id: 3\rdata: c\r\r", "id: 4\r", "\ndata: d\r", "\n\r", "\n");
  assert.deepEqual(
    messages.map((m) => [m.id, m.data]),
    [["1", "a"], ["2", "b"], ["3", "c"], ["4", "d"]],
  );
});

test("sse: multi-line data, event names, comments, no space after the colon", () => {
  const { messages, parser } = parse(": heartbeat\n\n", "event: error\ndata:{\"error\":\n", "data:  \"x\"}\n", "\n", ":\n\n");
  assert.equal(messages.length, 1);
  assert.equal(messages[0].event, "error");
  assert.equal(messages[0].data, '{"error":\n "x"}');
  assert.equal(parser.comments, 2);
});

test("sse: byte-by-byte feeding, a BOM, unknown fields, and a message left open at the end", () => {
  const text = "\uFEFFretry: 1500\nfoo: bar\nid: 9\ndata: x\n\ndata: unfinished\n";
  const p = new SseParser();
  const messages = [...text].flatMap((ch) => p.feed(ch));
  assert.deepEqual(messages, [{ event: "message", data: "x", id: "9", retry: 1500 }]);
  assert.equal(p.lastEventId, "9");
});

test("deltas: thinking, commentary and a lifecycle error fold as the run goes", () => {
  const events = fixture("f1", "cut.expected.jsonl")
    .trim()
    .split("\n")
    .map((l) => ({ ...JSON.parse(l), tenant: "t", run_id: "r", ts_ms: 0 }));
  const folder = new DeltaFolder();
  const deltas = events.map((ev) => folder.apply(ev, 0)).filter(Boolean);
  assert.deepEqual(
    deltas.map((d) => [d.seq, d.thinking, d.content, d.error, d.done]),
    [
      [3, "Plan first.", "", null, false],
      [5, "Plan first.", "Half an ans", null, false],
      [6, "Plan first.", "Half an ans", "stream_closed", true],
    ],
  );
});

test("deltas: a diagnostic names the error", () => {
  const events = fixture("f1", "error.expected.jsonl")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
  const folder = new DeltaFolder();
  const last = events.map((ev) => folder.apply(ev, 0)).filter(Boolean).at(-1);
  assert.equal(last.error, "overloaded_error: Overloaded");
  assert.equal(last.done, true);
});
