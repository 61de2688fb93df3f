// The errors the client throws. Every one extends `StreamgateError`, so a caller can
// tell the client's failures from its own with one `instanceof`.

/** Base class of every error this client throws (aborts rethrow the signal's reason). */
export class StreamgateError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The web channel refused the credential (HTTP 401/403): no token, or not this
 * channel's token.
 */
export class AuthError extends StreamgateError {
  readonly status: number;
  /** The server's own explanation (its response body), if it sent one. */
  readonly serverMessage: string;

  constructor(status: number, serverMessage: string) {
    const detail = serverMessage.trim() ? ` (server said: ${serverMessage.trim()})` : "";
    super(
      `streamgate refused the channel token (HTTP ${status}): pass the web channel's token as ` +
        "`token` — the `token=` part of the page address `streamgate up` prints, or the contents of " +
        `<data dir>/channel-web.token${detail}`,
    );
    this.status = status;
    this.serverMessage = serverMessage;
  }
}

/** Any other refused request (400 for a bad run id or cursor, 404, 421, 5xx …). */
export class HttpError extends StreamgateError {
  readonly status: number;
  /** The `error` member of a JSON error body, else the body text. */
  readonly serverMessage: string;

  constructor(status: number, serverMessage: string, what: string) {
    super(`${what}: HTTP ${status}${serverMessage ? `: ${serverMessage}` : ""}`);
    this.status = status;
    this.serverMessage = serverMessage;
  }
}

/**
 * The server ended the run stream with `event: error` (the run did not start within
 * `wait` seconds, the server is shutting down, the run is not shown on this channel …).
 */
export class StreamError extends StreamgateError {
  /** Seq of the last event received before the error (resume point), if any. */
  readonly lastSeq: number | undefined;

  constructor(message: string, lastSeq: number | undefined) {
    super(message);
    this.lastSeq = lastSeq;
  }
}

/** No byte (not even a heartbeat comment) arrived for `idleTimeoutMs`. */
export class IdleTimeoutError extends StreamgateError {
  readonly idleTimeoutMs: number;
  readonly lastSeq: number | undefined;

  constructor(idleTimeoutMs: number, lastSeq: number | undefined) {
    super(`run stream idle: no data for ${idleTimeoutMs} ms`);
    this.idleTimeoutMs = idleTimeoutMs;
    this.lastSeq = lastSeq;
  }
}

/** The connection kept dropping before the terminal event and the retries ran out. */
export class ConnectionError extends StreamgateError {
  readonly attempts: number;
  readonly lastSeq: number | undefined;

  constructor(attempts: number, lastSeq: number | undefined, cause: unknown) {
    const why = cause instanceof Error ? cause.message : String(cause);
    super(`run stream lost after ${attempts} attempt(s): ${why}`, { cause });
    this.attempts = attempts;
    this.lastSeq = lastSeq;
  }
}
