// `StreamgateClient`: the run list (cursor paged), the run stream (SSE over fetch, with
// resume, idle timeout and cancellation), and the folded deltas.

import { DeltaFolder } from "./deltas.js";
import { AuthError, ConnectionError, HttpError, IdleTimeoutError, StreamError, StreamgateError } from "./errors.js";
import { SseParser } from "./sse.js";
import { isTerminal, type RunEvent, type RunInfo, type RunPage, type StreamDelta } from "./types.js";

export interface ClientOptions {
  /** The web channel's address, e.g. `http://127.0.0.1:40145` (a path prefix is kept). */
  baseUrl: string | URL;
  /** The channel token (`<data dir>/channel-web.token`, or `token=` of the page address). */
  token: string;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
}

export interface ListRunsOptions {
  tenant?: string;
  /** `open`, `ended` or `all` (the default). */
  status?: "open" | "ended" | "all";
  /** Rows per page (the server's default is 100, at most 1000). */
  pageSize?: number;
  signal?: AbortSignal;
}

export interface RetryOptions {
  /** Reconnects in a row without receiving an event before giving up (default 5). */
  maxRetries?: number;
  /** First backoff delay (default 250 ms); doubles per attempt, with jitter. */
  initialDelayMs?: number;
  /** Longest backoff delay (default 5000 ms). */
  maxDelayMs?: number;
}

export interface EventsOptions {
  /** Start after this seq (`?after=`): events `after + 1` onward. */
  after?: number;
  /**
   * Fail when no byte at all (heartbeat comments count; the server sends one every 15 s)
   * arrives for this long while waiting for the stream. Default 45000; 0 turns it off.
   */
  idleTimeoutMs?: number;
  /** Cancels the stream: the fetch is aborted and the iteration throws the signal's reason. */
  signal?: AbortSignal;
  /** Seconds the server waits for a run that has not started (`?wait=`, server default 300). */
  wait?: number;
  /** Reconnection after a dropped connection. */
  retry?: RetryOptions;
}

const DEFAULT_IDLE_TIMEOUT_MS = 45_000;

