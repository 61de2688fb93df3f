// The client against a real `streamgate up` (STREAMGATE_BIN, default the repository's
// target/debug/streamgate), fed over the HTTP ingest with the repository's f1 captures.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AuthError, StreamError, StreamgateClient } from "../dist/index.js";
import { fixture, ingest, pausedIngest, startProxy, startUp, waitFor } from "./harness.mjs";

const TENANT = "acme";
const TOOL_USE = fixture("f1", "tool-use.sse");
/** tool-use.sse up to its tool block: events 1 (start) and 2 (commentary) only. */
const TOOL_USE_SPLIT = TOOL_USE.indexOf('data: {"type":"content_block_start","index":1');
const expected = (name) =>
  fixture("f1", name)
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);

let up;
let client;

before(async () => {
  up = await startUp();
  client = new StreamgateClient({ baseUrl: up.baseUrl, token: up.token });
  await ingest(up, TENANT, "follow", TOOL_USE);
  await ingest(up, TENANT, "hello", fixture("f1", "end-turn.sse"));
}, { timeout: 90_000 });

after(async () => {
  if (up) assert.deepEqual(await up.stop(), { code: 0, signal: null }, "`up` exits cleanly on SIGINT");
}, { timeout: 30_000 });

describe("events", { timeout: 30_000 }, () => {
  test("follow: seq 1..N in order, ends after the terminal event", async () => {
    const want = expected("tool-use.expected.jsonl");
    const got = [];
    for await (const ev of client.events(TENANT, "follow")) got.push(ev);
    assert.deepEqual(got.map((e) => e.seq), range(1, want.length));
    assert.deepEqual(
      got.map(({ seq, stream, data }) => ({ seq, stream, data })),
      want,
    );
    assert.ok(got.every((e) => e.tenant === TENANT && e.run_id === "follow" && typeof e.ts_ms === "number"));
    const last = got.at(-1);
    assert.equal(last.stream, "lifecycle");
    assert.equal(last.data.phase, "end");
  });

  test("resume with after=3 yields 4..N", async () => {
    const seqs = [];
    for await (const ev of client.events(TENANT, "follow", { after: 3 })) seqs.push(ev.seq);
    assert.deepEqual(seqs, range(4, 7));
  });

  test("resume after the terminal event: ends at once, no events", async () => {
    const seqs = [];
    for await (const ev of client.events(TENANT, "follow", { after: 7, retry: { maxRetries: 0 } })) seqs.push(ev.seq);
    assert.deepEqual(seqs, []);
  });

  test("a connection dropped mid-run resumes with no gap and no duplicate", async () => {
    const run = "dropped";
    const ingestion = pausedIngest(up, TENANT, run);
    ingestion.write(TOOL_USE.slice(0, TOOL_USE_SPLIT)); // the run is open: events 1-2
    // K = 10 bytes into the message of seq 2: event 1 gets through, event 2 is cut.
    const proxy = await startProxy(
      { host: up.webHost, port: up.webPort },
      { cutFirstAfter: (response) => { const at = response.indexOf("\nid: 2\n"); return at < 0 ? undefined : at + 10; } },
    );
    try {
      const c = new StreamgateClient({ baseUrl: proxy.url, token: up.token });
      const seqs = [];
      let beforeCut;
      let rest = false;
      for await (const ev of c.events(TENANT, run, { wait: 30, retry: { initialDelayMs: 50 } })) {
        seqs.push(ev.seq);
        if (proxy.conns.length === 1) beforeCut = ev.seq;
        if (!rest && proxy.conns.length >= 2) {
          rest = true;
          ingestion.write(TOOL_USE.slice(TOOL_USE_SPLIT)); // the run goes on after the drop
        }
      }
      assert.deepEqual(seqs, range(1, 7));
      assert.equal(proxy.conns.length, 2, "one reconnection");
      assert.ok(proxy.conns[0].cut, "the first connection was cut");
      assert.ok(beforeCut >= 1, "an event arrived before the cut");
      const resumed = /\r\nlast-event-id: (\d+)\r\n/i.exec(proxy.conns[1].request);
      assert.ok(resumed, `the reconnection sends Last-Event-ID:\n${proxy.conns[1].request}`);
      assert.equal(Number(resumed[1]), beforeCut);
      const firstId = /\bid: (\d+)\n/.exec(proxy.conns[1].response);
      assert.equal(Number(firstId[1]), beforeCut + 1, "the server resumed right after it");
      assert.equal((await ingestion.end()).close, "normal");
    } finally {
      await ingestion.end().catch(() => {});
      await proxy.close();
    }
  });

  test("cancel: aborting the signal mid-stream closes the connection", async () => {
    const run = "cancelled";
    const ingestion = pausedIngest(up, TENANT, run);
    ingestion.write(TOOL_USE.slice(0, TOOL_USE_SPLIT));
    const proxy = await startProxy({ host: up.webHost, port: up.webPort });
    try {
      const c = new StreamgateClient({ baseUrl: proxy.url, token: up.token });
      const ac = new AbortController();
      const seqs = [];
      await assert.rejects(
        (async () => {
          for await (const ev of c.events(TENANT, run, { wait: 30, signal: ac.signal })) {
            seqs.push(ev.seq);
            if (ev.seq === 2) setTimeout(() => ac.abort(), 100); // while the next read waits
          }
        })(),
        (err) => err.name === "AbortError",
      );
      assert.deepEqual(seqs, [1, 2]);
      await proxy.until("the client's connection to close", () => proxy.conns[0]?.closed, 5_000);
      assert.equal(proxy.conns.length, 1, "no reconnection after an abort");
    } finally {
      ingestion.write(TOOL_USE.slice(TOOL_USE_SPLIT));
      await ingestion.end().catch(() => {});
      await proxy.close();
    }
  });

  test("cancel: breaking out of for-await closes the connection", async () => {
    const run = "broken-off";
    const ingestion = pausedIngest(up, TENANT, run);
    ingestion.write(TOOL_USE.slice(0, TOOL_USE_SPLIT));
    const proxy = await startProxy({ host: up.webHost, port: up.webPort });
    try {
      const c = new StreamgateClient({ baseUrl: proxy.url, token: up.token });
      for await (const ev of c.events(TENANT, run, { wait: 30 })) {
        if (ev.seq === 1) break;
      }
      await proxy.until("the client's connection to close", () => proxy.conns[0]?.closed, 5_000);
    } finally {
      ingestion.write(TOOL_USE.slice(TOOL_USE_SPLIT));
      await ingestion.end().catch(() => {});
      await proxy.close();
    }
  });

  test("a run that does not start within wait: StreamError", async () => {
    await assert.rejects(
      async () => {
        for await (const _ of client.events(TENANT, "never-started", { wait: 1 }));
      },
      (err) => err instanceof StreamError && /did not start within 1 s/.test(err.message),
    );
  });
});

