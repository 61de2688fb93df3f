// A Server-Sent Events parser (the WHATWG "event stream interpretation"), fed text
// chunks as they arrive: lines end in \r\n, \n or \r (a \r\n split across chunks counts
// once), `:` lines are comments, `data:` lines accumulate (joined with \n), `id:` and
// `event:` name the message, one leading space after the colon is dropped, and an empty
// line dispatches. A message still open when the stream ends is dropped, as the spec says.

/** One dispatched message. */
export interface SseMessage {
  /** `event:` of this message, `"message"` when it has none. */
  event: string;
  /** The `data:` lines joined with `\n`. */
  data: string;
  /** `id:` of this message, if it had one. */
  id: string | undefined;
  /** `retry:` of this message (ms), if it had a valid one. */
  retry: number | undefined;
}

export class SseParser {
  /** Text of the line not ended yet. */
  private line = "";
  /** The previous chunk ended in \r: a \n starting the next one is the same line end. */
  private afterCR = false;
  private data: string[] = [];
  private event = "";
  private id: string | undefined;
  private retry: number | undefined;
  private bomChecked = false;
  /** Last `id:` seen on the stream (persists across messages, like `EventSource`). */
  lastEventId = "";
  /** Comment lines seen (heartbeats). */
  comments = 0;

  /** Feeds decoded text; returns the messages it completed. */
  feed(chunk: string): SseMessage[] {
    const out: SseMessage[] = [];
    if (chunk.length === 0) return out;
    if (!this.bomChecked) {
      this.bomChecked = true;
      if (chunk.charCodeAt(0) === 0xfeff) chunk = chunk.slice(1);
    }
    let start = 0;
    for (let i = 0; i < chunk.length; i++) {
      const c = chunk.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      if (c === 10 && i === 0 && this.afterCR) {
        // The \n of a \r\n whose \r ended the previous chunk.
        this.afterCR = false;
        start = 1;
        continue;
      }
      this.line += chunk.slice(start, i);
      this.takeLine(this.line, out);
      this.line = "";
      if (c === 13 && chunk.charCodeAt(i + 1) === 10) i++;
      start = i + 1;
    }
    this.afterCR = chunk.charCodeAt(chunk.length - 1) === 13;
    this.line += chunk.slice(start);
    return out;
  }

  private takeLine(line: string, out: SseMessage[]): void {
    if (line === "") {
      this.dispatch(out);
      return;
    }
    if (line.charCodeAt(0) === 58 /* : */) {
      this.comments++;
      return;
    }
    const colon = line.indexOf(":");
    let field: string;
    let value: string;
    if (colon === -1) {
      field = line;
      value = "";
    } else {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.charCodeAt(0) === 32) value = value.slice(1);
    }
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        if (!value.includes("\0")) {
          this.id = value;
          this.lastEventId = value;
        }
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
      default:
        break; // unknown fields are ignored
    }
  }

  private dispatch(out: SseMessage[]): void {
    if (this.data.length > 0) {
      out.push({
        event: this.event || "message",
        data: this.data.join("\n"),
        id: this.id,
        retry: this.retry,
      });
    }
    this.data = [];
    this.event = "";
    this.id = undefined;
    this.retry = undefined;
  }
}
