// Folds canonical events into the cumulative display state of `client.deltas()`:
// reasoning and commentary as segments (by id; an id-less segment continues until
// another kind of event comes between, as the server's own fold does), `delta` appends,
// `text` is a snapshot that replaces the segment, the final answer apart.

import type { RunEvent, StreamDelta, ToolState } from "./types.js";

interface Segment {
  id: string | undefined;
  text: string;
}

/** One lane of text (reasoning or commentary): ordered segments. */
class Lane {
  private readonly segments: Segment[] = [];
  /** The open id-less segment, which id-less text continues. */
  private idless: Segment | undefined;

  segment(id: string | undefined, fresh: boolean): Segment {
    if (id !== undefined) {
      let seg = this.segments.find((s) => s.id === id);
      if (!seg) {
        seg = { id, text: "" };
        this.segments.push(seg);
      }
      return seg;
    }
    if (!this.idless || fresh) {
      this.idless = { id: undefined, text: "" };
      this.segments.push(this.idless);
    }
    return this.idless;
  }

  /** Something else happened: the next id-less text starts a new segment. */
  interrupt(): void {
    this.idless = undefined;
  }

  get text(): string {
    return this.segments
      .map((s) => s.text)
      .filter((t) => t !== "")
      .join("\n\n");
  }
}

/** Applies `delta` / `text` of an event to a segment. */
function write(seg: Segment, delta: unknown, text: unknown): void {
  if (typeof text === "string") seg.text = text;
  else if (typeof delta === "string") seg.text += delta;
}

export class DeltaFolder {
  private readonly thinking = new Lane();
  private readonly commentary = new Lane();
  private final: string | null = null;
  private truncated = false;
  private error: string | null = null;
  private done = false;
  private last: { thinking: string; content: string; final: string | null; error: string | null } = {
    thinking: "",
    content: "",
    final: null,
    error: null,
  };

  /** The delta `ev` causes, or `null` when it changes nothing shown. */
  apply(ev: RunEvent, elapsedMs: number): StreamDelta | null {
    let tool: ToolState | null = null;
    if (ev.stream !== "assistant" || ev.data.phase !== "commentary") this.commentary.interrupt();
    if (ev.stream !== "thinking") this.thinking.interrupt();
    switch (ev.stream) {
      case "thinking": {
        const d = ev.data;
        if (d.variant !== "redacted") {
          write(this.thinking.segment(d.id, d.phase === "start"), d.delta, d.text);
        }
        break;
      }
      case "assistant": {
        const d = ev.data;
        if (d.phase === "final_answer") {
          if (typeof d.text === "string") this.final = d.text;
          else if (typeof d.delta === "string") this.final = (this.final ?? "") + d.delta;
          else this.final ??= "";
          if (d.truncated) this.truncated = true;
        } else {
          write(this.commentary.segment(d.id, false), d.delta, d.text);
        }
        break;
      }
      case "item": {
        const d = ev.data;
        tool = {
          id: d.id ?? (typeof d.index === "number" ? String(d.index) : null),
          name: d.name ?? d.kind,
          phase: d.phase,
          status: d.status ?? null,
        };
        break;
      }
      case "lifecycle": {
        const d = ev.data;
        if (d.phase === "error") {
          this.error = lifecycleError(d.diagnostic, d.reason);
          this.done = true;
        } else if (d.phase === "end") {
          this.done = true;
        }
        break;
      }
    }
    const now = {
      thinking: this.thinking.text,
      content: this.commentary.text,
      final: this.final,
      error: this.error,
    };
    const changed =
      tool !== null ||
      this.done ||
      now.thinking !== this.last.thinking ||
      now.content !== this.last.content ||
      now.final !== this.last.final ||
      now.error !== this.last.error;
    this.last = now;
    if (!changed) return null;
    return { seq: ev.seq, ...now, truncated: this.truncated, elapsedMs, tool, done: this.done, event: ev };
  }

  /** The last delta of a stream that failed (idle timeout, `event: error`, lost connection). */
  fail(message: string, elapsedMs: number): StreamDelta {
    this.error = message;
    this.done = true;
    return {
      seq: null,
      thinking: this.thinking.text,
      content: this.commentary.text,
      final: this.final,
      truncated: this.truncated,
      error: message,
      elapsedMs,
      tool: null,
      done: true,
      event: null,
    };
  }
}

function lifecycleError(diag: { code: string; message?: string } | undefined, reason: string | undefined): string {
  if (diag) return diag.message ? `${diag.code}: ${diag.message}` : diag.code;
  return reason ?? "run failed";
}
