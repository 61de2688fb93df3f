// @streamgate/client — follow streamgate runs live from Node (>= 18) or a browser.
//
// It talks to a web channel's run API (docs/run-stream.md in the streamgate repository)
// with nothing but the platform's `fetch`, `ReadableStream` and `TextDecoder`: no runtime
// dependencies.
//
// Layout (src/, compiled by `tsc` to dist/):
// - index.ts  — this file: the public exports;
// - client.ts — `StreamgateClient`: `listRuns` (GET /v1/runs, all pages), `events` (the run
//               stream over fetch: resume with Last-Event-ID, bounded retries with
//               backoff, idle timeout, cancellation) and `deltas` (events folded for display);
// - sse.ts    — the hand-written Server-Sent Events parser `events` reads the body with;
// - deltas.ts — the fold of canonical events into cumulative `StreamDelta`s;
// - types.ts  — the wire shapes: `RunInfo`, `RunEvent` and its four streams, `StreamDelta`;
// - errors.ts — `StreamgateError` and its kinds (`AuthError`, `HttpError`, `StreamError`,
//               `IdleTimeoutError`, `ConnectionError`).
// Tests (test/*.test.mjs, `node --test`) import dist/ and run against a real `streamgate up`.

export { StreamgateClient } from "./client.js";
export type { ClientOptions, EventsOptions, ListRunsOptions, RetryOptions } from "./client.js";
export { SseParser } from "./sse.js";
export type { SseMessage } from "./sse.js";
export { DeltaFolder } from "./deltas.js";
export { isTerminal } from "./types.js";
export type {
  AssistantData,
  AssistantEvent,
  Diagnostic,
  ItemData,
  ItemEvent,
  LifecycleData,
  LifecycleEvent,
  RunEvent,
  RunInfo,
  RunPage,
  StreamDelta,
  ThinkingData,
  ThinkingEvent,
  ToolState,
} from "./types.js";
export {
  AuthError,
  ConnectionError,
  HttpError,
  IdleTimeoutError,
  StreamError,
  StreamgateError,
} from "./errors.js";
