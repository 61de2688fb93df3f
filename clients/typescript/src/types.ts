// The wire shapes of the web channel's run API (docs/run-stream.md): the run list and
// the canonical events of the run stream. Members the server may add later are allowed
// through the index signatures.

/** One row of `GET /v1/runs`. */
export interface RunInfo {
  tenant: string;
  run_id: string;
  status: "open" | "ended";
  chat_id: string;
  session_key?: string;
  /** Highest seq rendered (open runs). */
  last_seq?: number;
  /** When the run ended (ended runs), ms since the Unix epoch. */
  ended_at_ms?: number;
}

/** One page of `GET /v1/runs`. */
export interface RunPage {
  runs: RunInfo[];
  /** Cursor of the next page (`after=`), `null` on the last page. */
  next: string | null;
}

export interface ThinkingData {
  id?: string;
  variant: "raw" | "summary" | "redacted";
  phase?: "start" | "end";
  delta?: string;
  text?: string;
  tokens?: number;
  [key: string]: unknown;
}

export interface AssistantData {
  id?: string;
  phase: "commentary" | "final_answer";
  delta?: string;
  text?: string;
  status?: "in_progress" | "completed";
  truncated?: boolean;
  [key: string]: unknown;
}

export interface ItemData {
  phase: "start" | "update" | "end";
  id?: string;
  index?: number;
  kind: string;
  name?: string;
  status?: string;
  input?: unknown;
  input_delta?: string;
  arguments?: unknown;
  result?: unknown;
  output?: unknown;
  [key: string]: unknown;
}

export interface Diagnostic {
  code: string;
  message?: string;
  [key: string]: unknown;
}

export interface LifecycleData {
  phase: "start" | "update" | "end" | "error";
  reason?: string;
  status?: string;
  usage?: Record<string, unknown>;
  diagnostic?: Diagnostic;
  [key: string]: unknown;
}

interface EventBase {
  /** Position in the run, from 1, gap-free. Also the SSE `id:`. */
  seq: number;
  tenant: string;
  run_id: string;
  session_key?: string;
  /** Ingest time, ms since the Unix epoch. */
  ts_ms: number;
}

export interface ThinkingEvent extends EventBase {
  stream: "thinking";
  data: ThinkingData;
}
export interface AssistantEvent extends EventBase {
  stream: "assistant";
  data: AssistantData;
}
export interface ItemEvent extends EventBase {
  stream: "item";
  data: ItemData;
}
export interface LifecycleEvent extends EventBase {
  stream: "lifecycle";
  data: LifecycleData;
}

/** One canonical event of the run stream (the `data:` of each SSE message). */
export type RunEvent = ThinkingEvent | AssistantEvent | ItemEvent | LifecycleEvent;

/** True for the run's last event: `lifecycle` with phase `end` or `error`. */
export function isTerminal(ev: RunEvent): boolean {
  return ev.stream === "lifecycle" && (ev.data.phase === "end" || ev.data.phase === "error");
}

/** The tool (item) an event is about, as `StreamDelta.tool` shows it. */
export interface ToolState {
  /** The item's id, else its index as text, else `null`. */
  id: string | null;
  /** The tool's name, else the item's kind. */
  name: string;
  phase: "start" | "update" | "end";
  status: string | null;
}

/** One step of `client.deltas()`: the run so far, folded for display. */
export interface StreamDelta {
  /** Seq of the event that caused this delta (`null` for a stream failure). */
  seq: number | null;
  /** All reasoning text so far (raw and summary segments, blank-line separated). */
  thinking: string;
  /** All commentary so far (segments blank-line separated). */
  content: string;
  /** The final answer, once there is one. */
  final: string | null;
  /** True when the final answer was cut short by a token limit. */
  truncated: boolean;
  /**
   * Why the run (or the stream) failed: a `lifecycle` error, the server's `event: error`,
   * an idle timeout, or a connection lost for good. `null` otherwise.
   */
  error: string | null;
  /** Milliseconds since `deltas()` was called. */
  elapsedMs: number;
  /** The tool this event is about (`item` events), else `null`. */
  tool: ToolState | null;
  /** True on the last delta: the run ended (or failed, or the stream did). */
  done: boolean;
  /** The event that caused this delta (`null` for a stream failure). */
  event: RunEvent | null;
}