/** The client of one web channel. */
export class StreamgateClient {
  private readonly baseUrl: URL;
  private readonly token: string;
  private readonly fetchFn: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options || !options.baseUrl) throw new TypeError("StreamgateClient: baseUrl is required");
    if (typeof options.token !== "string" || options.token === "") {
      throw new TypeError(
        "StreamgateClient: token is required (the web channel token: <data dir>/channel-web.token)",
      );
    }
    const base = new URL(String(options.baseUrl));
    base.search = "";
    base.hash = "";
    if (!base.pathname.endsWith("/")) base.pathname += "/";
    this.baseUrl = base;
    this.token = options.token;
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("StreamgateClient: no global fetch (Node >= 18), pass `fetch`");
    this.fetchFn = (input, init) => f(input, init); // unbound `fetch` throws in browsers
  }

  /**
   * A client from the page address `streamgate up` prints
   * (`http://127.0.0.1:PORT/?token=TOKEN`).
   */
  static fromPageUrl(pageUrl: string | URL, options: { fetch?: typeof fetch } = {}): StreamgateClient {
    const url = new URL(String(pageUrl));
    const token = url.searchParams.get("token");
    if (!token) throw new TypeError("fromPageUrl: the address has no `token=`");
    return new StreamgateClient({ baseUrl: url, token, ...options });
  }

  /** Every run the channel knows (open and recently ended), page after page. */
  async *listRuns(options: ListRunsOptions = {}): AsyncGenerator<RunInfo, void, undefined> {
    let after: string | null = null;
    do {
      const url = this.url("v1/runs");
      if (options.tenant !== undefined) url.searchParams.set("tenant", options.tenant);
      if (options.status !== undefined) url.searchParams.set("status", options.status);
      if (options.pageSize !== undefined) url.searchParams.set("limit", String(options.pageSize));
      if (after !== null) url.searchParams.set("after", after);
      const init: RequestInit = { headers: this.headers({ accept: "application/json" }) };
      if (options.signal) init.signal = options.signal;
      const res = await this.fetchFn(url, init);
      if (!res.ok) throw await refusal(res, "GET /v1/runs");
      const page = (await res.json()) as RunPage;
      for (const run of page.runs) yield run;
      after = page.next;
    } while (after !== null);
  }

  /**
   * The run's canonical events, in seq order, until its terminal event (`lifecycle`
   * `end` or `error`). A connection that drops before that is resumed with
   * `Last-Event-ID` (no gap, no duplicate). Throws `StreamError` (server `event: error`),
   * `IdleTimeoutError`, `ConnectionError` (retries exhausted), `AuthError`, `HttpError`,
   * or the signal's reason once aborted. Breaking out of `for await` closes the connection.
   * With `after` at or past the terminal event's seq, it ends at once without events.
   */
  async *events(tenant: string, runId: string, options: EventsOptions = {}): AsyncGenerator<RunEvent, void, undefined> {
    const { signal } = options;
    const idleMs = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    const maxRetries = options.retry?.maxRetries ?? 5;
    const initialDelay = options.retry?.initialDelayMs ?? 250;
    const maxDelay = options.retry?.maxDelayMs ?? 5000;
    const path = `v1/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(runId)}/events`;
    let lastSeq: number | undefined = options.after;
    let failures = 0;
    let serverRetryMs: number | undefined;

    for (let attempt = 0; ; attempt++) {
      throwIfAborted(signal);
      const url = this.url(path);
      const extra: Record<string, string> = { accept: "text/event-stream" };
      if (attempt === 0 && lastSeq !== undefined) url.searchParams.set("after", String(lastSeq));
      if (attempt > 0 && lastSeq !== undefined) extra["last-event-id"] = String(lastSeq);
      if (options.wait !== undefined) url.searchParams.set("wait", String(options.wait));

      const conn = new Connection(signal, idleMs);
      let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
      let lost: unknown;
      try {
        let res: Response;
        try {
          res = await conn.guard(this.fetchFn(url, { headers: this.headers(extra), signal: conn.signal }));
        } catch (err) {
          conn.rethrowIfStopped(err, lastSeq);
          throw new Lost(err);
        }
        if (!res.ok) {
          const err = await refusal(res, `GET /${path}`);
          if (res.status >= 500) throw new Lost(err);
          throw err;
        }
        if (!res.body) throw new StreamgateError(`GET /${path}: the response has no body stream`);
        reader = res.body.getReader();
        const parser = new SseParser();
        const decoder = new TextDecoder();
        let received = 0;
        for (;;) {
          let chunk: ReadableStreamReadResult<Uint8Array>;
          try {
            chunk = await conn.guard(reader.read());
          } catch (err) {
            conn.rethrowIfStopped(err, lastSeq);
            throw new Lost(err);
          }
          if (chunk.done) break;
          for (const msg of parser.feed(decoder.decode(chunk.value, { stream: true }))) {
            received++;
            if (msg.retry !== undefined) serverRetryMs = msg.retry;
            if (msg.event === "error") throw new StreamError(serverError(msg.data), lastSeq);
            if (msg.event !== "message") continue;
            const ev = JSON.parse(msg.data) as RunEvent;
            if (lastSeq !== undefined && ev.seq <= lastSeq) continue; // never twice
            lastSeq = ev.seq;
            failures = 0;
            yield ev;
            if (isTerminal(ev)) return;
          }
        }
        // A clean end with no message at all: the run's terminal event is at or before
        // the resume point (the server closes such a stream at once). Nothing follows.
        if (received === 0) return;
        throw new Lost(new Error("the server closed the stream before the run's terminal event"));
      } catch (err) {
        if (!(err instanceof Lost)) throw err;
        lost = err.cause;
      } finally {
        conn.close();
        if (reader) reader.cancel().catch(() => {});
      }
      failures++;
      if (failures > maxRetries) throw new ConnectionError(failures, lastSeq, lost);
      const backoff = Math.min(maxDelay, initialDelay * 2 ** (failures - 1));
      await sleep(Math.max(serverRetryMs ?? 0, backoff * (0.5 + Math.random() / 2)), signal);
    }
  }

  /**
   * The run folded for display: one `StreamDelta` per event that changes something.
   * A stream that fails (idle timeout, server `event: error`, connection lost for good)
   * yields a last delta with `error` set and `done` true instead of throwing;
   * `AuthError`, `HttpError` and aborts still throw.
   */
  async *deltas(tenant: string, runId: string, options: EventsOptions = {}): AsyncGenerator<StreamDelta, void, undefined> {
    const started = Date.now();
    const folder = new DeltaFolder();
    try {
      for await (const ev of this.events(tenant, runId, options)) {
        const delta = folder.apply(ev, Date.now() - started);
        if (delta) yield delta;
      }
    } catch (err) {
      if (err instanceof IdleTimeoutError || err instanceof StreamError || err instanceof ConnectionError) {
        yield folder.fail(err.message, Date.now() - started);
        return;
      }
      throw err;
    }
  }

  private url(path: string): URL {
    return new URL(path, this.baseUrl);
  }

  private headers(extra: Record<string, string>): Record<string, string> {
    return { authorization: `Bearer ${this.token}`, ...extra };
  }
}