describe("deltas", { timeout: 30_000 }, () => {
  test("cumulative content, the final answer, done", async () => {
    const deltas = [];
    for await (const d of client.deltas(TENANT, "hello")) deltas.push(d);
    assert.deepEqual(
      deltas.map((d) => [d.seq, d.content, d.final, d.done]),
      [
        [2, "Hello", null, false],
        [3, "Hello, world.", null, false],
        [4, "Hello, world.", "Hello, world.", false],
        [5, "Hello, world.", "Hello, world.", true],
      ],
    );
    assert.ok(deltas.every((d) => d.error === null && d.tool === null && d.elapsedMs >= 0));
  });

  test("tool events carry the tool", async () => {
    const tools = [];
    for await (const d of client.deltas(TENANT, "follow")) if (d.tool) tools.push(d.tool);
    assert.deepEqual(
      tools.map((t) => [t.id, t.name, t.phase, t.status]),
      [
        ["toolu_1", "get_weather", "start", "in_progress"],
        ["toolu_1", "get_weather", "update", "in_progress"],
        ["toolu_1", "get_weather", "update", "in_progress"],
        ["toolu_1", "get_weather", "end", "completed"],
      ],
    );
  });

  test("idle timeout: a run that never starts yields an error delta, then ends", async () => {
    const t0 = Date.now();
    const deltas = [];
    for await (const d of client.deltas(TENANT, "idle", { idleTimeoutMs: 1000, wait: 30 })) deltas.push(d);
    const took = Date.now() - t0;
    assert.equal(deltas.length, 1);
    assert.match(deltas[0].error, /idle/);
    assert.equal(deltas[0].done, true);
    assert.ok(took < 2_500, `within ~2 s (took ${took} ms)`);
    assert.ok(deltas[0].elapsedMs >= 1000);
  });
});

describe("runs and auth", { timeout: 30_000 }, () => {
  test("listRuns finds the run (across pages)", async () => {
    const row = await waitFor("the run in the list", async () => {
      const runs = [];
      for await (const r of client.listRuns({ tenant: TENANT, pageSize: 1 })) runs.push(r);
      return runs.find((r) => r.run_id === "follow");
    }, 10_000, 200);
    assert.equal(row.tenant, TENANT);
    assert.ok(["open", "ended"].includes(row.status));
    assert.equal(typeof row.chat_id, "string");
    const all = [];
    for await (const r of client.listRuns({ pageSize: 1 })) all.push(`${r.tenant}/${r.run_id}`);
    assert.ok(all.includes(`${TENANT}/follow`) && all.includes(`${TENANT}/hello`));
    assert.equal(new Set(all).size, all.length, "no row twice across pages");
  });

  test("a wrong token: AuthError naming the channel token", async () => {
    const bad = new StreamgateClient({ baseUrl: up.baseUrl, token: "not-the-token" });
    const isAuth = (err) =>
      err instanceof AuthError && err.status === 401 && /channel token/.test(err.message) && /channel-web\.token/.test(err.message);
    await assert.rejects(async () => {
      for await (const _ of bad.listRuns());
    }, isAuth);
    await assert.rejects(async () => {
      for await (const _ of bad.events(TENANT, "follow"));
    }, isAuth);
  });

  test("the page address works as it is printed", async () => {
    const c = StreamgateClient.fromPageUrl(up.pageUrl);
    const seqs = [];
    for await (const ev of c.events(TENANT, "hello")) seqs.push(ev.seq);
    assert.deepEqual(seqs, range(1, 5));
  });
});