/** A retryable loss of the connection (internal). */
class Lost {
  constructor(readonly cause: unknown) {}
}

/**
 * One connection's abort controller: linked to the caller's signal, and armed with the
 * idle timer while the client waits for bytes (`guard`).
 */
class Connection {
  private readonly controller = new AbortController();
  private timer: ReturnType<typeof setTimeout> | undefined;
  private idleFired = false;
  private readonly onAbort: () => void;

  constructor(
    private readonly outer: AbortSignal | undefined,
    private readonly idleMs: number,
  ) {
    this.onAbort = () => this.controller.abort(outer?.reason);
    outer?.addEventListener("abort", this.onAbort, { once: true });
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Awaits `p` with the idle timer running. */
  async guard<T>(p: Promise<T>): Promise<T> {
    if (this.idleMs > 0 && Number.isFinite(this.idleMs)) {
      this.timer = setTimeout(() => {
        this.idleFired = true;
        this.controller.abort(new Error("idle timeout"));
      }, this.idleMs);
    }
    try {
      return await p;
    } finally {
      clearTimeout(this.timer);
    }
  }

  /** Turns an error caused by the caller's abort or the idle timer into what to throw. */
  rethrowIfStopped(_err: unknown, lastSeq: number | undefined): void {
    if (this.outer?.aborted) throw abortReason(this.outer);
    if (this.idleFired) throw new IdleTimeoutError(this.idleMs, lastSeq);
  }

  close(): void {
    clearTimeout(this.timer);
    this.outer?.removeEventListener("abort", this.onAbort);
    // Ends the request if the body was not read to its end (break, error).
    this.controller.abort();
  }
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortReason(signal);
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortReason(signal));
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortReason(signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The `error` of `event: error`'s data (`{"error": "…"}`), else the data as it is. */
function serverError(data: string): string {
  try {
    const v = JSON.parse(data) as { error?: unknown };
    if (typeof v?.error === "string") return v.error;
  } catch {
    // not JSON: the text itself
  }
  return data;
}

/** The error for a refused request (the body read for the server's message). */
async function refusal(res: Response, what: string): Promise<StreamgateError> {
  let text = "";
  try {
    text = (await res.text()).trim();
  } catch {
    // the body is only an explanation
  }
  let message = text;
  try {
    const v = JSON.parse(text) as { error?: unknown };
    if (typeof v?.error === "string") message = v.error;
  } catch {
    // plain text
  }
  if (res.status === 401 || res.status === 403) return new AuthError(res.status, message);
  return new HttpError(res.status, message, what);
}
